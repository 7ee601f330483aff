"""A run stopped on fedx's SuperNodes leaves nothing behind: real processes on 127.0.0.1.

One federation for the module: a SuperLink and two ``fedx-supernode``
processes, each with fedx's warm executor, 0.1 s polls, the numpy test app
(tests/wire_app). One run of it is stopped (``flwr stop``) while one node
receives its message, whose content the ServerApp never sends (as a
ServerApp killed while it pushes a round leaves it), and the other node's
ClientApp trains (a long ``train-delay``). Then:

- the message of the stopped run is dropped and the task started for it
  ends within 30 s, though its input never comes;
- the ClientApp that trained for the stopped run ends within 30 s;
- a task of the stopped run that is lost (its process killed, as when its
  network is cut) does not shift the node's replies: the next run's round
  gets every node's reply.

On Flower's SuperNode as shipped each of them fails: ``FEDX_STOPPED_RUNS=flower
pytest tests/system/test_stopped_runs.py`` (the SuperNodes inherit the variable:
fedx.flower.stopped_runs) shows the waiting task and the trained one still
running after 30 s, and the next run's round without a reply from the node
whose stopped run's task was lost (its replies go out one message late).
"""

import json
import os
import re
import signal
import time

import psutil
import pytest

from tests.support.deployment import (
    WIRE_APP,
    flwr_submit,
    run_app,
    running,
    spec_on_free_ports,
    wait_for,
)

pytestmark = pytest.mark.cost(1)

NODES = 2
#: How soon a task of a stopped run must end.
ENDS_WITHIN = 30.0
#: How long a SuperNode waits for a heartbeat of a task before it answers the
#: task's message with an error (Flower's HEARTBEAT_PATIENCE x 30 s).
TASK_PATIENCE = 60.0


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """Two fedx-supernodes with warm executors that import nothing ahead (a numpy app)."""
    spec = spec_on_free_ports(
        NODES,
        tmp_path_factory.mktemp("stopped") / "state",
        insecure=True,
        executor="warm",
        poll_interval=0.1,
        superlink="fedx",
        superlink_database="memory",
        warm_preload=(),
    )
    with running(spec) as started:
        warm = [started.wait_for_warm_executor(index) for index in range(NODES)]
        yield started, warm


def tasks_of(warm_pid: int) -> list[psutil.Process]:
    """The ClientApp task processes a warm interpreter has forked and that still run."""
    try:
        children = psutil.Process(warm_pid).children()
    except psutil.Error:
        return []
    return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def supernode_log(federation, index: int) -> str:
    return (federation.spec.log_dir / f"supernode-{index}.log").read_text(errors="replace")


def run_lines(log: str, run_id: int) -> list[str]:
    """The lines a SuperNode logged under ``[RUN run_id]`` (each message's block)."""
    lines, current = [], None
    for line in log.splitlines():
        if found := re.search(r"\[RUN (\d+)", line):
            current = int(found.group(1))
        elif current == run_id:
            lines.append(line)
    return lines


@pytest.fixture(scope="module")
def stopped(federation):
    """A run stopped while node ``stalled`` receives its message and node ``trained`` trains.

    Returns what was seen: the run id, which node is which, and for each
    node the seconds from the stop until its task ended (``None``: still
    running after :data:`ENDS_WITHIN`), with the task processes left.
    """
    started, warm = federation
    run_id = flwr_submit(started, WIRE_APP, f"stall=true min-nodes={NODES} train-delay=600.0")

    def roles() -> dict | None:
        """Which node received its message completely (it trains) and which did not, once both have a task."""
        if not all(tasks_of(pid) for pid in warm):
            return None
        received = [
            "Received successfully" in "\n".join(run_lines(supernode_log(started, i), run_id))
            for i in range(NODES)
        ]
        if sorted(received) != [False, True]:
            return None
        return {"trained": received.index(True), "stalled": received.index(False)}

    found = wait_for(roles, 120, "a task on each node, one of them training", interval=0.2)
    time.sleep(1.0)  # the training task into its train-delay, the other asking for its input
    tasks = [tasks_of(pid) for pid in warm]
    done = started.flwr("stop", str(run_id), started.spec.connection, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    stopped_at = time.monotonic()
    ended: dict[int, float | None] = dict.fromkeys(range(NODES))
    while time.monotonic() < stopped_at + ENDS_WITHIN and None in ended.values():
        for index in range(NODES):
            if ended[index] is None and not any(p.is_running() for p in tasks[index]):
                ended[index] = time.monotonic() - stopped_at
        time.sleep(0.2)
    left = {i: [p for p in tasks[i] if p.is_running()] for i in range(NODES)}
    return {"run": run_id, **found, "ended": ended, "left": left}


#: What fedx-supernode logs when it drops a stopped run's message and ends its task.
DROPPED = r"fedx: message \w+ of run \d+ dropped \(the run was stopped\); its ClientApp task"


def task_end(federation, stopped, role: str) -> tuple[float | None, list, str]:
    """Node ``stopped[role]``: seconds from the stop until its task ended (``None``: not within
    :data:`ENDS_WITHIN`), its task processes still running, and its SuperNode's log of the run."""
    started, _ = federation
    node = stopped[role]
    log = "\n".join(run_lines(supernode_log(started, node), stopped["run"]))
    return stopped["ended"][node], stopped["left"][node], log


def test_a_message_of_a_stopped_run_is_dropped_and_its_task_ends(federation, stopped):
    ended, left, log = task_end(federation, stopped, "stalled")
    assert ended is not None, (
        f"the waiting task still runs {ENDS_WITHIN:g} s after the stop: {left}"
    )
    assert re.search(DROPPED, log), log


def test_a_clientapp_of_a_stopped_run_ends_within_30_s(federation, stopped):
    ended, left, log = task_end(federation, stopped, "trained")
    assert ended is not None, (
        f"the training task still runs {ENDS_WITHIN:g} s after the stop: {left}"
    )
    assert re.search(DROPPED, log), log


def test_after_a_lost_task_of_a_stopped_run_replies_go_to_their_own_messages(
    federation, stopped, tmp_path
):
    started, _ = federation
    lost = [p for processes in stopped["left"].values() for p in processes if p.is_running()]
    for process in lost:  # as a task whose network is cut: it never reports again
        os.kill(process.pid, signal.SIGKILL)
    if lost:  # the SuperNode gives up on a silent task after its patience
        time.sleep(TASK_PATIENCE + 5.0)
    result = tmp_path / "result.json"
    output = run_app(
        started,
        WIRE_APP,
        f'num-server-rounds=1 min-nodes={NODES} round-timeout=30.0 result-file="{result}"',
    )
    assert result.exists(), output[-4000:]
    slots = json.loads(result.read_text())["strategies"]["fedmr"]["trained-slots"]
    assert slots == {"1": NODES}, output[-4000:]  # every node's reply, in its own round
