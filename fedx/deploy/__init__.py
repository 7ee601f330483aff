"""Run fedx as real Flower processes: certificates, SuperNode keys, a local federation.

``python -m fedx.deploy`` (or the ``fedx-deploy`` command) has three
subcommands: ``certs`` writes a local CA and a server certificate for TLS,
``keys`` writes SuperNode authentication key pairs, and ``up`` starts a
SuperLink and N SuperNodes on this machine (optionally running an app
against them with ``flwr run``). Nothing here imports torch.
"""
