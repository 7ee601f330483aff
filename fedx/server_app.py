"""fedx ServerApp: read the run config, build the strategy, run it, record the run.

After every round it writes a checkpoint to ``outputs/<run-name>/`` (see
:mod:`fedx.strategies.checkpoint`); the ``resume-from`` run-config key
continues a run from it, so a server crash loses at most the round in
progress.
"""

import functools
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
from torch.utils.data import DataLoader, Dataset

from fedx.config import STRATEGY_NAMES, ConfigError, RunConfig
from fedx.data import LEAF_DATASETS, dataset_info, load_split, load_unlabeled
from fedx.data.personalized import MIN_LOCAL_SAMPLES
from fedx.models import build_model
from fedx.outputs import MODEL_FILE, RunRecorder
from fedx.server_models import ServerModels
from fedx.strategies import (
    Checkpoint,
    CheckpointError,
    FedAvgFT,
    FedCross,
    FedIndep,
    FedMe,
    FedMR,
    FedMut,
    capture_run,
    load_checkpoint,
    restore_run,
    run_rounds,
    save_checkpoint,
)
from fedx.strategies.client_identity import ClientOrderedGrid, query_client_ids
from fedx.strategies.personalized import summarize
from fedx.training import evaluate, get_device

#: What a FedMe run saves instead of one global model: every client's
#: architecture and personalized state dict, by client id.
PERSONALIZED_MODELS_FILE = "personalized-models.pt"

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
        "pool_mean": cfg.pool_mean,
        "seed": cfg.seed,
        "node_wait_timeout": cfg.node_wait_timeout,
    }


def data_settings(cfg: RunConfig) -> dict:
    """The loader arguments that decide which samples a split holds."""
    return {
        "root": cfg.data_root,
        "download": cfg.download,
        "seed": cfg.seed,
        "test_fraction": cfg.test_fraction,
        "leaf_users": cfg.leaf_users,
        "leaf_min_samples": cfg.leaf_min_samples,
    }


def server_unlabeled_set(cfg: RunConfig) -> Dataset:
    """FedMe's unlabeled set (cached per process: loading it twice costs nothing)."""
    return load_unlabeled(cfg.dataset, size=cfg.unlabeled_size, **data_settings(cfg))


def build_fedme(cfg: RunConfig) -> FedMe:
    """FedMe with the torch callables of a :class:`ServerModels` on the unlabeled set.

    Raises
    ------
    ConfigError
        When an architecture of ``fedme-architectures`` cannot take the
        dataset's images (the VGGs need 32x32).
    """
    info = dataset_info(cfg.dataset)
    models = ServerModels(
        info.input_shape, info.num_classes, functools.partial(server_unlabeled_set, cfg), cfg.seed
    )
    for architecture in dict.fromkeys(cfg.architectures):
        try:
            models.module(architecture)  # builds each module once, up front
        except ValueError as err:
            raise ConfigError(
                f"invalid run config fedme-architectures={cfg.fedme_architectures!r}: {err}"
            ) from None
    return FedMe(
        architectures=cfg.architectures,
        initial_model_fn=models.initial_model,
        predict_fn=models.probabilities,
        cluster_rounds=cfg.cluster_rounds,
        model_tuning=cfg.fedme_model_tuning,
        mutual_learning=cfg.fedme_mutual_learning,
        clustering=cfg.fedme_clustering,
        fraction_train=cfg.fraction_train,
        min_train_nodes=cfg.min_train_nodes,
        min_available_nodes=cfg.min_available_nodes,
        evaluate_every=cfg.eval_every,
        finetune_epochs=cfg.finetune_epochs,
        seed=cfg.seed,
        node_wait_timeout=cfg.node_wait_timeout,
    )


STRATEGY_BUILDERS: dict[str, Callable[[RunConfig], Strategy]] = {
    "fedavg": lambda cfg: FedAvg(**_sampling_arguments(cfg)),
    "fedprox": lambda cfg: FedProx(**_sampling_arguments(cfg), proximal_mu=cfg.proximal_mu),
    "fedmr": lambda cfg: FedMR(
        **_multi_model_arguments(cfg),
        first_stage_rounds=cfg.first_stage_rounds,
        grouping=cfg.grouping,
        segment_fraction=cfg.segment_fraction or None,
        secure_recombination=cfg.secure_recombination,
        secure_repeats=cfg.secure_repeats,
        secure_min_layers=cfg.secure_min_layers,
        secure_max_layers=cfg.secure_max_layers,
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
    "fedme": build_fedme,
    # Personalized evaluation covers every client, whatever fraction-evaluate says.
    "fedavg-ft": lambda cfg: FedAvgFT(
        **{**_sampling_arguments(cfg), "fraction_evaluate": 1.0},
        finetune_epochs=cfg.finetune_epochs,
        evaluate_every=cfg.eval_every,
    ),
}
assert set(STRATEGY_BUILDERS) == set(STRATEGY_NAMES), "every strategy name needs a builder"


def check_data_and_model(cfg: RunConfig) -> None:
    """Reject data and model keys that are valid alone but not together.

    Raises
    ------
    ConfigError
        When ``partitioning = "natural"`` is asked of a dataset without users
        (not LEAF), or ``model`` cannot read the dataset's inputs (``lstm`` on
        images, an image model on Shakespeare, a VGG on 28x28 FEMNIST).
    """
    if cfg.partitioning == "natural" and cfg.dataset not in LEAF_DATASETS:
        raise ConfigError(
            f"invalid run config partitioning='natural': it makes every user of a LEAF dataset "
            f"({', '.join(LEAF_DATASETS)}) one client; dataset={cfg.dataset!r} has no users"
        )
    info = dataset_info(cfg.dataset)
    try:
        with torch.device("meta"):  # checks the shapes without allocating any weights
            build_model(cfg.model, info.input_shape, info.num_classes)
    except ValueError as err:
        raise ConfigError(
            f"invalid run config model={cfg.model!r} for dataset={cfg.dataset!r}: {err}"
        ) from None


def check_natural_clients(cfg: RunConfig, connected: int) -> None:
    """Compare the connected nodes with the clients of ``partitioning = "natural"``.

    Every selected LEAF user is one client, so a simulation needs exactly
    that many SuperNodes (each node's ``num-partitions`` is the federation's
    node count, and a client whose ``num-partitions`` differs fails). More
    nodes than users is an error; fewer is logged, as a deployment may run
    some clients only.

    Raises
    ------
    ConfigError
        When more nodes are connected than users are selected, or the LEAF
        files are missing or do not yield the users asked for.
    """
    if cfg.partitioning != "natural":
        return
    try:
        users = len(load_split(cfg.dataset, "train", **data_settings(cfg)).users)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"dataset={cfg.dataset!r}: {err}") from None
    message = (
        f"partitioning='natural' makes each of the {users} selected {cfg.dataset} users "
        f"(leaf-users={cfg.leaf_users}) one client, but {connected} nodes are connected"
    )
    if connected > users:
        raise ConfigError(f"{message}: run {users} SuperNodes (num-supernodes={users})")
    if connected < users:
        log(WARNING, "fedx: %s; nodes need num-partitions=%d, and the other users never train",
            message, users)


def build_strategy(cfg: RunConfig) -> Strategy:
    """Build the strategy named by the ``strategy`` run-config key.

    Raises
    ------
    ConfigError
        When the strategy rejects a combination of values that each passed
        their own check (for example ``fedcross-alpha-start`` above
        ``fedcross-alpha``), or the data and model keys do not fit together
        (:func:`check_data_and_model`).
    """
    check_data_and_model(cfg)
    if cfg.personalized and cfg.min_partition_size < MIN_LOCAL_SAMPLES:
        raise ConfigError(
            f"invalid run config min-partition-size={cfg.min_partition_size!r}: must be an "
            f"integer >= {MIN_LOCAL_SAMPLES} for strategy={cfg.strategy!r} (every client needs "
            "train, validation and test samples)"
        )
    if cfg.secure_recombination and cfg.strategy != "fedmr":
        raise ConfigError(
            f"secure-recombination=true needs strategy='fedmr', got strategy={cfg.strategy!r}"
        )
    try:
        return STRATEGY_BUILDERS[cfg.strategy](cfg)
    except ConfigError:
        raise  # already names its key
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


def model_label(cfg: RunConfig) -> str:
    """The model of a run for names and titles: FedMe's architectures, else ``model``."""
    return "+".join(cfg.architectures) if cfg.strategy == "fedme" else cfg.model


def run_directory(cfg: RunConfig) -> Path:
    """``<output-dir>/<run-name>``, with a timestamped name when none is given."""
    name = cfg.run_name or (
        f"{cfg.strategy}-{cfg.dataset}-{model_label(cfg)}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    return Path(cfg.output_dir).resolve() / name


class RoundEvaluation:
    """Flower's ``evaluate_fn``: the round clock, central and personalized results.

    Flower calls it before the first round and after every round, after
    federated evaluation. It records the round's wall time (the time between
    calls, minus central evaluation), evaluates the global model on the
    held-out test split every ``eval-every`` rounds and after the last (when
    there is a global model: not for FedMe), and copies the strategy's
    personalized results of the round (``strategy.evaluations``, if it keeps
    them) into ``metrics.json``.
    """

    def __init__(
        self,
        cfg: RunConfig,
        model: torch.nn.Module | None,
        recorder: RunRecorder,
        strategy: Strategy,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.recorder = recorder
        self.personalized = getattr(strategy, "evaluations", None)
        self.device = get_device()
        self.loader = None
        if model is not None:
            # LEAF: the union of the selected users' test samples.
            test_set = load_split(cfg.dataset, "test", **data_settings(cfg))
            self.loader = DataLoader(test_set, batch_size=256, shuffle=False)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Record the round; return the central metrics when they were computed."""
        if server_round > 0:
            self.recorder.record(server_round, **{"round-seconds": self.recorder.round_seconds()})
        self._record_personalized(server_round)
        due = server_round % self.cfg.eval_every == 0 or server_round == self.cfg.num_server_rounds
        metrics = None
        if due and self.model is not None and self.loader is not None:
            self.model.load_state_dict(arrays.to_torch_state_dict())
            loss, accuracy = evaluate(self.model, self.loader, self.device)
            self.recorder.record(server_round, loss=loss, accuracy=accuracy)
            metrics = MetricRecord({"loss": loss, "accuracy": accuracy})
        self.recorder.start_round_clock()
        return metrics

    def _record_personalized(self, server_round: int) -> None:
        results = (self.personalized or {}).get(server_round)
        if not results:
            return
        summary = summarize(results)
        self.recorder.record(server_round, **{k: float(v) for k, v in summary.items()})
        self.recorder.record_clients(server_round, {str(r.client_id): r.to_dict() for r in results})


def save_models(strategy: Strategy, model: torch.nn.Module, result: Result, directory: Path) -> None:
    """Save the global model (``model.pt``), or FedMe's personalized models."""
    if isinstance(strategy, FedMe):
        personalized = {
            client_id: {
                "architecture": architecture,
                "state_dict": {k: torch.from_numpy(v.copy()) for k, v in weights.items()},
            }
            for client_id, (architecture, weights) in strategy.personalized_models().items()
        }
        torch.save(personalized, directory / PERSONALIZED_MODELS_FILE)
        return
    if len(result.arrays) > 0:
        model.load_state_dict(result.arrays.to_torch_state_dict())
    torch.save(model.state_dict(), directory / MODEL_FILE)


def log_final(recorder: RunRecorder, directory: Path) -> None:
    """One line with the final accuracy (global and/or personalized)."""
    final = recorder.summary()["final"]
    if "personalized-accuracy" in final:
        log(INFO, "fedx: final personalized test accuracy %.4f ± %.4f over %d clients (round %s); "
            "global %s; outputs in %s",
            final["personalized-accuracy"], final["personalized-accuracy-std"],
            len(final.get("clients", {})), final.get("round"),
            f"{final['accuracy']:.4f}" if "accuracy" in final else "none (personalized models)",
            directory)
        return
    log(INFO, "fedx: final global test accuracy %.4f (round %s); outputs in %s",
        final.get("accuracy", float("nan")), final.get("round"), directory)


def load_resume_checkpoint(cfg: RunConfig) -> tuple[RunConfig, Checkpoint | None]:
    """Return the run config to use and the checkpoint ``resume-from`` names.

    A resumed run is the interrupted run continued: it takes every setting
    from the checkpoint (only ``resume-from`` comes from the new run config)
    and writes into the checkpoint's directory. Settings of the new run
    config that differ are logged as ignored; keys the checkpoint lacks
    (added to fedx after it was written) come from the new run config.

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
        added = {key: value for key, value in cfg.to_dict().items() if key not in stored}
        resumed = RunConfig.from_mapping({**added, **stored, "resume-from": cfg.resume_from})
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
        if key != "resume-from" and key not in added and value != stored[key]
    }
    if added:
        log(WARNING, "fedx: the checkpoint predates run-config keys %s; using this run's values",
            ", ".join(f"{key}={value!r}" for key, value in added.items()))
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
        check_natural_clients(cfg, connected)
    except ConfigError as err:
        log(ERROR, "fedx: %s", err)
        raise SystemExit(1) from None
    # Simulated nodes get random ids in every run: list them by client id so
    # that every strategy samples the same clients for the same seed.
    client_ids = query_client_ids(grid, list(grid.get_node_ids()), cfg.round_timeout)
    grid = ClientOrderedGrid(grid, client_ids)

    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model, info.input_shape, info.num_classes)
    fedme = isinstance(strategy, FedMe)
    if fedme:
        server_unlabeled_set(cfg)  # missing data stops the run now, not in a later round
    directory = run_directory(cfg) if checkpoint is None else Path(cfg.resume_from).resolve()
    if directory.suffix == ".json":  # resume-from named the checkpoint file itself
        directory = directory.parent
    recorder = RunRecorder(directory, cfg.to_dict(), rows)
    # FedMe has no global model: nothing to evaluate centrally or to start from.
    evaluation = RoundEvaluation(cfg, None if fedme else model, recorder, strategy)
    first_round = 1 if checkpoint is None else checkpoint.server_round + 1
    log(INFO, "fedx: %s on %s/%s, %d nodes connected (%d identified), rounds %d-%d; outputs in %s",
        cfg.strategy, cfg.dataset, model_label(cfg), connected, len(client_ids), first_round,
        cfg.num_server_rounds, directory)
    if restored is not None:
        initial = restored.arrays
    else:
        initial = ArrayRecord() if fedme else ArrayRecord(model.state_dict())

    result = run_rounds(
        strategy,
        grid,
        arrays=initial,
        num_rounds=cfg.num_server_rounds,
        first_round=first_round,
        timeout=cfg.round_timeout,
        train_config=training_config(cfg),
        # Personalized evaluation fine-tunes with the training hyperparameters.
        evaluate_config=training_config(cfg) if cfg.personalized else None,
        evaluate_fn=evaluation,
        result=restored,
        on_round_end=RoundCheckpointer(cfg, strategy, recorder, directory),
    )

    recorder.plot(f"{cfg.strategy} on {cfg.dataset} ({model_label(cfg)})")
    save_models(strategy, model, result, directory)
    log_final(recorder, directory)
