"""The app's run configuration: every key, its type and its allowed values.

The defaults live in ``pyproject.toml`` (``[tool.flwr.app.config]``); Flower
merges ``--run-config`` overrides into them. :meth:`RunConfig.from_mapping`
checks every key once, at ServerApp start, and fails with one line that names
the key, the bad value and what is allowed.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedx.data import DATASET_NAMES, PARTITIONINGS
from fedx.models import MODEL_NAMES
from fedx.ops import GROUPINGS, SELECTIONS
from fedx.strategies.multi_model import POOL_MEANS

STRATEGY_NAMES: tuple[str, ...] = (
    "fedavg", "fedprox", "fedmr", "fedindep", "fedmut", "fedcross", "fedme", "fedavg-ft"
)
#: Strategies evaluated per client on their own test splits; their clients
#: use the personalized data layout (``fedx.data.load_local_splits``).
PERSONALIZED_STRATEGIES: tuple[str, ...] = ("fedme", "fedavg-ft")


def comma_list(value: str) -> tuple[str, ...]:
    """Split a comma-separated run-config value into its stripped, non-empty items."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _model_names(value: str) -> bool:
    names = comma_list(value)
    return bool(names) and all(name in MODEL_NAMES for name in names)


def _increasing_rounds(value: str) -> bool:
    items = comma_list(value)
    if not all(item.isdigit() for item in items):
        return False
    rounds = [int(item) for item in items]
    return all(r >= 2 for r in rounds) and rounds == sorted(set(rounds))


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class _Rule:
    kind: type
    check: Callable[[Any], bool]
    allowed: str


def _choice(names: tuple[str, ...]) -> _Rule:
    return _Rule(str, lambda v: v in names, f"one of {', '.join(names)}")


def _integer(minimum: int) -> _Rule:
    return _Rule(int, lambda v: v >= minimum, f"an integer >= {minimum}")


def _number(low: float, high: float, *, low_open: bool, high_open: bool) -> _Rule:
    def check(value: float) -> bool:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        return math.isfinite(value) and above and below

    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if math.isinf(high):
        interval = f"{'(' if low_open else '['}{low:g}, inf)"
    return _Rule(float, check, f"a number in {interval}")


_ANY_STRING = _Rule(str, lambda v: True, "a string")
_FLAG = _Rule(bool, lambda v: True, "true or false")
_POSITIVE = _number(0.0, math.inf, low_open=True, high_open=True)
_NON_NEGATIVE = _number(0.0, math.inf, low_open=False, high_open=True)
_FRACTION = _number(0.0, 1.0, low_open=True, high_open=False)

RULES: dict[str, _Rule] = {
    "strategy": _choice(STRATEGY_NAMES),
    "num-server-rounds": _integer(1),
    "seed": _integer(0),
    "fraction-train": _FRACTION,
    "min-train-nodes": _integer(1),
    "min-available-nodes": _integer(1),
    "fraction-evaluate": _number(0.0, 1.0, low_open=False, high_open=False),
    "min-evaluate-nodes": _integer(0),
    "node-wait-timeout": _POSITIVE,
    "round-timeout": _POSITIVE,
    "dataset": _choice(DATASET_NAMES),
    "data-root": _ANY_STRING,
    "download": _FLAG,
    "partitioning": _choice(PARTITIONINGS),
    "dirichlet-alpha": _POSITIVE,
    "min-partition-size": _integer(0),
    "test-fraction": _number(0.0, 1.0, low_open=True, high_open=True),
    "leaf-users": _Rule(
        int, lambda v: v >= 0, "0 (every user with more than leaf-min-samples) or an integer >= 1"
    ),
    "leaf-min-samples": _integer(0),
    "model": _choice(MODEL_NAMES),
    "learning-rate": _POSITIVE,
    "momentum": _number(0.0, 1.0, low_open=False, high_open=True),
    "weight-decay": _NON_NEGATIVE,
    "batch-size": _integer(1),
    "local-epochs": _integer(1),
    "proximal-mu": _NON_NEGATIVE,
    "pool-mean": _choice(POOL_MEANS),
    "first-stage-rounds": _integer(0),
    "grouping": _choice(GROUPINGS),
    # 0 switches segments off (every layer recombined on its own).
    "segment-fraction": _Rule(
        float,
        lambda v: 0.0 <= v <= 1.0,
        "0 (off: layer-wise recombination) or a number in (0, 1]",
    ),
    "secure-recombination": _FLAG,
    "secure-repeats": _integer(1),
    "secure-min-layers": _integer(1),
    "secure-max-layers": _integer(1),
    "fedmut-alpha": _NON_NEGATIVE,
    "fedmut-beta0": _number(0.0, 1.0, low_open=False, high_open=False),
    "fedmut-beta-rounds": _integer(1),
    "fedcross-alpha": _number(0.5, 1.0, low_open=False, high_open=True),
    "fedcross-selection": _choice(SELECTIONS),
    "fedcross-propeller-rounds": _integer(0),
    "fedcross-dynamic-alpha-rounds": _integer(0),
    "fedcross-alpha-start": _number(0.5, 1.0, low_open=False, high_open=True),
    "size-alpha": _POSITIVE,
    "unlabeled-size": _Rule(int, lambda v: v >= 0, "0 (the dataset's default) or an integer >= 1"),
    "local-test-fraction": _number(0.0, 1.0, low_open=True, high_open=True),
    "local-validation-fraction": _number(0.0, 1.0, low_open=True, high_open=True),
    "finetune-epochs": _integer(0),
    "fedme-architectures": _Rule(
        str, _model_names, f"comma-separated model names from {', '.join(MODEL_NAMES)}"
    ),
    "fedme-cluster-rounds": _Rule(
        str,
        _increasing_rounds,
        "comma-separated increasing rounds >= 2 (empty: always one cluster)",
    ),
    "fedme-model-tuning": _FLAG,
    "fedme-mutual-learning": _FLAG,
    "fedme-clustering": _FLAG,
    "eval-every": _integer(1),
    "run-name": _ANY_STRING,
    "output-dir": _ANY_STRING,
    # "" starts a new run; a run directory (or its checkpoint.json) continues it.
    "resume-from": _ANY_STRING,
}


def _fits_type(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


# pylint: disable=too-many-instance-attributes
@dataclass(frozen=True)
class RunConfig:
    """Validated run configuration; field names are the keys in snake_case."""

    strategy: str
    num_server_rounds: int
    seed: int
    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    fraction_evaluate: float
    min_evaluate_nodes: int
    node_wait_timeout: float
    round_timeout: float
    dataset: str
    data_root: str
    download: bool
    partitioning: str
    dirichlet_alpha: float
    min_partition_size: int
    test_fraction: float
    leaf_users: int
    leaf_min_samples: int
    model: str
    learning_rate: float
    momentum: float
    weight_decay: float
    batch_size: int
    local_epochs: int
    proximal_mu: float
    pool_mean: str
    first_stage_rounds: int
    grouping: str
    segment_fraction: float
    secure_recombination: bool
    secure_repeats: int
    secure_min_layers: int
    secure_max_layers: int
    fedmut_alpha: float
    fedmut_beta0: float
    fedmut_beta_rounds: int
    fedcross_alpha: float
    fedcross_selection: str
    fedcross_propeller_rounds: int
    fedcross_dynamic_alpha_rounds: int
    fedcross_alpha_start: float
    size_alpha: float
    unlabeled_size: int
    local_test_fraction: float
    local_validation_fraction: float
    finetune_epochs: int
    fedme_architectures: str
    fedme_cluster_rounds: str
    fedme_model_tuning: bool
    fedme_mutual_learning: bool
    fedme_clustering: bool
    eval_every: int
    run_name: str
    output_dir: str
    resume_from: str

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Validate a Flower run config and return it typed.

        Raises
        ------
        ConfigError
            On an unknown or missing key, a value of the wrong type or out of
            range; the message names the key, the value and what is allowed.
        """
        unknown = sorted(set(run_config) - set(RULES))
        if unknown:
            raise ConfigError(
                f"unknown run-config key(s) {unknown}; known keys: {', '.join(RULES)}"
            )
        values: dict[str, Any] = {}
        for key, rule in RULES.items():
            if key not in run_config:
                raise ConfigError(
                    f"run config lacks '{key}' ({rule.allowed}); "
                    "is [tool.flwr.app.config] in pyproject.toml complete?"
                )
            value = run_config[key]
            if not _fits_type(value, rule.kind) or not rule.check(value):
                raise ConfigError(f"invalid run config {key}={value!r}: must be {rule.allowed}")
            values[key.replace("-", "_")] = float(value) if rule.kind is float else value
        return cls(**values)

    @property
    def architectures(self) -> tuple[str, ...]:
        """``fedme-architectures`` as a tuple of model names."""
        return comma_list(self.fedme_architectures)

    @property
    def cluster_rounds(self) -> tuple[int, ...]:
        """``fedme-cluster-rounds`` as a tuple of rounds."""
        return tuple(int(item) for item in comma_list(self.fedme_cluster_rounds))

    @property
    def personalized(self) -> bool:
        """Whether the strategy is evaluated per client (FedMe, FedAvg + fine-tuning)."""
        return self.strategy in PERSONALIZED_STRATEGIES

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration with its run-config (kebab-case) keys."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}
