"""Which Flower releases ``fedx.strategies`` works with.

The strategies use only the message API (``flwr.app``, ``flwr.serverapp``,
``FedAvg``'s sampling arguments), which is the same from Flower 1.36, the
last release whose SuperNodes reach the SuperLink over gRPC, to 1.41, where
they use HTTP(S). ``tests/system/test_compat_flwr136.py`` runs them against real
1.36 processes; the app itself (``fedx.server_app``) needs Flower 1.41.
"""

import re
from importlib.metadata import PackageNotFoundError, version

OLDEST_FLWR = "1.36.0"


def _release(text: str) -> tuple[int, ...]:
    """``"1.36.0rc1"`` -> ``(1, 36, 0)``: the numeric release part."""
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def check_flwr_version() -> None:
    """Fail at import with a clear message on a Flower older than ``OLDEST_FLWR``."""
    try:
        installed = version("flwr")
    except PackageNotFoundError:  # e.g. Flower from a source tree on sys.path
        return
    if _release(installed) < _release(OLDEST_FLWR):
        raise ImportError(
            f"fedx.strategies needs flwr >= {OLDEST_FLWR}, found flwr {installed}: "
            f'pip install "flwr>={OLDEST_FLWR}"'
        )


check_flwr_version()
