"""Run-config keys that several methods share, one ``Key`` object each.

A method lists the shared keys it takes in its ``Method.keys``, next to its
own (:mod:`fedx.method`); methods written outside fedx can list them too.
"""

from fedx.checks import Integer, OneOf
from fedx.method import Key

#: How a multi-model method averages the models of a round into one model:
#: ``"uniform"``, the plain mean (what the papers' authors' code computes),
#: or ``"weighted"`` by each reply's ``weighted_by_key``.
POOL_MEANS: tuple[str, ...] = ("uniform", "weighted")

#: The run-config key of ``pool_mean``, shared by the pool methods.
POOL_MEAN_KEY = Key(
    "pool-mean",
    "uniform",
    OneOf(POOL_MEANS),
    "how a round's models are averaged (the global model, and any mean the method takes: a "
    "first stage, the centre of mutations): the plain mean of the K models (`uniform`, the "
    "authors' code) or the trained ones weighted by `num-examples` (`weighted`, not with "
    "secure recombination)",
    argument="pool_mean",
)

#: The run-config key of the fine-tuning epochs, shared by the personalized methods.
FINETUNE_EPOCHS_KEY = Key(
    "finetune-epochs",
    1,
    Integer(0),
    "local fine-tuning epochs before each personalized test (0 = none)",
    argument="finetune_epochs",
)
