"""The fedx ServerApp's work: read the run config, build the strategy, run it, record the run.

:mod:`fedx.server_app` calls :func:`run_experiment` from its main function,
and imports this module (torch, the data, the models, the strategies) only
then. The parts: building the strategy from the method registry
(:mod:`~fedx.server.building`), central and per-client evaluation
(:mod:`~fedx.server.evaluation`), saving models (:mod:`~fedx.server.saving`)
and checkpoints with resuming (:mod:`~fedx.server.resume`): a crash loses at
most the round in progress, and ``resume-from`` continues the run. A run that
diverges stops early (see :class:`~fedx.strategies.DivergenceGuard`, the
``divergence-*`` keys).
"""

import contextlib
import random
from logging import ERROR, INFO
from typing import Any

import torch
from flwr.app import ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedx.config import ConfigError, RunConfig
from fedx.data import dataset_info
from fedx.models import build_model
from fedx.outputs import RunRecorder
from fedx.protocol.common import TrainingSettings
from fedx.registry import component_label
from fedx.server.building import build_strategy, check_natural_clients, prepare_data, require_nodes
from fedx.server.evaluation import RoundEvaluation
from fedx.server.resume import Checkpointer, model_label, overridden_keys
from fedx.server.saving import log_final, save_models
from fedx.strategies import DivergenceGuard, run_rounds
from fedx.strategy_core.capabilities import KeepsPersonalizedModels, reads_packed_models
from fedx.strategy_core.client_identity import ClientOrderedGrid, query_client_ids
from fedx.strategy_core.packing import PackingGrid
from fedx.training import deterministic_kernels


def run_experiment(grid: Grid, context: Context) -> None:
    """Run one fedx experiment as the run config describes (the ServerApp's main)."""
    with contextlib.ExitStack() as kernels:
        _run_experiment(grid, context, kernels)


def _run_experiment(grid: Grid, context: Context, kernels: contextlib.ExitStack) -> None:
    try:
        checkpointer = Checkpointer.open(
            RunConfig.from_mapping(context.run_config), overridden_keys(grid)
        )
        cfg = checkpointer.config
        # Before anything here runs on a GPU (the ClientApps set their own).
        kernels.enter_context(deterministic_kernels(cfg.deterministic))
        strategy = build_strategy(cfg)
        prepare_data(cfg)
        random.seed(cfg.seed)  # Flower's own strategies sample nodes with `random`
        torch.manual_seed(cfg.seed)
        # A strategy that keeps a model per client has no global model to
        # evaluate centrally or to start from.
        model = None
        if not isinstance(strategy, KeepsPersonalizedModels):
            info = dataset_info(cfg.dataset)
            model = build_model(cfg.model, info.input_shape, info.num_classes)
        resumed = checkpointer.restore(strategy, model)
        connected = require_nodes(grid, cfg.min_available_nodes, cfg.node_wait_timeout)
        check_natural_clients(cfg, connected)
    except ConfigError as err:
        log(ERROR, "fedx: %s", err)
        raise SystemExit(1) from None
    # Models travel packed to the nodes whose answer to the query says they
    # read that form, when the strategy reads it back (fedx.strategy_core.packing).
    packing = PackingGrid(grid) if reads_packed_models(strategy) else None
    if packing is not None:
        grid = packing
    # Simulated nodes get random ids in every run: list them by client id so
    # that every strategy samples the same clients for the same seed.
    client_ids = query_client_ids(grid, list(grid.get_node_ids()), cfg.round_timeout)
    grid = ClientOrderedGrid(grid, client_ids)

    directory = checkpointer.directory
    recorder = RunRecorder(directory, cfg.to_dict(), resumed.rows)
    log(
        INFO,
        "fedx: %s on %s/%s, %d nodes connected (%d identified, %d read packed models), "
        "rounds %d-%d; outputs in %s",
        cfg.strategy,
        cfg.dataset,
        model_label(cfg),
        connected,
        len(client_ids),
        0 if packing is None else len(packing.packed_nodes),
        resumed.first_round,
        cfg.num_server_rounds,
        directory,
    )
    if resumed.arrays is not None:
        initial = resumed.arrays
    else:
        initial = ArrayRecord(model.state_dict()) if model is not None else ArrayRecord()

    def after_round(server_round: int, arrays: ArrayRecord, result: Result) -> None:
        del arrays  # result.arrays is the same global model
        train_metrics: dict[str, Any] = dict(result.train_metrics_clientapp.get(server_round, {}))
        recorder.record(
            server_round,
            **{k: float(v) for k, v in train_metrics.items() if not isinstance(v, list)},
        )
        seconds = checkpointer.save(server_round, strategy, result, recorder.rounds)
        recorder.record(server_round, **{"checkpoint-seconds": seconds})
        recorder.flush()

    guard = DivergenceGuard(
        cfg.divergence_rounds, cfg.divergence_nonfinite, cfg.divergence_loss_ratio
    )
    training = TrainingSettings.from_run_config(cfg).to_record
    result = run_rounds(
        strategy,
        grid,
        initial_arrays=initial,
        num_rounds=cfg.num_server_rounds,
        start_round=resumed.first_round,
        timeout=cfg.round_timeout,
        train_config=training(),
        # Personalized evaluation fine-tunes with the training hyperparameters.
        evaluate_config=training() if cfg.personalized else None,
        evaluate_fn=RoundEvaluation(cfg, model, recorder, strategy),
        result=resumed.result,
        on_round_end=after_round,
        guard=guard,
    )
    if guard.stop_reason is not None:  # run_rounds logged it; the checkpoint is of a good round
        recorder.stopped(guard.stop_reason)
    recorder.flush()  # the last evaluation, and rounds whose checkpoint the guard held back

    if packing is not None:
        log(
            INFO,
            "fedx: models went packed in %d messages, standard in %d",
            packing.sent_packed,
            packing.sent_standard,
        )
    recorder.plot(f"{cfg.strategy} on {component_label(cfg.dataset)} ({model_label(cfg)})")
    save_models(strategy, model, result, directory)
    log_final(recorder, directory)
