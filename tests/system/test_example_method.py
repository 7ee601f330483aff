"""A method written outside fedx (examples/fedblend), run by name in a simulation.

The example package is installed with pip into a folder of the test's own;
its entry point registers the method for a simulation SuperLink started with
that folder on its path. Its rule and its registration in-process:
tests/unit/test_example_method.py.
"""

import pytest

from tests.support.helpers import REPO, install_example, metrics_rows
from tests.support.simulation import run_app, simulation_superlink

pytestmark = pytest.mark.cost(2)

EXAMPLE = REPO / "examples" / "fedblend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed by pip (entry points included) into a folder of its own."""
    return install_example(EXAMPLE, tmp_path_factory.mktemp("example"))


def test_fedx_runs_it_by_name_in_simulation(installed, app, tmp_path):
    with simulation_superlink(tmp_path / "flwr-home", PYTHONPATH=str(installed)) as env:
        output = run_app(
            env,
            app,
            f'strategy="fedblend" num-server-rounds=3 seed=1 round-timeout=120.0 '
            f'run-name="blend" output-dir="{tmp_path}"',
        )
    directory = tmp_path / "blend"
    assert (directory / "metrics.json").exists(), output[-3000:]
    rows = metrics_rows(directory)
    assert sorted(rows) == [0, 1, 2, 3]
    assert all(rows[r]["trained-slots"] == 4 for r in (1, 2, 3))
    # Three rounds of five local epochs on digits learn a lot from a random start.
    assert rows[3]["accuracy"] > rows[0]["accuracy"] + 0.2, rows
    assert "FedBlend settings" in output and "Own weight w: 0.5" in output
