"""fedx in simulation on a Ray cluster of two hosts (tests/ray_cluster.py).

The head and the worker node each live in a network namespace of their own
with an address of their own; ``flwr run`` runs on the head with
``RAY_ADDRESS`` and ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, as
the README's recipe says, and nothing in the namespaces reaches a package
registry. Both nodes have 2 CPUs and every ClientApp asks for 1, so the 4
ClientApp actors of a run spread over both. The tests share one cluster: a
two-node run compared with the one-node run of tests/test_app_e2e.py, then
the worker node killed and started again in the middle of a run, then a run
asking for resources no node has. A RAY_ADDRESS where nothing listens:
tests/test_ray_backend.py.
"""

import json
import os
import re
import time

import pytest
import torch

from tests.helpers import PLAIN_FEDMR
from tests.ray_cluster import (
    HEAD,
    WORKER,
    FlwrRun,
    HostPair,
    RayCluster,
    can_create_namespaces,
    start_local_superlink,
)

FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"
NODE_COUNTS = re.compile(r"ClientApp messages per Ray node: (.*); at most (\d+) ran at once")


@pytest.fixture(scope="module")
def cluster():
    reason = can_create_namespaces()
    if reason is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"no Ray cluster test: {reason}")
    hosts = HostPair().__enter__()
    cluster = RayCluster(hosts)
    try:
        cluster.start_head()
        cluster.start_worker()
        yield cluster
    finally:
        hosts.close()
        cluster.close()


@pytest.fixture(scope="module")
def run_env(cluster, tmp_path_factory):
    """Environment of `flwr run` on the head; its local SuperLink runs with it."""
    return start_local_superlink(cluster, tmp_path_factory.mktemp("flwr-home"))


def messages_per_node(output: str) -> dict[str, int]:
    """``{"<address> (<node id>)": messages}`` from the backend's last line."""
    match = NODE_COUNTS.search(output)
    assert match, f"no per-node message counts in the output:\n{output[-5000:]}"
    return {
        label: int(count) for label, count in re.findall(r"(\S+ \(\w+\)) (\d+)", match.group(1))
    }


def rounds_of(directory) -> dict[int, dict]:
    metrics = json.loads((directory / "metrics.json").read_text())
    return {row["round"]: row for row in metrics["rounds"]}


def test_two_nodes_train_clients_and_match_one_node(cluster, run_env, plain_fedmr_run, tmp_path):
    run = FlwrRun(
        cluster,
        run_env,
        tmp_path / "flwr-run.log",
        FEDERATION,
        f"num-server-rounds={PLAIN_FEDMR['rounds']} seed={PLAIN_FEDMR['seed']} round-timeout=120.0 "
        f'run-name="two-nodes" output-dir="{tmp_path}"',
    )
    output = run.wait(timeout=300)
    # Slots follow client ids only when every node said which client it is.
    assert "4 nodes connected (4 identified)" in output, output[-5000:]
    head, worker = cluster.hosts.addresses[HEAD], cluster.hosts.addresses[WORKER]
    assert (
        f"on 2 Ray nodes: {head} (2 CPU, 0 GPU: room for 2), {worker} (2 CPU, 0 GPU: room for 2)"
        in output
    )

    # Both hosts trained clients: the backend's count per node, and Ray's own logs on each host.
    counts = messages_per_node(output)
    assert sorted(label.split()[0] for label in counts) == [head, worker], counts
    assert all(count > 0 for count in counts.values()), counts
    # One identification query and one training message per node and round.
    assert sum(counts.values()) == 4 * (PLAIN_FEDMR["rounds"] + 1), counts
    assert cluster.actor_logs(HEAD) and cluster.actor_logs(WORKER)

    # The same seed gives the same run as on one machine: the same global model to the
    # last bit, so the same evaluation. The mean train loss adds the clients' losses in
    # the order their replies came: it may differ in the last bit.
    two_nodes = rounds_of(tmp_path / "two-nodes")
    one_node = rounds_of(plain_fedmr_run[0])
    assert sorted(two_nodes) == sorted(one_node) == list(range(PLAIN_FEDMR["rounds"] + 1))
    for server_round, row in one_node.items():
        mine = two_nodes[server_round]
        assert (mine["accuracy"], mine["loss"], mine.get("trained-slots")) == (
            row["accuracy"],
            row["loss"],
            row.get("trained-slots"),
        ), server_round
        if server_round > 0:
            assert mine["train-loss"] == pytest.approx(row["train-loss"], rel=1e-12)
    model, reference = (
        torch.load(d / "model.pt") for d in (tmp_path / "two-nodes", plain_fedmr_run[0])
    )
    assert model.keys() == reference.keys()
    assert all(torch.equal(model[name], reference[name]) for name in reference)


def test_worker_node_killed_then_back_mid_run(cluster, run_env, tmp_path):
    rounds = 40
    run = FlwrRun(
        cluster,
        run_env,
        tmp_path / "flwr-run.log",
        FEDERATION,
        f"num-server-rounds={rounds} seed=1 local-epochs=1 round-timeout=120.0 "
        f'run-name="lost-node" output-dir="{tmp_path}"',
    )
    # Once all four actors run, the worker node dies in the next round.
    kill_round = int(
        run.wait_for(
            r"(?s)fedx Ray backend: 4 ClientApp actors run after [\d.]+s: 2 on 10\.231\.0\.1 \(\w+\), "
            r"2 on 10\.231\.0\.2 \(\w+\).*?\[ROUND (\d+)/",
            timeout=300,
        ).group(1)
    )
    cluster.kill_worker()
    killed_at = time.monotonic()
    lost = run.wait_for(
        r"fedx Ray backend: lost Ray node 10\.231\.0\.2 \(\w+\): dropped its 2 ClientApp actors[^\n]*",
        60,
    )
    detection = time.monotonic() - killed_at
    cluster.start_worker()
    joined = run.wait_for(
        r"fedx Ray backend: Ray node (10\.231\.0\.2 \(\w+\)) joined; 2 new ClientApp actors "
        r"run after [\d.]+s: 2 on \1[^\n]*",
        120,
    )
    output = run.wait(timeout=300)
    print(
        f"worker killed in round {kill_round}; loss logged after {detection:.1f}s: {lost.group(0)}\n{joined.group(0)}"
    )
    assert "the pool goes on with 2 actors on 1 node" in lost.group(0)
    assert "the pool has 4 actors on 2 nodes" in joined.group(0)

    # Every round completed; every client's reply was accepted from the round after the loss on.
    per_round = rounds_of(tmp_path / "lost-node")
    assert sorted(per_round) == list(range(rounds + 1))
    short = [r for r in range(1, rounds + 1) if per_round[r]["trained-slots"] < 4]
    assert short in ([], [kill_round]), short

    # The worker that came back trained two clients in every round that began after it was in use.
    rejoined_node = joined.group(1)
    began_after = len(re.findall(r"\[ROUND \d+/", output[joined.end() :]))
    assert began_after >= 2, "the run ended too soon after the worker came back"
    counts = messages_per_node(output)
    assert counts.get(rejoined_node, 0) >= 2 * began_after, (counts, began_after)


def test_resources_no_node_has_stop_the_run_with_a_clear_error(cluster, run_env, tmp_path):
    run = FlwrRun(
        cluster,
        run_env,
        tmp_path / "flwr-run.log",
        "num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=0.5",
        f'num-server-rounds=2 output-dir="{tmp_path}"',
    )
    started = time.monotonic()
    output = run.wait(timeout=180)
    assert (
        "no Ray node can host a ClientApp with num_cpus=1, num_gpus=0.5: the cluster has " in output
    )
    assert "10.231.0.1 (2 CPU, 0 GPU: room for 0)" in output
    print(f"resources refused after {time.monotonic() - started:.0f}s")
