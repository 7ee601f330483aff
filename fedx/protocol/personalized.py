"""Per-client evaluation of personalized methods: the model, fine-tuned, on each client's test split.

An evaluation message holds one ArrayRecord, the model to test, and a
ConfigRecord with ``finetune-epochs`` (local epochs of fine-tuning first) and,
when clients' architectures differ, the model's ``personalized-architecture``
(else it is the run config's ``model``). The reply's MetricRecord holds
``eval-acc`` and ``eval-loss`` on the client's own test split, its size as
``num-examples`` and the client's ``client-id``.
"""

from fedx.protocol.common import CLIENT_ID, EVAL_ACCURACY, EVAL_LOSS, NUM_EXAMPLES

FINETUNE_EPOCHS = "finetune-epochs"
ARCHITECTURE = "personalized-architecture"

__all__ = [
    "ARCHITECTURE",
    "CLIENT_ID",
    "EVAL_ACCURACY",
    "EVAL_LOSS",
    "FINETUNE_EPOCHS",
    "NUM_EXAMPLES",
]
