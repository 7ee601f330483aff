"""Damaged checkpoints: resume-from stops with one line naming the file and the damage (issue 17).

One FedMut run on digits (numpy clients, stand-in grid) writes a checkpoint;
each test damages a copy of it as a truncated download, a hand edit or a
mixed-up folder would, resumes from it, and checks the one error line and
that no file was changed.
"""

import json
import logging
import shutil

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedx.server_app import main
from fedx.strategies import load_checkpoint
from tests.support.helpers import DEFAULTS
from tests.support.standin_grid import NODE_IDS, CrashingGrid

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")


def _main(config: dict, crash_in: int | None = None) -> None:
    grid = CrashingGrid(NODE_IDS, crash_in)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A FedMut run of 3 rounds (K = 3) that died in round 3: its checkpoint of round 2, to copy."""
    from flwr.supercore.task_identity import TaskIdentity  # pylint: disable=import-outside-toplevel

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    folder = tmp_path_factory.mktemp("damage")
    try:
        _main(
            {
                **DEFAULTS,
                "strategy": "fedmut",
                "num-server-rounds": 3,
                "fraction-train": 0.6,
                "min-available-nodes": 3,
                "node-wait-timeout": 5.0,
                "output-dir": str(folder),
                "run-name": "run",
            },
            crash_in=3,
        )
    except RuntimeError:
        pass  # the server "died" in round 3
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
    return folder / "run"


class Copy:
    """A copy of the finished run to damage: its checkpoint.json and .npz."""

    def __init__(self, source, destination) -> None:
        shutil.copytree(source, destination)
        self.directory = destination
        self.json = destination / "checkpoint.json"
        self.manifest = json.loads(self.json.read_text())
        self.npz = destination / self.manifest["arrays-file"]

    def edit(self, change) -> None:
        """Change the manifest with ``change(manifest)`` and write it back."""
        change(self.manifest)
        self.json.write_text(json.dumps(self.manifest))

    def edit_arrays(self, where: list, change) -> None:
        """Change the array at path ``where`` of the state with ``change(array)``."""
        node = self.manifest["state"]
        for step in where:
            node = node[step]
        key = node["__ndarray__"]
        with np.load(self.npz) as stored:
            arrays = {k: stored[k] for k in stored.files}
        arrays[key] = change(arrays[key])
        np.savez(self.npz, **arrays)

    def snapshot(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.directory.iterdir())}


@pytest.fixture
def damaged(finished_run, tmp_path):
    return Copy(finished_run, tmp_path / "run")


def _resume_fails(copy: Copy, caplog, **more) -> str:
    """Resume from the copy; the one ERROR line; no file changed."""
    before = copy.snapshot()
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stop:
        _main({**DEFAULTS, "resume-from": str(copy.directory), **more})
    assert stop.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert copy.snapshot() == before, "a refused checkpoint must leave every file as it was"
    return errors[0]


def _first_pool_layer(manifest) -> str:
    return next(iter(manifest["state"]["strategy"]["pool"][1]))


def test_the_undamaged_copy_resumes(damaged):
    assert load_checkpoint(damaged.directory).server_round == 2
    _main({**DEFAULTS, "resume-from": str(damaged.directory)})
    assert load_checkpoint(damaged.directory).server_round == 3


def test_truncated_json(damaged, caplog):
    text = damaged.json.read_text()
    damaged.json.write_text(text[: len(text) // 2])
    line = _resume_fails(damaged, caplog)
    assert f"'{damaged.json}' is not valid JSON (truncated or edited?)" in line


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(round="two"), "'round' must be an integer >= 0, got 'two'"),
        (
            lambda m: m.update({"arrays-file": "../other/checkpoint-round-00002.npz"}),
            "'arrays-file' must name an .npz file beside it, got '../other/",
        ),
        (lambda m: m.update(state=[1, 2]), "'state' must be a JSON object, got list"),
        (
            lambda m: m["state"]["strategy"]["pool"][0].update(
                {"fc1.bias": {"__ndarray__": "a999"}}
            ),
            "refers to array 'a999', which '",
        ),
        (
            lambda m: m["state"]["config"].update({"learning-rate": -1}),
            "holds a damaged run config: invalid run config learning-rate=-1: must be",
        ),
        (lambda m: m["state"].pop("recorder"), "cannot resume from '"),
    ],
    ids=["round", "arrays-file", "state", "array-reference", "config-value", "no-recorder"],
)
def test_edited_json(damaged, caplog, change, message):
    damaged.edit(change)
    line = _resume_fails(damaged, caplog)
    assert message in line and str(damaged.json) in line


def test_truncated_npz(damaged, caplog):
    data = damaged.npz.read_bytes()
    damaged.npz.write_bytes(data[: len(data) // 3])
    line = _resume_fails(damaged, caplog)
    assert f"cannot read '{damaged.npz}' (truncated or damaged?)" in line


def test_missing_npz(damaged, caplog):
    damaged.npz.unlink()
    line = _resume_fails(damaged, caplog)
    assert f"'{damaged.npz}', which '{damaged.json}' names, is missing" in line


def test_npz_array_of_another_shape(damaged, caplog):
    layer = _first_pool_layer(damaged.manifest)
    damaged.edit_arrays(
        ["strategy", "pool", 1, layer], lambda a: np.zeros(a.size + 1, dtype=a.dtype)
    )
    line = _resume_fails(damaged, caplog)
    assert line.startswith(f"fedx: cannot resume from '{damaged.npz}': the strategy's pool[1] ")
    assert f"does not fit model='cnn' on digits: {layer}" in line


def test_npz_with_nan_in_the_global_model(damaged, caplog):
    layer = next(iter(damaged.manifest["state"]["arrays"]))

    def poison(array):
        array = array.copy()
        array.flat[0] = np.nan
        return array

    damaged.edit_arrays(["arrays", layer], poison)
    line = _resume_fails(damaged, caplog)
    assert f"'{damaged.npz}': the global model does not fit model='cnn' on digits" in line
    assert f"{layer}: contains NaN or Inf" in line


def test_checkpoint_of_another_method(damaged, caplog):
    damaged.edit(lambda m: m.update(strategy="FedCross"))
    line = _resume_fails(damaged, caplog)
    assert (
        f"cannot resume from '{damaged.json}': it was written by FedCross, but its run config "
        "names strategy='fedmut' (FedMut)"
    ) in line


def test_checkpoint_of_another_model(damaged, caplog):
    """The run config says cnn-3 (three conv blocks); the arrays are the two-block CNN's."""
    damaged.edit(lambda m: m["state"]["config"].update(model="cnn-3"))
    line = _resume_fails(damaged, caplog)
    assert f"'{damaged.npz}': the global model does not fit model='cnn-3' on digits" in line


def test_a_run_config_of_another_method_is_refused_before_reading_arrays(damaged, caplog):
    """Flower's Run lists the keys a run sets: resume-from with another strategy is refused."""
    from types import SimpleNamespace  # pylint: disable=import-outside-toplevel

    grid = CrashingGrid(NODE_IDS, None)
    grid.run = SimpleNamespace(override_config={"resume-from": "x", "model": "cnn-1"})
    before = damaged.snapshot()
    config = {**DEFAULTS, "resume-from": str(damaged.directory), "model": "cnn-1"}
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        main(grid, Context(1, 0, {}, RecordDict(), config))
    assert "this run sets model='cnn-1' (a checkpoint continues its own run only)" in caplog.text
    assert damaged.snapshot() == before
