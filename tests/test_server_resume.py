"""The fedx ServerApp's checkpoints and resume-from, in-process against a stand-in grid.

The app's own ``main`` runs (digits, the CNN, central evaluation, outputs)
with deterministic numpy clients; a grid that dies in round 3 plays the
server crash. Real processes: tests/test_deployment.py.
"""

import json
import logging

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedx.server_app import main
from fedx.strategies import load_checkpoint
from tests.helpers import DEFAULTS
from tests.standin_grid import NODE_IDS, CrashingGrid

pytestmark = pytest.mark.usefixtures("server_task_identity")

NUM_ROUNDS = 4


def run_config(tmp_path, **overrides) -> dict:
    return {
        **DEFAULTS,
        "num-server-rounds": NUM_ROUNDS,
        "fraction-train": 0.6,  # 3 of 5 nodes: sampling matters
        "min-available-nodes": 3,
        "node-wait-timeout": 5.0,
        "output-dir": str(tmp_path),
        **overrides,
    }


def run_main(grid, config: dict) -> None:
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))


def rows_without_timings(directory) -> list[dict]:
    rows = json.loads((directory / "metrics.json").read_text())["rounds"]
    timing = {"round-seconds", "pool-update-seconds", "checkpoint-seconds"}
    return [{k: v for k, v in row.items() if k not in timing} for row in rows]


@pytest.mark.parametrize("strategy", ["fedmut", "fedavg"])
def test_the_serverapp_resumes_a_crashed_run_to_the_same_end(tmp_path, caplog, strategy):
    run_main(
        CrashingGrid(NODE_IDS, None),
        run_config(tmp_path, strategy=strategy, **{"run-name": "whole"}),
    )
    with pytest.raises(RuntimeError, match="died"):
        run_main(
            CrashingGrid(NODE_IDS, 3),
            run_config(tmp_path, strategy=strategy, **{"run-name": "crashed"}),
        )
    crashed = tmp_path / "crashed"
    assert load_checkpoint(crashed).server_round == 2
    assert [
        row["round"] for row in json.loads((crashed / "metrics.json").read_text())["rounds"]
    ] == [0, 1, 2]

    # A new run with nothing but resume-from: the rest comes from the checkpoint.
    with caplog.at_level(logging.INFO):
        run_main(CrashingGrid(NODE_IDS, None), {**DEFAULTS, "resume-from": str(crashed)})
    assert "resuming with the checkpoint's run config; ignoring" in caplog.text
    assert "num-server-rounds=20" in caplog.text and "Resuming after round 2" in caplog.text

    whole, resumed = load_checkpoint(tmp_path / "whole"), load_checkpoint(crashed)
    assert whole.server_round == resumed.server_round == NUM_ROUNDS
    for name, array in whole.state["arrays"].items():
        np.testing.assert_array_equal(resumed.state["arrays"][name], array)
    if strategy == "fedmut":
        for mine, theirs in zip(
            resumed.state["strategy"]["pool"], whole.state["strategy"]["pool"], strict=True
        ):
            assert all(np.array_equal(mine[n], theirs[n]) for n in theirs)
        assert all(
            np.array_equal(resumed.state["strategy"]["previous-global"][n], a)
            for n, a in whole.state["strategy"]["previous-global"].items()
        )
    assert rows_without_timings(crashed) == rows_without_timings(tmp_path / "whole")
    metrics = json.loads((crashed / "metrics.json").read_text())
    assert metrics["config"]["resume-from"] == str(crashed)
    assert metrics["config"]["num-server-rounds"] == NUM_ROUNDS
    assert (crashed / "model.pt").exists() and (crashed / "accuracy.png").exists()


def test_resume_from_problems_stop_the_run_with_one_line(tmp_path, caplog):
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        run_main(
            CrashingGrid(NODE_IDS, None), {**DEFAULTS, "resume-from": str(tmp_path / "nothing")}
        )
    assert (
        f"invalid run config resume-from='{tmp_path / 'nothing'}': no checkpoint.json at"
        in caplog.text
    )

    run_main(
        CrashingGrid(NODE_IDS, None),
        run_config(tmp_path, **{"num-server-rounds": 1, "run-name": "done"}),
    )
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        run_main(
            CrashingGrid(NODE_IDS, None),
            {**DEFAULTS, "resume-from": str(tmp_path / "done" / "checkpoint.json")},
        )
    assert "that run already did all its num-server-rounds=1" in caplog.text


def test_a_checkpoint_older_than_a_run_config_key_resumes_with_this_runs_value(tmp_path, caplog):
    with pytest.raises(RuntimeError, match="died"):
        run_main(CrashingGrid(NODE_IDS, 3), run_config(tmp_path, **{"run-name": "old"}))
    # Play a checkpoint written before fedx had the LEAF keys.
    manifest_path = tmp_path / "old" / "checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    for key in ("leaf-users", "leaf-min-samples"):
        del manifest["state"]["config"][key]
    manifest_path.write_text(json.dumps(manifest))

    with caplog.at_level(logging.INFO):
        run_main(CrashingGrid(NODE_IDS, None), {**DEFAULTS, "resume-from": str(tmp_path / "old")})
    assert "the checkpoint predates run-config keys leaf-users=0, leaf-min-samples=0" in caplog.text
    assert load_checkpoint(tmp_path / "old").server_round == NUM_ROUNDS
