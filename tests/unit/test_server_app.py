"""ServerApp start-up checks, in-process: bad config and missing nodes stop the run."""

import json
import logging

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from fedx.config import ConfigError, RunConfig
from fedx.server.building import require_nodes
from fedx.server.resume import run_directory
from fedx.server_app import main
from tests.support.helpers import DEFAULTS
from tests.support.standin_grid import real_clients_grid


class NodesOnly:
    """A grid that only reports connected nodes; the run must stop before sending."""

    def __init__(self, count: int) -> None:
        self.count = count

    def get_node_ids(self):
        return list(range(1, self.count + 1))

    def send_and_receive(self, *args, **kwargs):
        raise AssertionError("the run should have stopped before any round")


def _context(**overrides) -> Context:
    return Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={**DEFAULTS, **overrides},
    )


def test_require_nodes_gives_up_with_a_clear_message():
    with pytest.raises(
        ConfigError,
        match=r"min-available-nodes=5 but only 3 node\(s\) connected after node-wait-timeout=0.5s",
    ):
        require_nodes(NodesOnly(3), minimum=5, timeout=0.5)
    assert require_nodes(NodesOnly(5), minimum=5, timeout=0.5) == 5


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            {"min-available-nodes": 9, "node-wait-timeout": 0.5},
            "fedx: min-available-nodes=9 but only 4 node(s) connected after node-wait-timeout=0.5s: "
            "start more SuperNodes or lower min-available-nodes",
        ),
        (
            {"learning-rate": -0.1},
            "fedx: invalid run config learning-rate=-0.1: must be a number in (0, inf)",
        ),
        (
            {"strategy": "fedcross", "fedcross-alpha": 0.9, "fedcross-alpha-start": 0.95},
            "fedx: invalid run config fedcross-alpha-start=0.95: must be a number in [0.5, 0.9]",
        ),
    ],
)
def test_main_stops_with_one_error_line(overrides, line, caplog, tmp_path):
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(SystemExit) as stop:
        main(NodesOnly(4), _context(**overrides, **{"output-dir": str(tmp_path)}))
    assert stop.value.code == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [line]
    assert not any(tmp_path.iterdir())


def test_run_directory_is_absolute_and_named():
    cfg = RunConfig.from_mapping({**DEFAULTS, "run-name": "abc", "output-dir": "out"})
    assert run_directory(cfg).is_absolute() and run_directory(cfg).parts[-2:] == ("out", "abc")
    unnamed = run_directory(RunConfig.from_mapping(DEFAULTS)).name
    assert unnamed.startswith("fedmr-digits-cnn-")


@pytest.mark.usefixtures("server_task_identity")
@pytest.mark.parametrize("strategy", ["fedmr", "fedavg"])
def test_same_seed_same_run_whatever_the_node_ids(tmp_path, strategy):
    """Simulated nodes get random ids each run; the results must not depend on them.

    Deterministic kernels: on a GPU two runs of one seed are equal only with them.
    """
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = []
    try:
        for attempt, rng_seed in enumerate((1, 2)):
            node_ids = [int(x) for x in np.random.default_rng(rng_seed).integers(1, 2**62, size=4)]
            config = {
                **DEFAULTS,
                "strategy": strategy,
                "num-server-rounds": 2,
                "local-epochs": 1,
                "fraction-train": 0.5,
                "deterministic": True,
                "run-name": f"run{attempt}",
                "output-dir": str(tmp_path),
            }
            main(real_clients_grid(node_ids, config), _context(**config))
            runs.append(json.loads((tmp_path / f"run{attempt}" / "metrics.json").read_text()))
    finally:
        torch.set_num_threads(torch_threads)
    first, second = (
        [(r["round"], r["accuracy"], r.get("train-loss")) for r in run["rounds"]] for run in runs
    )
    assert first == second
    assert first[-1][1] > first[0][1], "two rounds on digits should learn something"
    models = [torch.load(tmp_path / f"run{i}" / "model.pt") for i in (0, 1)]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
