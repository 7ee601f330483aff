"""The fedx app end to end: `flwr run` against a SuperLink in simulation mode.

The SuperLink is the tests' own (tests/support/simulation.py, session fixture in
conftest.py), on free 127.0.0.1 ports with a private FLWR_HOME.
"""

import json
import re

import pytest

from fedx.registry import builtin_methods
from tests.support.simulation import run_app

pytestmark = pytest.mark.cost(1)


def test_fedmr_on_digits_writes_metrics_curve_and_model(plain_fedmr_run):
    directory, output = plain_fedmr_run
    assert (directory / "metrics.json").exists(), output[-3000:]
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics["config"]["strategy"] == "fedmr"
    assert metrics["config"]["num-server-rounds"] == 3
    rounds = {row["round"]: row for row in metrics["rounds"]}
    assert sorted(rounds) == [0, 1, 2, 3]
    assert all(0.0 <= rounds[r]["accuracy"] <= 1.0 for r in rounds)
    assert all(rounds[r]["round-seconds"] > 0 for r in (1, 2, 3))
    assert all(rounds[r]["trained-slots"] == 4 for r in (1, 2, 3))
    # Three rounds of five local epochs on digits learn a lot from a random start.
    assert rounds[3]["accuracy"] > rounds[0]["accuracy"] + 0.2
    assert metrics["final"]["round"] == 3
    assert (directory / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (directory / "model.pt").stat().st_size > 100_000
    assert "10 different pool models" not in output  # 4 nodes, so K=4
    assert "4 nodes get 4 different pool models" in output
    # fedx's ClientApp says it reads the packed form: every model went packed.
    assert "4 nodes connected (4 identified, 4 read packed models)" in output
    packed = re.search(r"models went packed in (\d+) messages, standard in 0\b", output)
    assert packed is not None and int(packed.group(1)) >= 3 * 4, output[-3000:]


def test_bad_run_config_stops_the_run_with_one_clear_line(superlink, app, tmp_path):
    output = run_app(superlink, app, f'strategy="fedfoo" output-dir="{tmp_path}"', timeout=120)
    known = ", ".join(m.name for m in builtin_methods())
    assert f"invalid run config strategy='fedfoo': must be one of {known}" in output
    assert not any(tmp_path.iterdir()), "no outputs for a run that never started"
