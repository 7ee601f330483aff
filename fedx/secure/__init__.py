"""Secure recombination for FedMR (appendix B of the FedMR papers).

Before uploading, clients swap random layers among themselves through the
server, end-to-end encrypted, so the server only ever receives recombined
models.

Modules
-------
``fedx.secure.relay``
    Server side: :class:`~fedx.secure.relay.SecureRelay` drives the message
    exchanges over a Flower Grid and relays ciphertext (numpy + Flower only).
``fedx.secure.client``
    ClientApp side: Flower handlers for the send, return and upload messages.
``fedx.secure.exchange``
    The client's state and its random choices, as plain functions.
``fedx.secure.crypto``, ``fedx.secure.codec``, ``fedx.secure.wire``
    X25519 + HKDF + AES-GCM, the plaintext layer format, the message fields.
``fedx.secure.loopback``
    An in-process Grid that runs numpy clients, for tests and benchmarks.

This package imports no torch.
"""
