"""Flower's own FedAvg and FedProx, as methods of the fedx app (the baselines).

The classes are Flower's, unchanged; they take the sampling arguments only
and sample nodes with Python's ``random`` module, which the ServerApp seeds
and a checkpoint captures. They do not check their arguments, so the app
checks these keys for them (``checks_arguments=False``).
"""

from flwr.serverapp.strategy import FedAvg, FedProx

from fedx.checks import NON_NEGATIVE
from fedx.method import SAMPLING, Key, Method, Variant

FEDAVG = Method(
    name="fedavg",
    strategy=FedAvg,
    description="Flower's FedAvg",
    takes=SAMPLING,
    checks_arguments=False,
    style={"color": "#000000", "linestyle": "-"},
)


def _with_proximal_term(config) -> str | None:
    if config["proximal-mu"] > 0:
        return None
    return "needs proximal-mu > 0 in the setting (0 is FedAvg)"


FEDPROX = Method(
    name="fedprox",
    strategy=FedProx,
    description="Flower's FedProx: FedAvg whose clients add a proximal term",
    keys=(
        # What it does: Flower's FedProx docstring says, for proximal_mu.
        Key("proximal-mu", 0.0, NON_NEGATIVE, argument="proximal_mu"),
    ),
    takes=SAMPLING,
    checks_arguments=False,
    variants=(
        Variant(
            "fedprox",
            requires=_with_proximal_term,
            # Dashed grey: with a small proximal term it runs on top of FedAvg.
            style={"color": "#8c8c8c", "linestyle": (0, (4, 2))},
        ),
    ),
)
