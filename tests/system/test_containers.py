"""fedx's compose deployment started by a real container engine: podman with podman-compose.

One federation for the module, from docker-compose.yml as
docs/deployment/containers.md runs it: certificates naming the service hosts (made by the fedx-deploy tool
container), a SuperLink, three SuperNodes, the ServerApp's SuperExec and one
ClientApp SuperExec per SuperNode, each in its own container with its own
address on the project network; runs are submitted by the flwr tool
container. On it:

- the default FedMR job on digits leaves its results in ./outputs on the host;
- the ServerApp container killed mid-run, and the run continued with
  resume-from, ends with the same final pool as the uninterrupted run;
- a SuperNode container cut off the network for a round and one killed
  mid-round (the numpy test app, fast rounds): every round completes, the
  log names the lost nodes, the reconnected and the restarted ones are
  sampled again.

Everything started is removed at the end. The images are built once and
reused while the files they are built from are unchanged
(tests/support/containers.py); the first build takes 10-20 minutes. The auth variant
and bad input: tests/system/test_container_checks.py, in a module of its own so
that another worker runs it while this one's rounds wait.
"""

import json
import os
import re
import subprocess
from datetime import UTC, datetime

import numpy as np
import pytest
import yaml

from fedx.deploy.cores import usable_cores
from tests.support.containers import (
    HOSTS,
    KILLED,
    REPO,
    STOP_GRACE,
    SUPERNODES,
    ComposeProject,
    certs_arguments,
    skip_module_without_containers,
)
from tests.support.deployment import wait_for

skip_module_without_containers()

pytestmark = pytest.mark.cost(11)

SERVICES = [
    "superlink",
    "superexec-serverapp",
    *SUPERNODES,
    "superexec-clientapp-1",
    "superexec-clientapp-2",
    "superexec-clientapp-3",
]
RECEIVED = "Receiving: train message"
# A SuperNode's reply has reached the SuperLink (the line after "Sending: train message").
SENT = "Sent successfully"
# The default job, short: 2 rounds of 3 local epochs, all 3 SuperNodes (the
# default's 5 epochs took 40 s of round 1 on 2 cores; 1 epoch left the accuracy
# at 0.22 after round 2, short of the 0.2 more than round 0 the test asks).
JOB = "num-server-rounds=2 min-available-nodes=3 local-epochs=3"
# What fedx-superexec, the ClientApp executor of docker-compose.yml, logs for every message.
CLIENTAPP_FORKED = r"ClientApp task \d+ forked from the warm interpreter"


def make_certificates(project: ComposeProject, hosts=HOSTS) -> None:
    """What docs/deployment/containers.md does: `compose run --rm fedx-deploy certs --out certificates --host ...`."""
    done = project.run_tool("fedx-deploy", *certs_arguments(hosts), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def federation(images, container_workdir):
    del images
    project = ComposeProject(container_workdir / "federation", f"fedxtest{os.getpid()}")
    project.prepare()
    try:
        make_certificates(project)
        project.compose("up", "-d", timeout=600)
        wait_for(
            lambda: all(project.node_id(n) for n in SUPERNODES), 300, "three SuperNodes to connect"
        )
        yield project
    finally:
        # docs/deployment/containers.md's `down`, after the tests below stopped, killed and
        # restarted containers: it must leave nothing.
        left = project.down()
    assert left == [] and project.leftovers() == []


def flwr_run(project: ComposeProject, *args: str, timeout: float = 900) -> str:
    """``compose run --rm flwr run ...`` to the end; returns what it printed."""
    done = project.run_tool("flwr", "run", *args, timeout=timeout)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def reference(federation):
    """The default job in containers, never interrupted: outputs/reference."""
    return flwr_run(federation, ".", "--stream", "--run-config", f'{JOB} run-name="reference"')


def test_the_default_job_runs_in_containers_and_writes_outputs_on_the_host(federation, reference):
    directory = federation.directory / "outputs" / "reference"
    assert (directory / "metrics.json").exists(), reference[-4000:]
    metrics = json.loads((directory / "metrics.json").read_text())
    rounds = {row["round"]: row for row in metrics["rounds"]}
    assert sorted(rounds) == [0, 1, 2]
    assert rounds[1]["trained-slots"] == rounds[2]["trained-slots"] == 3
    assert rounds[2]["accuracy"] > rounds[0]["accuracy"] + 0.2, rounds
    assert (directory / "checkpoint.json").exists() and (directory / "model.pt").exists()
    assert (directory / "metrics.json").stat().st_uid == 49999  # written in the container
    # Each part in its own container, each container with its own address.
    addresses = {service: federation.addresses(service) for service in SERVICES}
    assert all(len(found) == 1 for found in addresses.values()), addresses
    assert len({found[0] for found in addresses.values()}) == len(SERVICES), addresses
    # The ServerApp ran in superexec-serverapp: /app/outputs is that container's mount.
    assert "outputs in /app/outputs/reference" in reference, reference[-4000:]
    # The three SuperNodes' ClientApps share the host's cores, which every container sees.
    share = max(1, usable_cores() // len(SUPERNODES))
    for index in (1, 2, 3):  # the ClientApps ran beside their SuperNode, not in it
        executor = f"superexec-clientapp-{index}"
        forked = federation.count_in_log(executor, CLIENTAPP_FORKED)
        assert forked >= 2
        assert "ClientApp task" not in federation.logs(f"supernode-{index}")
        assert f"{share} torch thread(s) per ClientApp" in federation.logs(executor)
        # One process per message: no task was handed out again because its process
        # started late (with Flower's executor these tests once saw 23-25 at once).
        assert forked == federation.count_in_log(f"supernode-{index}", "Receiving: ")


def since(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_supernode_containers_cut_off_or_killed_are_dropped_and_sampled_again(federation):
    """Round 2: once supernode-2 and supernode-3 have received their message,
    supernode-2 is cut off the network and supernode-3 is killed and started
    again (a new node id). When the round gives up on them, supernode-2 is
    reconnected. The later rounds leave both out for the cooldown, then
    sample the reconnected and the restarted node again: some round after
    the faults is trained by all three live nodes.
    """
    # A failed check keeps every container's log (the folder is named in the failure).
    with federation.logs_on_failure():
        cut, killed = federation.container("supernode-2"), federation.container("supernode-3")
        cut_id, killed_id = federation.node_id("supernode-2"), federation.node_id("supernode-3")
        start = datetime.now(UTC)
        log = federation.directory / "faults.log"

        def received(service: str, after: datetime = start, what: str = RECEIVED) -> int:
            """Train messages of this run that ``service`` received (with ``what=SENT``: replies sent).

            A SuperNode logs the run before each message.
            """
            started = re.search(r"Successfully started run (\d+)", log.read_text(errors="replace"))
            if started is None:
                return 0
            done = federation.podman(
                "logs", "--since", since(after), federation.container(service), check=False
            )
            run, count = None, 0
            for line in (done.stdout + done.stderr).splitlines():
                if found := re.search(r"\[RUN (\d+)\]", line):
                    run = found.group(1)
                elif what in line and run == started.group(1):
                    count += 1
            return count

        # A reply takes train-delay, a fork of the warm ClientApp interpreter and
        # up to 3 s of the SuperNode's poll. In round 2, supernode-1 replies at
        # once and the two nodes to strike wait 20 s: the faults come after the
        # healthy reply is in the SuperLink and before the others' replies, so
        # neither the machine's load nor the network changes (a disconnect, a
        # container's start) decide which replies round 2 gets. Only round 2
        # lasts the whole round timeout (40 s). The cooldown outlasts Flower's
        # heartbeat patience (a silent node stays listed for up to 60 s after its
        # last heartbeat, sent every 24 s): by its end the killed node's old id
        # is no longer listed, and the cut-off node is reachable again (Flower's
        # retries, backing off up to 20 s, reconnected it within 12 s of the
        # network here) or answered at once as unavailable. 12 rounds give the
        # reconnected node more than a minute after round 2 to train again.
        settings = (
            "num-server-rounds=12 min-nodes=3 round-timeout=40.0 unresponsive-cooldown=30.0 "
            'train-delay=5.0 train-delays="2:0=0,2:1=20,2:2=20" '
            'result-file="/app/outputs/faults.json"'
        )
        command = [
            *federation.compose_command(),
            "--profile",
            "tools",
            "run",
            "--rm",
            "-T",
            "flwr",
            "run",
            "tests/wire_app",
            "--stream",
            "--run-config",
            settings,
        ]
        with open(log, "w", encoding="utf-8") as out:
            run = subprocess.Popen(
                command,
                cwd=federation.directory,
                env=federation.environment,  # pylint: disable=consider-using-with
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(
                lambda: (
                    received("supernode-1", what=SENT) >= 2
                    and received("supernode-2") >= 2
                    and received("supernode-3") >= 2
                ),
                300,
                "supernode-1's reply of round 2, and round 2 on supernode-2 and supernode-3",
                interval=0.3,
            )
            federation.podman("network", "disconnect", federation.network, cut)
            federation.podman("kill", "--signal", "KILL", killed)
            wait_for(
                lambda: federation.state("supernode-3") != "running", 60, "supernode-3 to stop"
            )
            restarted_at = datetime.now(UTC)
            federation.podman("start", killed)
            wait_for(
                lambda: f"no reply from node {cut_id}" in log.read_text(),
                120,
                "round 2 to give up on supernode-2",
            )
            reconnected_at = datetime.now(UTC)
            federation.podman(
                "network", "connect", "--alias", "supernode-2", federation.network, cut
            )
            run.wait(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(timeout=30)
                federation.remove_tool_containers("flwr")  # killing podman-compose leaves it
        output = log.read_text(errors="replace")
        # What a failure shows: the ServerApp's warnings and cooldowns, then the log's end.
        notable = [
            line for line in output.splitlines() if "WARNING" in line or "Leaving out" in line
        ]
        shown = "\n".join(notable)[-3000:] + "\n...\n" + output[-2500:]
        result_file = federation.directory / "outputs" / "faults.json"
        assert result_file.exists(), shown
        result = json.loads(result_file.read_text())["strategies"]["fedmr"]
        assert result["rounds"] == list(range(1, 13)), shown
        slots = {int(round_): count for round_, count in result["trained-slots"].items()}
        # Round 2 lost both nodes, and the log names them.
        assert slots[1] == 3 and slots[2] == 1, slots
        assert f"Round 2: no reply from node {cut_id} " in output, shown
        assert (
            f"Round 2: no reply from node {killed_id} " in output
            or f"Round 2: node {killed_id} (slot" in output
        ), shown
        assert f"Leaving out node {cut_id}: no reply in round 2" in output
        # Reconnected, supernode-2 kept its id and was sampled again.
        assert federation.node_id("supernode-2") == cut_id
        assert received("supernode-2", after=reconnected_at) >= 1, shown
        # Restarted, supernode-3 came back with a new id and was sampled.
        back_id = federation.node_id("supernode-3")
        assert back_id not in (None, killed_id)
        assert received("supernode-3", after=restarted_at) >= 1, shown
        # A round after the faults was trained by all three live nodes: the
        # reconnected and the restarted ones replied, not just received.
        assert max(slots[r] for r in range(3, 13)) == 3, slots


# The ServerApp is killed right after round 1's checkpoint, often while it
# pushes round 2's model: each SuperNode has then received that message and
# created its task, but the message's objects never come. Flower 1.41's
# SuperNode left both when the run was stopped (the stop ends its pull with
# a BaseException that skips the clean-up): the ClientApp forked for the
# task asked for the objects until Flower gave up after 2 hours, and once
# such a task was lost (the network cut of the fault test) the SuperNode
# pushed every reply one message late (seen here: the reconnected node
# never replied in time again). The compose file's SuperNodes are
# fedx-supernode, which drops the message and ends its task when the run is
# stopped (fedx.flower.stopped_runs; with processes: tests/system/test_stopped_runs.py).
# A task waiting for its input holds no slot of the warm executor's either
# (fedx.flower.task_input).
def test_a_killed_serverapp_container_resumes_with_resume_from_to_the_same_pool(
    federation, reference
):
    outputs = federation.directory / "outputs"
    done = federation.run_tool(
        "flwr", "run", ".", "--format", "json", "--run-config", f'{JOB} run-name="interrupted"'
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = json.loads(done.stdout)["run-id"]
    checkpoint = outputs / "interrupted" / "checkpoint.json"

    def checkpointed_round() -> int:
        try:
            return json.loads(checkpoint.read_text())["round"]
        except (OSError, ValueError, KeyError):
            return 0

    wait_for(lambda: checkpointed_round() >= 1, 600, "the checkpoint of round 1", interval=0.2)
    server = federation.container("superexec-serverapp")
    federation.podman("kill", "--signal", "KILL", server)
    assert checkpointed_round() == 1, "the ServerApp must die before finishing the run"
    wait_for(
        lambda: federation.state("superexec-serverapp") != "running", 60, "the container to stop"
    )
    federation.podman("start", server)
    # The dead ServerApp's run is stopped, as a user would: its messages to
    # the SuperNodes are dropped instead of keeping them busy for later runs.
    stopped = federation.run_tool("flwr", "stop", str(run_id))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr

    resumed = flwr_run(
        federation,
        ".",
        "--stream",
        "--run-config",
        'resume-from="outputs/interrupted"',
    )
    assert checkpointed_round() == 2, resumed[-4000:]
    assert "[ROUND 2/2]" in resumed and "[ROUND 1/2]" not in resumed, resumed[-4000:]
    final = [
        np.load(outputs / run / "checkpoint-round-00002.npz")
        for run in ("reference", "interrupted")
    ]
    assert sorted(final[0].files) == sorted(final[1].files) and len(final[0].files) > 8
    for name in final[0].files:  # the pool of 3 models and the global model, bit for bit
        np.testing.assert_array_equal(final[0][name], final[1][name], err_msg=name)


# The last test of the module: it stops the federation. Flower's SuperLink and SuperNode
# handle no SIGTERM, and as a container's PID 1 they never got it (the kernel drops a
# signal PID 1 has no handler for): `stop` and `down` waited out the grace period and
# killed them. Under the compose file's init every container ends on SIGTERM, the
# ServerApp's too after the test above killed and restarted it.
def test_every_container_stops_on_sigterm_within_its_grace_period(federation):
    stopped = federation.stop_each()
    # Every service `up` starts (all but the tools' profile): the SuperLink, 3 SuperNodes,
    # the ServerApp's SuperExec and 3 ClientApps' SuperExecs.
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    up = [name for name, service in services.items() if "tools" not in service.get("profiles", [])]
    assert set(stopped) == {federation.container(name) for name in up}, stopped
    late = {
        name: (round(seconds, 1), code)
        for name, (seconds, code) in stopped.items()
        if code == KILLED or seconds >= STOP_GRACE
    }
    assert late == {}, f"killed after the grace period (seconds, exit code): {late}"
