"""FedMR with secure recombination end to end: `flwr run` on digits in simulation.

The clients' trained models wait in Flower's node state while they swap
layers through the ServerApp; the run must reach the accuracy of plain FedMR
at the same seed and number of rounds. Uses the tests' own SuperLink
and the shared plain FedMR run (conftest.py).
"""

import re

import pytest

from tests.support.helpers import PLAIN_FEDMR, metrics_rows
from tests.support.simulation import run_app

pytestmark = pytest.mark.cost(2)

ROUNDS = PLAIN_FEDMR["rounds"]  # compared with the shared plain FedMR run


def test_secure_recombination_learns_as_well_as_plain_fedmr(
    superlink, app, plain_fedmr_run, tmp_path
):
    plain_directory, plain_output = plain_fedmr_run
    assert (plain_directory / "metrics.json").exists(), plain_output[-3000:]
    common = (
        f'num-server-rounds={ROUNDS} seed={PLAIN_FEDMR["seed"]} output-dir="{tmp_path}" '
        "round-timeout=120.0"
    )
    output = run_app(superlink, app, f'{common} run-name="secure" secure-recombination=true')
    assert (tmp_path / "secure" / "metrics.json").exists(), output[-3000:]

    with_exchange, without = metrics_rows(tmp_path / "secure"), metrics_rows(plain_directory)
    # Every client took part in the exchange, every round; it uploads unless
    # (rarely) every layer it sent came back, when it refuses to hand the
    # server its own trained model and says so.
    refusals = output.count("does not upload its own model")
    assert (
        sum(with_exchange[r]["trained-slots"] for r in range(1, ROUNDS + 1)) + refusals
        == 4 * ROUNDS
    )
    assert refusals <= 1
    for r in range(1, ROUNDS + 1):
        assert with_exchange[r]["secure-exchanges"] == 7  # (send, return) x r_s=3, upload
        assert with_exchange[r]["secure-layer-bytes"] > 0
        assert with_exchange[r]["secure-aborted"] == 0
        assert "secure-exchanges" not in without[r]
    assert "secure recombination relayed" in output and "dropped out" not in output
    # The training messages went packed; the exchanges carry ciphertext only.
    assert re.search(r"models went packed in [1-9]\d* messages, standard in 0\b", output)
    # Swapping layers keeps every layer's sum, so round 1's global model (the
    # mean of the trained models) is the same with and without the exchange.
    assert abs(with_exchange[1]["accuracy"] - without[1]["accuracy"]) <= 0.01
    final_secure, final_plain = with_exchange[ROUNDS]["accuracy"], without[ROUNDS]["accuracy"]
    print(f"accuracy after {ROUNDS} rounds: secure {final_secure:.4f}, plain {final_plain:.4f}")
    assert final_secure > 0.5 and final_plain > 0.5  # ten classes: chance is 0.1
    assert abs(final_secure - final_plain) <= 0.1
