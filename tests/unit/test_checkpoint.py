"""Checkpoints: the file format, and resuming a crashed run to the same final pool."""

import json
import random

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg, Result

from fedx.strategies import (
    FedCross,
    FedIndep,
    FedMR,
    FedMut,
    MultiModelStrategy,
    run_rounds,
    to_arrayrecord,
    to_model,
)
from fedx.strategy_core import checkpoint as checkpoints
from tests.support.standin_grid import NODE_IDS, CrashingGrid

pytestmark = pytest.mark.usefixtures("server_task_identity")

NUM_ROUNDS = 6
CRASH_AFTER = 3


STRATEGIES = {
    "fedmr": lambda: FedMR(
        seed=3, fraction_train=0.6, min_available_nodes=1, fraction_evaluate=0.0
    ),
    "fedindep": lambda: FedIndep(
        seed=3, fraction_train=0.6, min_available_nodes=1, fraction_evaluate=0.0
    ),
    "fedmut": lambda: FedMut(
        seed=3, fraction_train=0.6, min_available_nodes=1, fraction_evaluate=0.0, alpha=1.5
    ),
    "fedcross": lambda: FedCross(
        seed=3, fraction_train=0.6, min_available_nodes=1, fraction_evaluate=0.0
    ),
    "fedavg": lambda: FedAvg(fraction_train=0.6, min_available_nodes=1, fraction_evaluate=0.0),
}


def checkpointing_run(strategy, grid, directory, initial, first_round=1, result=None):
    """Run to NUM_ROUNDS, writing a checkpoint after every round."""

    def on_round_end(server_round, arrays, result):
        del arrays
        checkpoints.save_checkpoint(
            directory,
            checkpoints.Checkpoint(
                server_round, type(strategy).__name__, checkpoints.capture_run(strategy, result)
            ),
        )

    return run_rounds(
        strategy,
        grid,
        initial_arrays=initial,
        num_rounds=NUM_ROUNDS,
        start_round=first_round,
        timeout=5,
        train_config=ConfigRecord(),
        result=result,
        on_round_end=on_round_end,
    )


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_resumed_run_ends_with_the_same_pool_as_an_uninterrupted_one(name, initial, tmp_path):
    random.seed(0)
    whole = STRATEGIES[name]()
    whole_result = checkpointing_run(
        whole, CrashingGrid(NODE_IDS, None), tmp_path / "whole", to_arrayrecord(initial)
    )

    random.seed(0)
    crashed = STRATEGIES[name]()
    crash(crashed, tmp_path / "crashed", initial)
    checkpoint = checkpoints.load_checkpoint(tmp_path / "crashed")
    assert checkpoint.server_round == CRASH_AFTER

    random.seed(12345)  # a new process: nothing of the old one survives but the files
    resumed = STRATEGIES[name]()
    restored = checkpoints.restore_run(resumed, checkpoint.state)
    assert sorted(restored.train_metrics_clientapp) == list(range(1, CRASH_AFTER + 1))
    resumed_result = checkpointing_run(
        resumed,
        CrashingGrid(NODE_IDS, None),
        tmp_path / "crashed",
        restored.arrays,
        first_round=CRASH_AFTER + 1,
        result=restored,
    )

    assert sorted(resumed_result.train_metrics_clientapp) == list(range(1, NUM_ROUNDS + 1))
    for server_round in range(1, NUM_ROUNDS + 1):
        mine, theirs = (
            {
                k: v
                for k, v in run.train_metrics_clientapp[server_round].items()
                if k != "pool-update-seconds"
            }
            for run in (resumed_result, whole_result)
        )
        assert mine == theirs
    assert_same_models(to_model(resumed_result.arrays), to_model(whole_result.arrays))
    if isinstance(whole, MultiModelStrategy):
        assert len(resumed.pool) == len(whole.pool) == 3
        for mine, theirs in zip(resumed.pool, whole.pool, strict=True):
            assert_same_models(mine, theirs)
        assert resumed.random.state() == whole.random.state()
    # The final checkpoints agree as well.
    final_whole = checkpoints.load_checkpoint(tmp_path / "whole")
    final_resumed = checkpoints.load_checkpoint(tmp_path / "crashed")
    assert final_whole.server_round == final_resumed.server_round == NUM_ROUNDS
    assert_same_models(final_whole.state["arrays"], final_resumed.state["arrays"])


def crash(strategy, directory, initial) -> None:
    """Run until the server dies in round CRASH_AFTER + 1, checkpointing every round before."""
    with pytest.raises(RuntimeError, match="died"):
        checkpointing_run(
            strategy, CrashingGrid(NODE_IDS, CRASH_AFTER + 1), directory, to_arrayrecord(initial)
        )


def test_without_the_restored_state_the_run_would_differ(initial, tmp_path):
    """The resume test above can fail: skipping the restore changes the pool."""
    whole = STRATEGIES["fedmr"]()
    checkpointing_run(whole, CrashingGrid(NODE_IDS, None), tmp_path / "a", to_arrayrecord(initial))
    crashed = STRATEGIES["fedmr"]()
    crash(crashed, tmp_path / "b", initial)
    checkpoint = checkpoints.load_checkpoint(tmp_path / "b")
    fresh = STRATEGIES["fedmr"]()
    fresh.load_state_dict({**checkpoint.state["strategy"], "rng": fresh.state_dict()["rng"]})
    checkpointing_run(
        fresh,
        CrashingGrid(NODE_IDS, None),
        tmp_path / "b",
        to_arrayrecord(checkpoint.state["arrays"]),
        first_round=CRASH_AFTER + 1,
    )
    assert any(
        not np.array_equal(a["fc1.weight"], b["fc1.weight"])
        for a, b in zip(fresh.pool, whole.pool, strict=True)
    )


def assert_same_models(mine: dict, theirs: dict) -> None:
    assert list(mine) == list(theirs)
    for name in mine:
        assert mine[name].dtype == theirs[name].dtype, name
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


def test_fedmut_checkpoint_holds_the_previous_global_model(initial, tmp_path):
    strategy = STRATEGIES["fedmut"]()
    checkpointing_run(strategy, CrashingGrid(NODE_IDS, None), tmp_path, to_arrayrecord(initial))
    state = checkpoints.load_checkpoint(tmp_path).state["strategy"]
    assert_same_models(state["previous-global"], strategy.previous_global)
    other = STRATEGIES["fedmut"]()
    other.load_state_dict(state)
    assert_same_models(other.previous_global, strategy.previous_global)
    with pytest.raises(ValueError, match="previous-global"):
        other.load_state_dict({k: v for k, v in state.items() if k != "previous-global"})


def test_format_keeps_dtypes_order_and_big_integers(tmp_path):
    state = {
        "model": {
            "z.weight": np.arange(6, dtype=np.float16).reshape(2, 3),
            "a.count": np.array(7, dtype=np.int64),
            "m.mask": np.array([True, False]),
        },
        "rng": np.random.default_rng(5).bit_generator.state,  # 128-bit integers
        "nested": [1, 2.5, None, "x", {"k": np.float32(1.5)}],
    }
    checkpoints.save_checkpoint(tmp_path, checkpoints.Checkpoint(4, "FedMR", state))
    manifest = json.loads((tmp_path / "checkpoint.json").read_text())
    assert manifest["round"] == 4 and manifest["arrays-file"] == "checkpoint-round-00004.npz"
    loaded = checkpoints.load_checkpoint(tmp_path / "checkpoint.json")
    assert (loaded.server_round, loaded.strategy) == (4, "FedMR")
    assert list(loaded.state["model"]) == ["z.weight", "a.count", "m.mask"]
    assert_same_models(loaded.state["model"], state["model"])
    assert loaded.state["rng"] == state["rng"]
    assert loaded.state["nested"] == [1, 2.5, None, "x", {"k": 1.5}]
    with pytest.raises(TypeError, match="cannot checkpoint"):
        checkpoints.save_checkpoint(tmp_path, checkpoints.Checkpoint(5, "FedMR", {"bad": object()}))


def test_a_crash_while_saving_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoints.save_checkpoint(tmp_path, checkpoints.Checkpoint(1, "FedMR", {"w": np.ones(3)}))
    checkpoints.save_checkpoint(
        tmp_path, checkpoints.Checkpoint(2, "FedMR", {"w": np.full(3, 2.0)})
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-round-00002.npz",
        "checkpoint.json",
    ]

    def dies_half_way(handle, **arrays):
        handle.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(checkpoints.np, "savez", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_checkpoint(
            tmp_path, checkpoints.Checkpoint(3, "FedMR", {"w": np.full(3, 3.0)})
        )
    monkeypatch.undo()
    loaded = checkpoints.load_checkpoint(tmp_path)
    assert loaded.server_round == 2
    np.testing.assert_array_equal(loaded.state["w"], np.full(3, 2.0))
    assert not list(tmp_path.glob("*.tmp")), "no temporary files left behind"


def test_missing_or_foreign_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(checkpoints.CheckpointError, match="no checkpoint.json at"):
        checkpoints.load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "checkpoint.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(checkpoints.CheckpointError, match="format 99"):
        checkpoints.load_checkpoint(tmp_path)
    (tmp_path / "checkpoint.json").write_text(
        json.dumps(
            {"format": 1, "round": 1, "strategy": "FedMR", "arrays-file": "gone.npz", "state": {}}
        )
    )
    with pytest.raises(checkpoints.CheckpointError, match="gone.npz., which .* names, is missing"):
        checkpoints.load_checkpoint(tmp_path)


def test_restoring_into_a_strategy_without_state_is_refused(initial):
    state = checkpoints.capture_run(STRATEGIES["fedmr"](), Result(arrays=to_arrayrecord(initial)))
    with pytest.raises(checkpoints.CheckpointError, match="FedAvg cannot load one"):
        checkpoints.restore_run(FedAvg(), state)
    with pytest.raises(checkpoints.CheckpointError, match="does not fit FedMR"):
        checkpoints.restore_run(FedMR(), {**state, "strategy": {"pool": []}})
