"""Flower's usual training messages, as fedx's strategies and ClientApp use them.

A training message holds the model in an ArrayRecord (``"arrays"``) and the
round's settings in a ConfigRecord (``"config"``); the reply holds the
trained model and a MetricRecord (``"metrics"``) with ``"num-examples"``.
A ``query`` message asks a node which client it is; the reply's
``"client-id"`` metric says so, and its ``"reads-packed"`` metric, when
there, which version of fedx's packed model form (:mod:`fedx.arrays`) the
node reads. Every other reply of fedx's ClientApp that holds no packed model
says the same in a ConfigRecord of its own (:data:`WIRE`), so that the
server follows each node's latest reply (:mod:`fedx.strategy_core.packing`).
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from flwr.app import ConfigRecord

#: Record names (Flower's strategies' ``arrayrecord_key``/``configrecord_key`` defaults).
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

#: Config keys the server sets.
SERVER_ROUND = "server-round"
PROXIMAL_MU = "proximal-mu"  # Flower's FedProx

#: Metric keys of the replies.
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "eval-loss"
EVAL_ACCURACY = "eval-acc"
CLIENT_ID = "client-id"
READS_PACKED = "reads-packed"
#: The ConfigRecord of a reply in which fedx's ClientApp says it reads packed models
#: (``READS_PACKED``): Flower's and fedx's strategies count only array and metric records.
WIRE = "fedx.wire"


@dataclass(frozen=True)
class TrainingSettings:
    """The local-training hyperparameters every training message carries.

    The ServerApp sends them (:meth:`to_record`); a client reads them from
    the message and falls back on its run config for those a ServerApp did
    not send (:meth:`read`).
    """

    learning_rate: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int

    @staticmethod
    def config_key(field_name: str) -> str:
        """The ConfigRecord key of a field: ``learning_rate`` -> ``learning-rate``."""
        return field_name.replace("_", "-")

    @classmethod
    def from_run_config(cls, config: Any) -> "TrainingSettings":
        """The values of a run config (:class:`fedx.config.RunConfig`): its attributes of the same names."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def to_record(self) -> ConfigRecord:
        """The ConfigRecord the server sends with every training message."""
        return ConfigRecord({self.config_key(f.name): getattr(self, f.name) for f in fields(self)})

    @classmethod
    def read(cls, record: Mapping[str, Any], fallback: Any) -> "TrainingSettings":
        """The message's values, the run config's where the message has none."""
        defaults = cls.from_run_config(fallback)
        values = {}
        for f in fields(cls):
            default = getattr(defaults, f.name)
            values[f.name] = type(default)(record.get(cls.config_key(f.name), default))
        return cls(**values)
