"""FedMe: personalized federated learning via model exchange.

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022
(arXiv:2110.07868), Sec. 4. This module declares the method (its run-config keys); its parts,
one module each: the strategy (:mod:`~fedx.strategies.fedme.strategy`), the
clients joining and choosing their first architecture
(:mod:`~fedx.strategies.fedme.registration`), clustering the models by their
outputs (:mod:`~fedx.strategies.fedme.clustering`), and the messages to and
from the clients (:mod:`~fedx.strategies.fedme.clients`).
"""

from fedx.checks import Flag, Integer, Rule
from fedx.method import Key, Method, comma_list
from fedx.strategies.fedme.clustering import increasing_rounds, parse_cluster_rounds
from fedx.strategies.fedme.registration import initial_architecture_form
from fedx.strategies.fedme.strategy import FedMe, InitialModelFn, PredictFn
from fedx.strategy_core.keys import FINETUNE_EPOCHS_KEY

__all__ = ["METHOD", "FedMe", "InitialModelFn", "PredictFn"]

METHOD = Method(
    name="fedme",
    strategy=FedMe,
    description="FedMe (Matsuda et al., SDM'22): personalized models of several architectures, "
    "exchanged within clusters",
    keys=(
        FINETUNE_EPOCHS_KEY,
        # What each key does is its argument's description in FedMe's docstring.
        Key(
            "fedme-architectures",
            "cnn-1,cnn-2,cnn-3,cnn-4",
            Rule(str, lambda v: bool(comma_list(v)), "comma-separated `model` names"),
            argument="architectures",
            parse=comma_list,
        ),
        Key(
            "fedme-initial-architecture",
            "local-best",
            Rule(
                str,
                initial_architecture_form,
                "local-best, round-robin or fixed:<name> (<name> one of `fedme-architectures`)",
            ),
            argument="initial_architecture",
        ),
        Key("fedme-choice-epochs", 5, Integer(1), argument="choice_epochs"),
        Key(
            "fedme-cluster-rounds",
            "10,15,18",
            Rule(
                str,
                increasing_rounds,
                "comma-separated increasing rounds >= 2 (empty: always one cluster)",
            ),
            argument="cluster_rounds",
            parse=parse_cluster_rounds,
        ),
        Key("fedme-model-tuning", True, Flag(), argument="model_tuning"),
        Key("fedme-mutual-learning", True, Flag(), argument="mutual_learning"),
        Key("fedme-clustering", True, Flag(), argument="clustering"),
    ),
    takes=(
        "fraction-train",
        "min-train-nodes",
        "min-available-nodes",
        "eval-every",
        "seed",
        "node-wait-timeout",
    ),
    personalized=True,
    model_key="fedme-architectures",
    # The torch side, which the app imports: clients' first models and models'
    # outputs on the server's unlabeled set, loaded before round 1 so that
    # missing data stops the run at its start.
    components="fedx.server_models:server_model_functions",
    prepare="fedx.server_models:load_run_unlabeled",
    client_train="fedx.client.fedme:train",
    style={"color": "#E69F00", "linestyle": "-"},
)
