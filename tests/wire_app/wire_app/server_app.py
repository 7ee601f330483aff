"""A ServerApp running fedx strategies on numpy models, with fedx checkpoints.

It is what a user of ``fedx.strategies`` writes into their own Flower app:
the strategies, ``run_rounds`` with a checkpoint after every round, and
``restore_run`` to resume. Run-config keys (see pyproject.toml) let the
deployment tests crash it after a round, slow the clients down, or make
one of them misbehave. With ``wire="packed"`` it asks the nodes, as fedx's
ServerApp does, which of them read fedx's packed model form, and sends
them models packed (:mod:`fedx.strategy_core.packing`).
"""

import hashlib
import json
import os
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedx.messaging import wait_for_nodes
from fedx.strategies import (
    Checkpoint,
    FedCross,
    FedMR,
    FedMut,
    MultiModelStrategy,
    capture_run,
    load_checkpoint,
    restore_run,
    run_rounds,
    save_checkpoint,
)
from fedx.strategy_core.client_identity import query_client_ids
from fedx.strategy_core.packing import PackingGrid
from wire_app.client_app import NUM_CLASSES, NUM_FEATURES

STRATEGIES = {"fedmr": FedMR, "fedmut": FedMut, "fedcross": FedCross}
CRASH_EXIT_CODE = 3

app = ServerApp()


def fingerprint(model: dict) -> str:
    """A short hash of a model's names and bytes, to compare runs."""
    digest = hashlib.sha256()
    for name, array in model.items():
        digest.update(name.encode() + np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def initial_model(config) -> dict[str, np.ndarray]:
    """The softmax regression's zeros (with ``payload-bytes`` of float32 zeros), or the run
    config's fedx ``model`` as CIFAR-10 builds it."""
    if not config["model"]:
        model = {
            "weight": np.zeros((NUM_FEATURES, NUM_CLASSES), dtype=np.float32),
            "bias": np.zeros(NUM_CLASSES, dtype=np.float32),
        }
        if int(config["payload-bytes"]) > 0:
            model["payload"] = np.zeros(int(config["payload-bytes"]) // 4, dtype=np.float32)
        return model
    from fedx.models import build_model  # pylint: disable=import-outside-toplevel  (torch)

    module = build_model(str(config["model"]), (3, 32, 32), 10)
    return {name: tensor.numpy() for name, tensor in module.state_dict().items()}


def build(name: str, config) -> MultiModelStrategy:
    """The strategy ``name`` with the test's sampling settings."""
    min_nodes = int(config["min-nodes"])
    return STRATEGIES[name](
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=min(2, min_nodes),
        min_available_nodes=min_nodes,
        seed=int(config["seed"]),
        node_wait_timeout=60.0,
        unresponsive_cooldown=float(config["unresponsive-cooldown"]),
    )


def run_one(name: str, grid: Grid, config) -> dict:
    """Run strategy ``name``; checkpoint, resume and crash as configured."""
    strategy = build(name, config)
    checkpoints = Path(str(config["checkpoint-dir"])) / name if config["checkpoint-dir"] else None
    crash_after = int(config["crash-after-round"])
    arrays = ArrayRecord({name: Array(array) for name, array in initial_model(config).items()})
    first_round, result, restored_pool = 1, None, []
    if config["resume"]:
        assert checkpoints is not None, "resume needs a checkpoint-dir"
        checkpoint = load_checkpoint(checkpoints)
        result = restore_run(strategy, checkpoint.state)
        arrays, first_round = result.arrays, checkpoint.server_round + 1
        restored_pool = [fingerprint(model) for model in strategy.pool]
    round_ends = {first_round - 1: time.monotonic()}

    def on_round_end(server_round, arrays, result) -> None:
        del arrays
        round_ends[server_round] = time.monotonic()
        if checkpoints is not None:
            state = capture_run(strategy, result)
            save_checkpoint(checkpoints, Checkpoint(server_round, type(strategy).__name__, state))
        if server_round == crash_after:
            os._exit(CRASH_EXIT_CODE)  # a server crash: no clean-up, no result file

    result = run_rounds(
        strategy,
        grid,
        initial_arrays=arrays,
        num_rounds=int(config["num-server-rounds"]),
        start_round=first_round,
        timeout=float(config["round-timeout"]),
        train_config=ConfigRecord({"train-delay": float(config["train-delay"])}),
        result=result,
        on_round_end=on_round_end,
    )
    metrics = result.train_metrics_clientapp
    return {
        "class": type(strategy).__name__,
        "rounds": sorted(metrics),
        "trained-slots": {str(r): int(m["trained-slots"]) for r, m in metrics.items()},
        "train-loss": {str(r): float(m["train-loss"]) for r, m in metrics.items()},
        "round-seconds": {
            str(r): round_ends[r] - round_ends[r - 1] for r in sorted(round_ends)[1:]
        },
        "restored-pool": restored_pool,
        "pool": [fingerprint(model) for model in strategy.pool],
        "global-model": fingerprint({n: a.numpy() for n, a in result.arrays.items()}),
    }


def stall(grid: Grid, config) -> None:
    """Send every node a train message, the first node's without its content; wait to be stopped.

    The first node (lowest id) sees what a ServerApp killed while it pushes
    a round leaves: a message whose objects never arrive. The others train
    (for ``train-delay`` seconds).
    """
    # A test app's fault: Flower's grid is told to push no objects of a message.
    from flwr.superlink.grid import http_grid  # pylint: disable=import-outside-toplevel

    deadline = time.monotonic() + 60.0
    while len(node_ids := sorted(grid.get_node_ids())) < int(config["min-nodes"]):
        assert time.monotonic() < deadline, f"only {len(node_ids)} nodes connected"
        time.sleep(0.2)
    content = {
        "arrays": ArrayRecord({n: Array(a) for n, a in initial_model(config).items()}),
        "config": ConfigRecord({"server-round": 1, "train-delay": float(config["train-delay"])}),
    }

    def messages(nodes: list[int]) -> list[Message]:
        return [Message(RecordDict(content), dst_node_id=n, message_type="train") for n in nodes]

    grid.push_messages(messages(node_ids[1:]))
    http_grid.push_objects = lambda *args, **kwargs: None
    grid.push_messages(messages(node_ids[:1]))
    while True:
        time.sleep(60.0)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run each strategy of ``strategies`` in turn; write what happened to ``result-file``."""
    config = context.run_config
    if config.get("stall"):
        stall(grid, config)
    summary = {"flwr-version": version("flwr"), "strategies": {}}
    packing = None
    if config.get("wire", "standard") == "packed":
        grid = packing = PackingGrid(grid)
        nodes = wait_for_nodes(grid, int(config["min-nodes"]), 60.0)
        query_client_ids(grid, nodes, float(config["round-timeout"]))
    for name in str(config["strategies"]).split(","):
        summary["strategies"][name] = run_one(name, grid, config)
    if packing is not None:
        summary["wire"] = {
            "packed-nodes": len(packing.packed_nodes),
            "sent-packed": packing.sent_packed,
            "sent-standard": packing.sent_standard,
        }
    if config["result-file"]:
        Path(str(config["result-file"])).write_text(json.dumps(summary, indent=1))
