"""A run's checkpoints: where they go, what a resumed run continues from, writing one per round.

After every round the app writes a checkpoint into the run directory
(:mod:`fedx.strategy_core.checkpoint`): the strategy's state, the global model,
Python's ``random`` state, the metrics so far, the run config and the rows
of ``metrics.json``. A run with ``resume-from`` set is the interrupted run
continued, or a finished one extended to a larger ``num-server-rounds``:
:class:`Checkpointer` owns that recipe.
"""

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedx.config import ConfigError, RunConfig
from fedx.data import dataset_info
from fedx.models import build_model
from fedx.ops import Model, find_problem
from fedx.registry import component_label
from fedx.strategies import to_model
from fedx.strategy_core import checkpoint as checkpoints
from fedx.strategy_core.capabilities import KeepsPersonalizedModels


def model_label(cfg: RunConfig) -> str:
    """The models of a run for names and titles (``cnn``; ``cnn-1+cnn-2`` for several; ``build_mlp``
    for ``package.module:build_mlp``)."""
    return "+".join(component_label(name) for name in cfg.models)


def run_directory(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``, with a timestamped name when none is given."""
    dataset = component_label(cfg.dataset)
    name = cfg.run_name or (
        f"{cfg.strategy}-{dataset}-{model_label(cfg)}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    return Path(cfg.output_dir).resolve() / name


#: What a resumed run may take from its own run config instead of the checkpoint's.
EXTENDABLE = "num-server-rounds"
#: Where a run goes on, not what it computes: a resumed run takes these from its
#: own run config when it sets them (a run begun on a GPU machine goes on on a CPU).
WHERE = ("device",)
#: Keys that say which run a checkpoint belongs to: set to another value, they
#: ask for another run, which the checkpoint cannot continue.
IDENTITY = ("strategy", "dataset", "model")


def overridden_keys(grid: Grid) -> frozenset[str] | None:
    """The run-config keys this run sets itself (``flwr run --run-config``), when the grid says.

    Flower fuses them with the app's defaults into ``context.run_config``;
    the grid's ``Run`` keeps them apart. ``None`` when the grid does not
    tell (a stand-in grid).
    """
    try:
        return frozenset(grid.run.override_config)
    except (AttributeError, NotImplementedError, TypeError):
        return None


@dataclass
class Resumed:
    """Where a run starts: its first round, the global model, what was recorded."""

    first_round: int = 1
    arrays: ArrayRecord | None = None
    result: Result | None = None
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)


class Checkpointer:
    """Owns the checkpoints of one run.

    Use :meth:`open` with the run config of a new run: when ``resume-from``
    names a checkpoint, :attr:`config` is the checkpointed run's config and
    :attr:`directory` its directory; :meth:`restore` then puts the strategy
    back, and :meth:`save` writes the checkpoint of every round.
    """

    def __init__(
        self, config: RunConfig, directory: Path, checkpoint: checkpoints.Checkpoint | None = None
    ) -> None:
        self.config = config
        self.directory = directory
        self.checkpoint = checkpoint

    @classmethod
    def open(cls, cfg: RunConfig, overridden: Collection[str] | None = None) -> "Checkpointer":
        """The checkpointer of a new run, or of the run ``resume-from`` names.

        A resumed run takes its settings from the checkpoint and writes into
        the checkpoint's directory. Only ``resume-from`` comes from the new
        run config, and ``num-server-rounds`` and ``device`` when the new run sets them
        (``overridden``, see :func:`overridden_keys`): a finished or
        interrupted run then continues to the new length. Other settings of
        the new run config that differ are logged as ignored; keys the
        checkpoint lacks (added to fedx after it was written) come from the
        new run config.

        Raises
        ------
        ConfigError
            When there is no readable checkpoint at ``resume-from``, the new
            run sets the ``strategy``, ``dataset`` or ``model`` of another run,
            or the run had already done all its rounds.
        """
        if not cfg.resume_from:
            return cls(cfg, run_directory(cfg))
        location = f"resume-from={cfg.resume_from!r}"
        try:
            checkpoint = checkpoints.load_checkpoint(cfg.resume_from)
        except checkpoints.CheckpointError as err:
            raise ConfigError(f"invalid run config {location}: {err}") from None
        damaged = f"invalid run config {location}: '{checkpoint.path}' holds a damaged run config"
        try:
            stored = checkpoint.state["config"]
            if not isinstance(stored, dict):
                raise TypeError("it is not a table of keys")
            added = {key: value for key, value in cfg.to_dict().items() if key not in stored}
            taken: dict[str, Any] = {}
            for key in (EXTENDABLE, *WHERE):
                if overridden is not None and key in overridden:
                    taken[key] = cfg[key]
            resumed = RunConfig.from_mapping(
                {**added, **stored, **taken, "resume-from": cfg.resume_from}
            )
        except KeyError as err:
            raise ConfigError(f"{damaged}: it lacks {err}") from None
        except (TypeError, ConfigError) as err:
            raise ConfigError(f"{damaged}: {err}") from None
        candidates = set(cfg.to_dict()) if overridden is None else set(overridden)
        changed = {
            key: cfg[key]
            for key in sorted(candidates - {"resume-from", *taken, *added})
            if key in stored and cfg[key] != stored[key]
        }
        clashes = [key for key in IDENTITY if key in changed and overridden is not None]
        if clashes:
            raise ConfigError(
                f"invalid run config {location}: the checkpoint is of a "
                f"{', '.join(f'{key}={stored[key]!r}' for key in IDENTITY)} run; this run sets "
                f"{', '.join(f'{key}={changed[key]!r}' for key in clashes)} (a checkpoint "
                "continues its own run only)"
            )
        if checkpoint.server_round >= resumed.num_server_rounds:
            raise ConfigError(
                f"invalid run config {location}: that run already did all its "
                f"num-server-rounds={resumed.num_server_rounds}; set a larger "
                "num-server-rounds to continue it"
            )
        if resumed.num_server_rounds != stored.get(EXTENDABLE):
            log(
                INFO,
                "fedx: continuing the run of %s rounds to num-server-rounds=%d",
                stored.get(EXTENDABLE),
                resumed.num_server_rounds,
            )
        if added:
            log(
                WARNING,
                "fedx: the checkpoint predates run-config keys %s; using this run's values",
                ", ".join(f"{key}={value!r}" for key, value in added.items()),
            )
        if changed:
            log(
                WARNING,
                "fedx: resuming with the checkpoint's run config; ignoring %s",
                ", ".join(f"{key}={value!r}" for key, value in changed.items()),
            )
        directory = Path(cfg.resume_from).resolve()
        if directory.suffix == ".json":  # resume-from named the checkpoint file itself
            directory = directory.parent
        return cls(resumed, directory, checkpoint)

    def restore(self, strategy: Strategy, model: torch.nn.Module | None = None) -> Resumed:
        """Put ``strategy`` (and ``random``) back into the checkpoint's state; where to go on.

        Every model the checkpoint holds must fit the run's: the global model
        and every model in the strategy's state (a pool, a method's last global
        model) must have the names, shapes and dtypes of ``model``'s state
        dict, finite values, and a personalized strategy's client models
        those of their architectures.

        Raises
        ------
        ConfigError
            One line naming the file and what is wrong: the checkpoint was
            written by another strategy than its run config names, its state
            does not fit the strategy, or its arrays do not fit the models.
        """
        checkpoint = self.checkpoint
        if checkpoint is None:
            return Resumed()
        path = checkpoint.path or self.directory / checkpoints.CHECKPOINT_FILE
        name = type(strategy).__name__
        if checkpoint.strategy != name:
            raise ConfigError(
                f"cannot resume from '{path}': it was written by {checkpoint.strategy}, but its "
                f"run config names strategy={self.config.strategy!r} ({name})"
            )
        try:
            result = checkpoints.restore_run(strategy, checkpoint.state)
            rows = {int(r): dict(row) for r, row in checkpoint.state["recorder"].items()}
        except (
            checkpoints.CheckpointError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
        ) as err:
            raise ConfigError(f"cannot resume from '{path}': {err}") from None
        problem = self._models_problem(strategy, model, to_model(result.arrays))
        if problem is not None:
            raise ConfigError(f"cannot resume from '{checkpoint.arrays_path or path}': {problem}")
        return Resumed(checkpoint.server_round + 1, result.arrays, result, rows)

    def _models_problem(
        self, strategy: Strategy, model: torch.nn.Module | None, global_model: Model
    ) -> str | None:
        """Why a model of the checkpoint does not fit the run's models, or ``None``."""
        assert self.checkpoint is not None
        cfg = self.config
        if model is not None:
            expected = _numpy_state(model)
            found = [("the global model", global_model)]
            found += _models_in(self.checkpoint.state.get("strategy"), "the strategy's")
            for what, weights in found:
                problem = find_problem(expected, weights)
                if problem is not None:
                    return f"{what} does not fit model={cfg.model!r} on {cfg.dataset}: {problem}"
        if isinstance(strategy, KeepsPersonalizedModels):
            info = dataset_info(cfg.dataset)
            layouts: dict[str, Model] = {}
            for client_id, (architecture, weights) in strategy.personalized_models().items():
                if architecture not in layouts:
                    try:
                        built = build_model(architecture, info.input_shape, info.num_classes)
                    except ValueError as err:
                        return f"client {client_id}'s architecture {architecture!r}: {err}"
                    layouts[architecture] = _numpy_state(built)
                problem = find_problem(layouts[architecture], weights)
                if problem is not None:
                    return (
                        f"client {client_id}'s model does not fit {architecture!r} on "
                        f"{cfg.dataset}: {problem}"
                    )
        return None

    def save(
        self, server_round: int, strategy: Strategy, result: Result, rows: dict[int, dict[str, Any]]
    ) -> float:
        """Write the checkpoint of round ``server_round``; return the seconds it took."""
        started = time.perf_counter()
        state: dict[str, Any] = {
            **checkpoints.capture_run(strategy, result),
            "config": self.config.to_dict(),
            "recorder": {str(r): row for r, row in rows.items()},
        }
        checkpoints.save_checkpoint(
            self.directory, checkpoints.Checkpoint(server_round, type(strategy).__name__, state)
        )
        log(INFO, "fedx: checkpoint of round %d in %s", server_round, self.directory)
        return time.perf_counter() - started


def _numpy_state(model: torch.nn.Module) -> Model:
    return {name: tensor.detach().cpu().numpy() for name, tensor in model.state_dict().items()}


def _models_in(value: Any, where: str) -> list[tuple[str, Model]]:
    """Every model (a non-empty dict of arrays) in a strategy state, with where it is."""
    if isinstance(value, dict):
        if value and all(isinstance(v, np.ndarray) for v in value.values()):
            return [(where, value)]
        return [
            found
            for key, item in value.items()
            for found in _models_in(
                item, f"{where} {key}" if where.endswith("'s") else f"{where}.{key}"
            )
        ]
    if isinstance(value, list):
        return [
            found for i, item in enumerate(value) for found in _models_in(item, f"{where}[{i}]")
        ]
    return []
