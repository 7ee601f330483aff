"""A SuperNode killed mid-round, on real Flower 1.41 processes on 127.0.0.1.

The federation is Flower's SuperLink (flower-superlink) and Flower's
executor (a fresh flwr-clientapp per message) under fedx-deploy's
SuperNodes, over TLS, with SuperNodes that register themselves: the killed
one comes back with a new node id at once. (A registered SuperNode keeps
its id but is let back in only once the SuperLink has given up on the dead
connection, up to a minute later.) Everything started is stopped at the end.
"""

import json
import os
import re
import signal

import pytest

from fedx.deploy.credentials import write_tls_certificates
from tests.support.deployment import (
    WIRE_APP,
    count_in_log,
    running,
    spec_on_free_ports,
    start_flwr_run,
    wait_for,
)

pytestmark = pytest.mark.cost(2)

CLIENTAPP_STARTED = r"Start `flwr-clientapp` process"


@pytest.fixture
def federation(tmp_path):
    """TLS, SuperNodes that register themselves (Flower's default), flower-superlink, Flower's executor."""
    tls = write_tls_certificates(tmp_path / "certificates", ["localhost", "127.0.0.1"])
    with running(spec_on_free_ports(3, tmp_path / "state", tls=tls)) as federation:
        yield federation


def test_a_supernode_killed_mid_round_is_dropped_and_a_returning_one_used(federation, tmp_path):
    victim = federation.node_id(2)
    started_before = count_in_log(federation, "supernode-2", CLIENTAPP_STARTED)
    log = tmp_path / "run.log"
    # The round with the dead node waits round-timeout (the SuperLink
    # declares a silent node gone only after two missed 30 s heartbeats).
    # Normal rounds of this app take 8-20 s, even on a busy 2-core machine.
    settings = "num-server-rounds=3 train-delay=1.0 round-timeout=30.0"
    run = start_flwr_run(
        federation, WIRE_APP, f'{settings} result-file="{tmp_path / "result.json"}"', log
    )
    try:
        # Round 2's ClientApp runs on SuperNode 2 (it waits 1 s before replying): kill it.
        wait_for(
            lambda: (
                count_in_log(federation, "supernode-2", CLIENTAPP_STARTED) >= started_before + 2
            ),
            240,
            "round 2 on SuperNode 2",
            interval=0.2,
        )
        federation.kill_supernode(2, signal.SIGKILL)
        back = federation.rejoin_supernode(2, timeout=180)  # self-registered: a new node id
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert (tmp_path / "result.json").exists(), output[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())["strategies"]["fedmr"]
    assert result["rounds"] == [1, 2, 3], output[-4000:]
    assert result["trained-slots"]["1"] == 3
    assert result["trained-slots"]["2"] == 2, output[-4000:]
    # The log names the lost node: no reply within round-timeout, or the
    # SuperLink's "Node Unavailable" answer if it gave up on the node first.
    silent = f"Round 2: no reply from node {victim} " in output
    declared_lost = re.search(rf"Round 2: node {victim} \(slot \d+\) is lost: ", output) is not None
    assert silent or declared_lost, output[-4000:]
    # Later rounds do not wait for it: while the SuperLink still lists it, it
    # is left out ("Leaving out node ..."); once the SuperLink has dropped it,
    # it is not listed at all. Either way round 3 sends it nothing, and the
    # node that came back (new id) fills its place: three slots train.
    assert f"Round 3: no reply from node {victim}" not in output
    assert f"Round 3: node {victim} (slot" not in output
    assert back != victim
    assert result["trained-slots"]["3"] == 3, output[-4000:]
