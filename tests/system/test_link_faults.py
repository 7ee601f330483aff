"""A SuperNode cut off in the middle of a model transfer over a slow, distant link, on real processes.

The hosts of benchmarks/links.py (benchmarks/fedx_bench/slow_links.py): the SuperLink on a
host of its own, three SuperNodes on sites of their own, 20 Mbit/s links
and 10 ms each way through the relay; fedx's fast setup (the warm executor,
0.1 s polls, the SuperLink in memory). The numpy test app (tests/wire_app)
runs FedMR on a 2 MB model (its softmax regression and a 2 MB array),
packed as fedx's ServerApp sends it to fedx's ClientApp (one array per
model, the nodes having said in their answer to the query that they read
it). In
round 2 the relay cuts the third site's link once half a model has gone
down it, so the SuperNode's object pulls break in the middle of the model
and its new connections hang, as over a broken path. The round goes on
without it (a log line names the node), the link comes back, and round 3
samples the node again: it trains. The ServerApp crashes after round 3's
checkpoint (not sooner: a crash loses the log lines it has not streamed
yet), and a new run resumes it with the same pool: round 4 on all three.

Every wait is for an event (a log line, the relay's report), never a
sleep: the cut is armed once the third site has its round-1 model, while
its ClientApp holds the round open for 3 s, so it falls into round 2's
transfer whatever the machine's load.
"""

import hashlib
import json
import os
import signal
import subprocess

import numpy as np
import pytest

from fedx.strategies import load_checkpoint
from tests.support.deployment import WIRE_APP, start_flwr_run, wait_for
from tests.support.helpers import skip_unless_ci

from fedx_bench import slow_links as links

pytestmark = pytest.mark.cost(3)

RATE_MBIT, DELAY = 20.0, 0.01
VICTIM = 2
MODEL_BYTES = 2_000_000
#: The cut falls in the middle of a model.
HALF_A_MODEL = MODEL_BYTES // 2
#: Seconds a round waits for replies: the cut round lasts this long. The
#: others take a few seconds; the cut's held requests wait up to 30 s.
ROUND_TIMEOUT = 25.0


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """Three SuperNodes on slow links, all up, their warm executors ready."""
    problem = links.missing()
    if problem is not None:
        skip_unless_ci(f"no slow-link test: {problem}")
    base = tmp_path_factory.mktemp("link-faults")
    with links.Wan(3, RATE_MBIT, DELAY) as wan:
        spec = links.linked_spec(
            wan,
            base / "state",
            workdir=base,
            executor="warm",
            poll_interval=0.1,
            superlink_database="memory",
            extra_environment={"OMP_NUM_THREADS": "1"},
        )
        with links.LinkedFederation(spec, wan) as federation:
            federation.start()
            for index in range(spec.num_supernodes):
                federation.node_id(index, timeout=180)
                federation.wait_for_warm_executor(index, timeout=300)
            yield federation


def flwr_run(federation, run_config: str, log) -> subprocess.Popen:
    """``flwr run --stream`` of the wire app on the SuperLink's host, its output to ``log``."""
    with federation.wan.inside(links.LINK):
        return start_flwr_run(federation, WIRE_APP, run_config, log)


def finish(run: subprocess.Popen, timeout: float) -> None:
    """Wait for ``run`` to end; kill it (and its group) if it does not."""
    try:
        run.wait(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def trains_received(log: str) -> int:
    """Training messages a SuperNode's log says it received whole (the ServerApp's identity
    query, asked first, is received too)."""
    return log.count("Received successfully") - log.count("Receiving: query message")


def fingerprint(model: dict) -> str:
    """The wire app's fingerprint of a model (names and bytes)."""
    digest = hashlib.sha256()
    for name, array in model.items():
        digest.update(name.encode() + np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def test_a_supernode_cut_off_mid_model_is_dropped_then_sampled_again_and_the_run_resumes(
    federation, tmp_path
):
    wan, spec = federation.wan, federation.spec
    site, victim = links.site(VICTIM), federation.node_id(VICTIM)
    node_log = spec.log_dir / f"supernode-{VICTIM}.log"
    settings = (
        f"payload-bytes={MODEL_BYTES} num-server-rounds=4 round-timeout={ROUND_TIMEOUT:g} "
        f'unresponsive-cooldown=0 train-delays="1:{VICTIM}=3" '
        f'checkpoint-dir="{tmp_path / "checkpoints"}" wire="packed"'
    )
    crashed_log = tmp_path / "crashed.log"
    run = flwr_run(federation, f"{settings} crash-after-round=3", crashed_log)
    try:
        # Round 1's model is on the site; its ClientApp holds round 1 open for
        # 3 s, so the next model down this link is round 2's.
        wait_for(
            lambda: trains_received(node_log.read_text(errors="replace")) >= 1,
            300,
            "round 1's model on the third site",
            interval=0.1,
        )
        armed = wan.relay.cut(site, after_bytes=HALF_A_MODEL)
        cut = wan.relay.wait("cut", site, timeout=300)
        # Round 2's message was announced to the node, its model not all there.
        log = node_log.read_text(errors="replace")
        assert log.count("Receiving: train message") == 2, log[-3000:]
        assert trains_received(log) == 1, log[-3000:]
        assert cut["down"] - armed["down"] >= HALF_A_MODEL
        # The round goes on without the node, and says so.
        wait_for(
            lambda: f"Round 2: no reply from node {victim} " in crashed_log.read_text(),
            ROUND_TIMEOUT + 300,
            "round 2 to go on without the third node",
        )
        wan.relay.restore(site)
        finish(run, 600)  # the ServerApp crashes right after round 3's checkpoint
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    crashed = crashed_log.read_text(errors="replace")
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "fedmr")
    assert checkpoint.server_round == 3, crashed[-4000:]
    pool = [fingerprint(model) for model in checkpoint.state["strategy"]["pool"]]
    # Round 3 sampled the node again (no cooldown) and it replied: 3 slots trained, below.
    assert f"Round 3: no reply from node {victim}" not in crashed

    resumed_log = tmp_path / "resumed.log"
    result_file = tmp_path / "resumed.json"
    finish(
        flwr_run(federation, f'{settings} resume=true result-file="{result_file}"', resumed_log),
        600,
    )
    resumed = resumed_log.read_text(errors="replace")
    assert result_file.exists(), resumed[-4000:]
    summary = json.loads(result_file.read_text())
    result = summary["strategies"]["fedmr"]
    # The resumed ServerApp asked the nodes again; every model went packed.
    assert summary["wire"] == {"packed-nodes": 3, "sent-packed": 3, "sent-standard": 0}
    assert "Resuming after round 3" in resumed and "[ROUND 3/4]" not in resumed
    assert result["restored-pool"] == pool
    assert result["rounds"] == [1, 2, 3, 4]
    assert result["trained-slots"] == {"1": 3, "2": 2, "3": 3, "4": 3}, (crashed + resumed)[-4000:]
