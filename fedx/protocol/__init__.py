"""What fedx's messages carry: record names, config keys and metric keys, one module per method.

A strategy and the ClientApp that answers it import the same module, so a key
is spelled once. :mod:`fedx.protocol.common` is Flower's usual training
convention (what every pool method and Flower's FedAvg use);
:mod:`fedx.protocol.personalized` adds per-client evaluation, and a method
with messages of its own has a module here (the model exchange). Secure
recombination's messages are in :mod:`fedx.secure.wire`. Pure Python and Flower's records:
no numpy, no torch.
"""
