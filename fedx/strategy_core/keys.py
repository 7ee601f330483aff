"""Run-config keys that several methods share, one ``Key`` object each.

A method lists the shared keys it takes in its ``Method.keys``, next to its
own (:mod:`fedx.method`); methods written outside fedx can list them too.
What a key does is written once, as its argument's description in the
docstring of the class that introduces the argument
(:meth:`fedx.method.Method.key_help`).
"""

from fedx.checks import Integer, OneOf, Rule
from fedx.method import Key

#: How a multi-model method averages the models of a round into one model:
#: ``"uniform"``, the plain mean (what the papers' authors' code computes),
#: or ``"weighted"`` by each reply's ``weighted_by_key``.
POOL_MEANS: tuple[str, ...] = ("uniform", "weighted")

#: The run-config key of ``pool_mean``, shared by the pool methods.
POOL_MEAN_KEY = Key("pool-mean", "uniform", OneOf(POOL_MEANS), argument="pool_mean")


def _models_or_none(value: int) -> int | None:
    return value or None


#: The run-config key of ``num_models`` (K, the pool's size), shared by the pool methods.
NUM_MODELS_KEY = Key(
    "num-models",
    0,
    Rule(int, lambda v: v >= 0, "0 (K = the nodes sampled in round 1) or an integer >= 1"),
    argument="num_models",
    parse=_models_or_none,
)

#: The run-config key of the fine-tuning epochs, shared by the personalized methods.
FINETUNE_EPOCHS_KEY = Key("finetune-epochs", 1, Integer(0), argument="finetune_epochs")
