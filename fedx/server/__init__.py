"""The ServerApp's parts: building the strategy, evaluation, saving models, resuming.

:mod:`fedx.server_app` wires them together.
"""
