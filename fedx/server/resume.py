"""A run's checkpoints: where they go, what a resumed run continues from, writing one per round.

After every round the app writes a checkpoint into the run directory
(:mod:`fedx.strategies.checkpoint`): the strategy's state, the global model,
Python's ``random`` state, the metrics so far, the run config and the rows
of ``metrics.json``. A run with ``resume-from`` set is the interrupted run
continued: :class:`Checkpointer` owns that recipe.
"""

import time
from dataclasses import dataclass, field
from datetime import datetime
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord
from flwr.common import log
from flwr.serverapp.strategy import Result, Strategy

from fedx.config import ConfigError, RunConfig
from fedx.strategies import checkpoint as checkpoints


def model_label(cfg: RunConfig) -> str:
    """The models of a run for names and titles (``cnn``; ``cnn-1+cnn-2`` for several)."""
    return "+".join(cfg.models)


def run_directory(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``, with a timestamped name when none is given."""
    name = cfg.run_name or (
        f"{cfg.strategy}-{cfg.dataset}-{model_label(cfg)}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    return Path(cfg.output_dir).resolve() / name


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
    def open(cls, cfg: RunConfig) -> "Checkpointer":
        """The checkpointer of a new run, or of the run ``resume-from`` names.

        A resumed run takes every setting from the checkpoint (only
        ``resume-from`` comes from the new run config) and writes into the
        checkpoint's directory. Settings of the new run config that differ
        are logged as ignored; keys the checkpoint lacks (added to fedx after
        it was written) come from the new run config.

        Raises
        ------
        ConfigError
            When there is no readable checkpoint at ``resume-from``, or its run
            had already done all its rounds.
        """
        if not cfg.resume_from:
            return cls(cfg, run_directory(cfg))
        try:
            checkpoint = checkpoints.load_checkpoint(cfg.resume_from)
            stored = checkpoint.state["config"]
            added = {key: value for key, value in cfg.to_dict().items() if key not in stored}
            resumed = RunConfig.from_mapping({**added, **stored, "resume-from": cfg.resume_from})
        except (checkpoints.CheckpointError, KeyError, TypeError) as err:
            raise ConfigError(
                f"invalid run config resume-from={cfg.resume_from!r}: {err}"
            ) from None
        if checkpoint.server_round >= resumed.num_server_rounds:
            raise ConfigError(
                f"invalid run config resume-from={cfg.resume_from!r}: that run already did "
                f"all its num-server-rounds={resumed.num_server_rounds}"
            )
        ignored = {
            key: value
            for key, value in cfg.to_dict().items()
            if key != "resume-from" and key not in added and value != stored[key]
        }
        if added:
            log(
                WARNING,
                "fedx: the checkpoint predates run-config keys %s; using this run's values",
                ", ".join(f"{key}={value!r}" for key, value in added.items()),
            )
        if ignored:
            log(
                WARNING,
                "fedx: resuming with the checkpoint's run config; ignoring %s",
                ", ".join(f"{key}={value!r}" for key, value in ignored.items()),
            )
        directory = Path(cfg.resume_from).resolve()
        if directory.suffix == ".json":  # resume-from named the checkpoint file itself
            directory = directory.parent
        return cls(resumed, directory, checkpoint)

    def restore(self, strategy: Strategy) -> Resumed:
        """Put ``strategy`` (and ``random``) back into the checkpoint's state; where to go on.

        Raises
        ------
        ConfigError
            When the checkpoint was written by another strategy or does not fit.
        """
        if self.checkpoint is None:
            return Resumed()
        name = type(strategy).__name__
        if self.checkpoint.strategy != name:
            raise ConfigError(
                f"the checkpoint was written by {self.checkpoint.strategy}, not {name}"
            )
        try:
            result = checkpoints.restore_run(strategy, self.checkpoint.state)
            rows = {int(r): dict(row) for r, row in self.checkpoint.state["recorder"].items()}
        except (checkpoints.CheckpointError, KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"cannot resume from the checkpoint: {err}") from None
        return Resumed(self.checkpoint.server_round + 1, result.arrays, result, rows)

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
