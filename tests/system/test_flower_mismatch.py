"""A whole run on a Flower whose code is not the code fedx's changes to it were checked against.

The Flower is a copy of the installed one whose simulation feeder
(``vce_api.add_messages_to_queue``) has one line more, first on the
``PYTHONPATH`` of a simulation SuperLink of the test's own and of everything
it starts. The run is conftest.py's plain FedMR (4 nodes, 3 rounds, seed 3,
deterministic kernels): fedx's ClientApp module asks the installer for the
simulation's changes, which makes none of them. The run must say so once,
run on Flower's own engine parts (the changed feeder among them, fedx's
backend nowhere), and end with the same model, round for round, as the plain
run on fedx's parts.
"""

import os

import pytest

from tests.support.changed_flower import changed_flower
from tests.support.helpers import PLAIN_FEDMR, metrics_rows
from tests.support.simulation import run_app, simulation_superlink

pytestmark = pytest.mark.cost(3)

FEEDER = "flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue"
SAID = "A changed Flower's feeder hands out the messages"


def test_a_run_on_a_changed_flower_runs_flowers_own_engine_with_one_warning_and_the_same_model(
    app, plain_fedmr_run, tmp_path
):
    flower = changed_flower(tmp_path / "flower", FEEDER, f'log(INFO, "{SAID}")')
    path = os.pathsep.join(filter(None, [str(flower), os.environ.get("PYTHONPATH")]))
    outputs = tmp_path / "outputs"
    settings = (
        f"num-server-rounds={PLAIN_FEDMR['rounds']} seed={PLAIN_FEDMR['seed']}"
        " round-timeout=120.0 deterministic=true"
    )
    with simulation_superlink(tmp_path / "flwr-home", PYTHONPATH=path) as env:
        # Flower's own engine parts, on a busy machine: more time than fedx's plain run needs.
        output = run_app(
            env, app, f'{settings} run-name="changed" output-dir="{outputs}"', timeout=900
        )
    warnings = [
        line for line in output.splitlines() if "fedx: Flower's code is not the code" in line
    ]
    assert len(warnings) == 1, output[-4000:]
    print(warnings[0])
    assert f"message_feeder relies on {FEEDER}" in warnings[0]
    assert "flwr 1.41.0, 1.42.0" in warnings[0] and "Flower's own code runs" in warnings[0]
    # Flower's engine parts ran: its (changed) feeder, not fedx's backend.
    assert SAID in output, output[-4000:]
    assert "fedx Ray backend" not in output
    # The same run as on fedx's parts: the same global model every round.
    changed, plain = metrics_rows(outputs / "changed"), metrics_rows(plain_fedmr_run[0])
    assert sorted(changed) == sorted(plain) == list(range(PLAIN_FEDMR["rounds"] + 1))
    for server_round, row in plain.items():
        assert (changed[server_round]["accuracy"], changed[server_round]["loss"]) == (
            row["accuracy"],
            row["loss"],
        ), server_round
    print("accuracy per round:", [changed[r]["accuracy"] for r in sorted(changed)])
