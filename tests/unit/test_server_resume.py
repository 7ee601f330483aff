"""The fedx ServerApp's checkpoints and resume-from, in-process against a stand-in grid.

The app's own ``main`` runs (digits, the CNN, central evaluation, outputs)
with deterministic numpy clients; a grid that dies in round 3 plays the
server crash. Real processes: tests/system/test_deployment.py.
"""

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedx.server_app import main
from fedx.strategies import load_checkpoint
from tests.support.helpers import DEFAULTS
from tests.support.standin_grid import NODE_IDS, CrashingGrid

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")

NUM_ROUNDS = 4


def run_config(tmp_path, **overrides) -> dict:
    return {
        **DEFAULTS,
        "num-server-rounds": NUM_ROUNDS,
        "fraction-train": 0.6,  # 3 of 5 nodes: sampling matters
        "min-available-nodes": 3,
        "node-wait-timeout": 5.0,
        "output-dir": str(tmp_path),
        # A resumed run ends as the whole one to the last bit: on a GPU, with these kernels.
        "deterministic": True,
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


def test_a_resumed_run_goes_on_where_its_own_run_config_says(tmp_path, caplog):
    """``device`` says where the run goes on (a GPU run resumed on a CPU machine), not what it is."""
    with pytest.raises(RuntimeError, match="died"):
        run_main(
            CrashingGrid(NODE_IDS, 2),
            run_config(tmp_path, **{"run-name": "moved", "device": "auto"}),
        )
    settings = {"resume-from": str(tmp_path / "moved"), "device": "cpu"}
    with caplog.at_level(logging.INFO):
        run_main(overriding(CrashingGrid(NODE_IDS, None), **settings), {**DEFAULTS, **settings})
    assert "ignoring" not in caplog.text
    metrics = json.loads((tmp_path / "moved" / "metrics.json").read_text())
    assert metrics["config"]["device"] == "cpu"
    assert load_checkpoint(tmp_path / "moved").server_round == NUM_ROUNDS


def overriding(grid, **keys):
    """``grid`` as Flower's: its ``Run`` lists the keys the run config sets (``--run-config``)."""
    grid.run = SimpleNamespace(override_config={k.replace("_", "-"): v for k, v in keys.items()})
    return grid


def assert_same_state(mine, theirs, where="state"):
    """Two checkpoint states are equal: arrays bitwise, everything else by value but timings."""
    if isinstance(theirs, np.ndarray):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), where
    elif isinstance(theirs, dict):
        assert mine.keys() == theirs.keys(), where
        for key in (k for k in theirs if not k.endswith("-seconds")):
            assert_same_state(mine[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert len(mine) == len(theirs), where
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert_same_state(a, b, f"{where}[{index}]")
    else:
        assert mine == theirs, where


def test_resume_from_with_more_rounds_extends_a_finished_or_an_interrupted_run(tmp_path, caplog):
    """Extended to 6 rounds, a FedMut run of 4 (finished, or crashed in round 3) is the run of 6.

    Central evaluation every 2 rounds: the run of 4 evaluates its last round
    as the run of 6 does.
    """
    longer, strategy = NUM_ROUNDS + 2, "fedmut"
    run_main(
        CrashingGrid(NODE_IDS, None),
        run_config(
            tmp_path,
            strategy=strategy,
            **{"num-server-rounds": longer, "run-name": "long", "eval-every": 2},
        ),
    )
    run_main(
        CrashingGrid(NODE_IDS, None),
        run_config(tmp_path, strategy=strategy, **{"run-name": "finished", "eval-every": 2}),
    )
    with pytest.raises(RuntimeError, match="died"):
        run_main(
            CrashingGrid(NODE_IDS, 3),
            run_config(tmp_path, strategy=strategy, **{"run-name": "interrupted", "eval-every": 2}),
        )
    uninterrupted = load_checkpoint(tmp_path / "long")
    for name, done in (("finished", NUM_ROUNDS), ("interrupted", 2)):
        directory = tmp_path / name
        assert load_checkpoint(directory).server_round == done
        caplog.clear()
        settings = {"resume-from": str(directory), "num-server-rounds": longer}
        with caplog.at_level(logging.INFO):
            run_main(overriding(CrashingGrid(NODE_IDS, None), **settings), {**DEFAULTS, **settings})
        assert (
            f"continuing the run of {NUM_ROUNDS} rounds to num-server-rounds={longer}"
            in caplog.text
        )
        assert f"Resuming after round {done}" in caplog.text
        # Only what the run config set is weighed against the checkpoint: nothing ignored.
        assert "ignoring" not in caplog.text
        extended = load_checkpoint(directory)
        assert extended.server_round == longer
        assert extended.state["config"]["num-server-rounds"] == longer
        for part in ("arrays", "strategy", "python-random", "metrics"):
            assert_same_state(extended.state[part], uninterrupted.state[part], part)
        assert rows_without_timings(directory) == rows_without_timings(tmp_path / "long")
        saved, reference = (torch.load(d / "model.pt") for d in (directory, tmp_path / "long"))
        assert all(torch.equal(saved[k], reference[k]) for k in reference)


def test_resume_from_refuses_a_run_config_that_asks_for_another_run(tmp_path, caplog):
    run_main(
        CrashingGrid(NODE_IDS, None),
        run_config(tmp_path, **{"run-name": "mr", "num-server-rounds": 1}),
    )
    before = {p.name: p.read_bytes() for p in (tmp_path / "mr").iterdir()}
    settings = {"resume-from": str(tmp_path / "mr"), "strategy": "fedmut", "num-server-rounds": 3}
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        run_main(overriding(CrashingGrid(NODE_IDS, None), **settings), {**DEFAULTS, **settings})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"fedx: invalid run config resume-from='{tmp_path / 'mr'}': the checkpoint is of a "
        "strategy='fedmr', dataset='digits', model='cnn' run; this run sets strategy='fedmut' "
        "(a checkpoint continues its own run only)"
    ]
    assert {p.name: p.read_bytes() for p in (tmp_path / "mr").iterdir()} == before
