"""ServerApp start-up checks, in-process: bad config and missing nodes stop the run."""

import logging
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedx.config import ConfigError, RunConfig
from fedx.server_app import main, run_directory, wait_for_nodes

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


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
        run_id=1, node_id=0, node_config={}, state=RecordDict(),
        run_config={**DEFAULTS, **overrides},
    )


def test_wait_for_nodes_gives_up_with_a_clear_message():
    with pytest.raises(ConfigError, match=r"min-available-nodes=5 but only 3 node\(s\) connected after node-wait-timeout=0.5s"):
        wait_for_nodes(NodesOnly(3), minimum=5, timeout=0.5)
    assert wait_for_nodes(NodesOnly(5), minimum=5, timeout=0.5) == 5


@pytest.mark.parametrize(
    "overrides, line",
    [
        ({"min-available-nodes": 9, "node-wait-timeout": 0.5},
         "fedx: min-available-nodes=9 but only 4 node(s) connected after node-wait-timeout=0.5s: "
         "start more SuperNodes or lower min-available-nodes"),
        ({"learning-rate": -0.1}, "fedx: invalid run config learning-rate=-0.1: must be a number in (0, inf)"),
        ({"strategy": "fedcross", "fedcross-alpha": 0.9, "fedcross-alpha-start": 0.95},
         "fedx: strategy='fedcross': alpha_start must be in [0.5, alpha=0.9], got 0.95"),
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
