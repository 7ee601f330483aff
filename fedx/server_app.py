"""fedx ServerApp: read the run config, build the strategy, run it, record the run.

After every round it writes a checkpoint to ``outputs/<run-name>/`` (see
:mod:`fedx.strategies.checkpoint`); the ``resume-from`` run-config key
continues a run from it, so a server crash loses at most the round in
progress.
"""

import random
import time
from collections.abc import Callable
from datetime import datetime
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, FedProx, Result, Strategy
from torch.utils.data import DataLoader

from fedx.config import STRATEGY_NAMES, ConfigError, RunConfig
from fedx.data import dataset_info, load_split
from fedx.models import build_model
from fedx.outputs import MODEL_FILE, RunRecorder
from fedx.strategies import (
    Checkpoint,
    CheckpointError,
    FedCross,
    FedIndep,
    FedMR,
    FedMut,
    capture_run,
    load_checkpoint,
    restore_run,
    run_rounds,
    save_checkpoint,
)
from fedx.training import evaluate, get_device

app = ServerApp()


def _sampling_arguments(cfg: RunConfig) -> dict:
    return {
        "fraction_train": cfg.fraction_train,
        "fraction_evaluate": cfg.fraction_evaluate,
        "min_train_nodes": cfg.min_train_nodes,
        "min_evaluate_nodes": cfg.min_evaluate_nodes,
        "min_available_nodes": cfg.min_available_nodes,
    }


def _multi_model_arguments(cfg: RunConfig) -> dict:
    return {
        **_sampling_arguments(cfg),
        "seed": cfg.seed,
        "node_wait_timeout": cfg.node_wait_timeout,
    }


STRATEGY_BUILDERS: dict[str, Callable[[RunConfig], Strategy]] = {
    "fedavg": lambda cfg: FedAvg(**_sampling_arguments(cfg)),
    "fedprox": lambda cfg: FedProx(**_sampling_arguments(cfg), proximal_mu=cfg.proximal_mu),
    "fedmr": lambda cfg: FedMR(
        **_multi_model_arguments(cfg),
        first_stage_rounds=cfg.first_stage_rounds,
        grouping=cfg.grouping,
        segment_fraction=cfg.segment_fraction or None,
    ),
    "fedindep": lambda cfg: FedIndep(**_multi_model_arguments(cfg)),
    "fedmut": lambda cfg: FedMut(
        **_multi_model_arguments(cfg),
        alpha=cfg.fedmut_alpha,
        beta0=cfg.fedmut_beta0,
        beta_rounds=cfg.fedmut_beta_rounds,
    ),
    "fedcross": lambda cfg: FedCross(
        **_multi_model_arguments(cfg),
        alpha=cfg.fedcross_alpha,
        selection=cfg.fedcross_selection,
        propeller_rounds=cfg.fedcross_propeller_rounds,
        dynamic_alpha_rounds=cfg.fedcross_dynamic_alpha_rounds,
        alpha_start=cfg.fedcross_alpha_start,
    ),
}
assert set(STRATEGY_BUILDERS) == set(STRATEGY_NAMES), "every strategy name needs a builder"


def build_strategy(cfg: RunConfig) -> Strategy:
    """Build the strategy named by the ``strategy`` run-config key.

    Raises
    ------
    ConfigError
        When the strategy rejects a combination of values that each passed
        their own check (for example ``fedcross-alpha-start`` above
        ``fedcross-alpha``).
    """
    try:
        return STRATEGY_BUILDERS[cfg.strategy](cfg)
    except ValueError as err:
        raise ConfigError(f"strategy={cfg.strategy!r}: {err}") from None


def wait_for_nodes(grid: Grid, minimum: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for ``minimum`` connected nodes.

    Raises
    ------
    ConfigError
        When fewer nodes are connected after the timeout.
    """
    deadline = time.monotonic() + timeout
    while (connected := len(list(grid.get_node_ids()))) < minimum:
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"min-available-nodes={minimum} but only {connected} node(s) connected "
                f"after node-wait-timeout={timeout:g}s: start more SuperNodes or lower "
                "min-available-nodes"
            )
        time.sleep(1.0)
    return connected


def training_config(cfg: RunConfig) -> ConfigRecord:
    """Hyperparameters every training message carries to the ClientApps."""
    return ConfigRecord(
        {
            "learning-rate": cfg.learning_rate,
            "momentum": cfg.momentum,
            "weight-decay": cfg.weight_decay,
            "batch-size": cfg.batch_size,
            "local-epochs": cfg.local_epochs,
        }
    )


def run_directory(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``, with a timestamped name when none is given."""
    name = cfg.run_name or (
        f"{cfg.strategy}-{cfg.dataset}-{cfg.model}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    return Path(cfg.output_dir).resolve() / name


class CentralEvaluation:
    """Evaluates the global model on the held-out test split every few rounds.

    It is also the round clock: Flower calls it after each round, so the time
    between calls (minus evaluation) is the round's wall time.
    """

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, recorder: RunRecorder) -> None:
        self.cfg = cfg
        self.model = model
        self.recorder = recorder
        self.device = get_device()
        test_set = load_split(
            cfg.dataset,
            "test",
            root=cfg.data_root,
            download=cfg.download,
            seed=cfg.seed,
            test_fraction=cfg.test_fraction,
        )
        self.loader = DataLoader(test_set, batch_size=256, shuffle=False)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Flower's ``evaluate_fn``: called with round 0 and after every round."""
        if server_round > 0:
            self.recorder.record(server_round, **{"round-seconds": self.recorder.round_seconds()})
        due = server_round % self.cfg.eval_every == 0 or server_round == self.cfg.num_server_rounds
        metrics = None
        if due:
            self.model.load_state_dict(arrays.to_torch_state_dict())
            loss, accuracy = evaluate(self.model, self.loader, self.device)
            self.recorder.record(server_round, loss=loss, accuracy=accuracy)
            metrics = MetricRecord({"loss": loss, "accuracy": accuracy})
        self.recorder.start_round_clock()
        return metrics


def load_resume_checkpoint(cfg: RunConfig) -> tuple[RunConfig, Checkpoint | None]:
    """Return the run config to use and the checkpoint ``resume-from`` names.

    A resumed run is the interrupted run continued: it takes every setting
    from the checkpoint (only ``resume-from`` comes from the new run config)
    and writes into the checkpoint's directory. Settings of the new run
    config that differ are logged as ignored.

    Raises
    ------
    ConfigError
        When there is no readable checkpoint at ``resume-from``, or its run
        had already done all its rounds.
    """
    if not cfg.resume_from:
        return cfg, None
    try:
        checkpoint = load_checkpoint(cfg.resume_from)
        stored = checkpoint.state["config"]
        resumed = RunConfig.from_mapping({**stored, "resume-from": cfg.resume_from})
    except (CheckpointError, KeyError, TypeError) as err:
        raise ConfigError(f"invalid run config resume-from={cfg.resume_from!r}: {err}") from None
    if checkpoint.server_round >= resumed.num_server_rounds:
        raise ConfigError(
            f"invalid run config resume-from={cfg.resume_from!r}: that run already did "
            f"all its num-server-rounds={resumed.num_server_rounds}"
        )
    ignored = {
        key: value
        for key, value in cfg.to_dict().items()
        if key != "resume-from" and value != stored.get(key)
    }
    if ignored:
        log(WARNING, "fedx: resuming with the checkpoint's run config; ignoring %s",
            ", ".join(f"{key}={value!r}" for key, value in ignored.items()))
    return resumed, checkpoint


class RoundCheckpointer:
    """``on_round_end`` of the round loop: records train metrics, writes a checkpoint."""

    def __init__(
        self, cfg: RunConfig, strategy: Strategy, recorder: RunRecorder, directory: Path
    ) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.recorder = recorder
        self.directory = directory

    def __call__(self, server_round: int, arrays: ArrayRecord, result: Result) -> None:
        """Called after round ``server_round``, evaluation included."""
        del arrays  # result.arrays is the same global model
        train_metrics = result.train_metrics_clientapp.get(server_round, {})
        self.recorder.record(
            server_round, **{k: float(v) for k, v in train_metrics.items() if not isinstance(v, list)}
        )
        started = time.perf_counter()
        state: dict[str, Any] = {
            **capture_run(self.strategy, result),
            "config": self.cfg.to_dict(),
            "recorder": {str(r): row for r, row in self.recorder.rounds.items()},
        }
        save_checkpoint(
            self.directory, Checkpoint(server_round, type(self.strategy).__name__, state)
        )
        self.recorder.record(server_round, **{"checkpoint-seconds": time.perf_counter() - started})
        log(INFO, "fedx: checkpoint of round %d in %s", server_round, self.directory)


def resume_state(
    checkpoint: Checkpoint | None, strategy: Strategy
) -> tuple[Result | None, dict[int, dict[str, float]]]:
    """The restored metrics and recorder rows (``None``, ``{}`` for a new run).

    Raises
    ------
    ConfigError
        When the checkpoint was written by another strategy or does not fit.
    """
    if checkpoint is None:
        return None, {}
    name = type(strategy).__name__
    if checkpoint.strategy != name:
        raise ConfigError(f"the checkpoint was written by {checkpoint.strategy}, not {name}")
    try:
        result = restore_run(strategy, checkpoint.state)
        rows = {int(r): dict(row) for r, row in checkpoint.state["recorder"].items()}
    except (CheckpointError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"cannot resume from the checkpoint: {err}") from None
    return result, rows


# pylint: disable=too-many-locals
@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one fedx experiment as the run config describes."""
    try:
        cfg, checkpoint = load_resume_checkpoint(RunConfig.from_mapping(context.run_config))
        strategy = build_strategy(cfg)
        random.seed(cfg.seed)  # Flower's own strategies sample nodes with `random`
        torch.manual_seed(cfg.seed)
        restored, rows = resume_state(checkpoint, strategy)
        connected = wait_for_nodes(grid, cfg.min_available_nodes, cfg.node_wait_timeout)
    except ConfigError as err:
        log(ERROR, "fedx: %s", err)
        raise SystemExit(1) from None

    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model, info.input_shape, info.num_classes)
    directory = run_directory(cfg) if checkpoint is None else Path(cfg.resume_from).resolve()
    if directory.suffix == ".json":  # resume-from named the checkpoint file itself
        directory = directory.parent
    recorder = RunRecorder(directory, cfg.to_dict(), rows)
    evaluation = CentralEvaluation(cfg, model, recorder)
    first_round = 1 if checkpoint is None else checkpoint.server_round + 1
    log(INFO, "fedx: %s on %s/%s, %d nodes connected, rounds %d-%d; outputs in %s",
        cfg.strategy, cfg.dataset, cfg.model, connected, first_round, cfg.num_server_rounds,
        directory)

    result = run_rounds(
        strategy,
        grid,
        arrays=restored.arrays if restored is not None else ArrayRecord(model.state_dict()),
        num_rounds=cfg.num_server_rounds,
        first_round=first_round,
        timeout=cfg.round_timeout,
        train_config=training_config(cfg),
        evaluate_fn=evaluation,
        result=restored,
        on_round_end=RoundCheckpointer(cfg, strategy, recorder, directory),
    )

    recorder.plot(f"{cfg.strategy} on {cfg.dataset} ({cfg.model})")
    if len(result.arrays) > 0:
        model.load_state_dict(result.arrays.to_torch_state_dict())
    torch.save(model.state_dict(), directory / MODEL_FILE)
    final = recorder.summary()["final"]
    log(INFO, "fedx: final global test accuracy %.4f (round %s); outputs in %s",
        final.get("accuracy", float("nan")), final.get("round"), directory)
