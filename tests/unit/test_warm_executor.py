"""fedx's warm ClientApp executor (fedx-superexec).

The first tests run the executor itself, with a stand-in task
(tests/support/executor_probe.py) forked from a real warm interpreter that has
imported torch: every task starts clean with the torch threads it was
given, a crashing task loses only itself, no more tasks run at once than
the limit and the others wait their turn.
Then the commands fedx-deploy builds (fedx-superexec, fedx-supernode with a
shorter idle poll). fedx's app on a SuperLink and 3 SuperNodes whose
ClientApps come from fedx-superexec, with TLS on every link, SuperNode
authentication and SuperExec authentication: tests/system/test_deployment.py.
"""

import hashlib
import json
import logging
import math
import os
import signal
import time
from pathlib import Path

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult

from fedx.deploy import superexec, warm_executor
from fedx.deploy.cores import ClientAppCores
from fedx.deploy.credentials import write_tls_certificates
from fedx.deploy.local import FederationSpec
from fedx.deploy.superexec import _parser as superexec_options
from fedx.deploy.warm_executor import WarmExecutor
from tests.support.deployment import deploy_up_faked
from tests.support.executor_probe import probe
from tests.support.helpers import REPO, flags, help_flags

pytestmark = pytest.mark.cost(2)

#: Threads of the module's executor's tasks: not a machine's core count, so not torch's default.
THREADS = 3


def probe_executor(cores: ClientAppCores, **options) -> WarmExecutor:
    """A warm executor whose interpreter imported torch and whose tasks run the probe."""
    return WarmExecutor(
        preload_app="tests.support.executor_probe",
        preload=["torch"],
        task=probe,
        cores=cores,
        **options,
    )


@pytest.fixture(scope="module")
def executor():
    warm = probe_executor(ClientAppCores(THREADS, THREADS, max_tasks=1), object_pull_wait=0.1)
    yield warm
    warm.close()


def spec_for(task_id: int, action: str, path: Path, **overrides) -> ExecutionSpec:
    fields = dict(
        task_type=TaskType.CLIENT_APP,
        runtime_api_address="127.0.0.1:1",
        token=f"{action}:{path}",
        insecure=True,
        root_certificates_path=None,
        runtime_dependency_install=False,
        parent_pid=os.getpid(),
        suppress_output=False,
        task_id=task_id,
    )
    return ExecutionSpec(**{**fields, **overrides})


def run_task(
    executor: WarmExecutor,
    task_id: int,
    action: str,
    directory: Path,
    timeout: float = 120,
    **overrides,
) -> tuple[dict | None, int]:
    """Launch one task (``overrides``: of its spec) and wait for it; what it saw, and its exit code."""
    path = directory / f"task-{task_id}.json"
    assert executor.launch(spec_for(task_id, action, path, **overrides)) == LaunchResult.accepted()
    process = executor._tasks[task_id]  # pylint: disable=protected-access
    process.join(timeout)
    code = process.exitcode
    executor.reconcile()
    assert task_id not in executor.running
    return (json.loads(path.read_text()) if path.exists() else None), code


def test_the_warm_interpreter_imported_the_app_and_torch(executor):
    assert executor.preloaded == ["torch", "tests.support.executor_probe"]
    assert executor.app_package == "tests"
    assert executor.warm_pid != os.getpid()


def test_every_task_starts_clean_from_the_warm_interpreter(executor, tmp_path):
    first, first_code = run_task(executor, 1, "report", tmp_path)
    second, second_code = run_task(executor, 2, "report", tmp_path)
    assert (first_code, second_code) == (0, 0)
    for seen in (first, second):
        assert seen["ppid"] == executor.warm_pid  # forked from the warm interpreter...
        assert seen["torch-loaded-at-start"]  # ...which had imported torch already...
        assert seen["run-clientapp-loaded-at-start"]  # ...and Flower's run_clientapp
        # Its message's objects are asked for again after 20 ms, doubling up to 0.1 s
        # (Flower: after 1, 2, 4 ... s).
        assert seen["object-pulls"] == {"initial_backoff": 0.02, "backoff_cap": 0.1}
        # Its heartbeat every 3.5-4.5 s: it hears within seconds that its SuperNode ended it.
        assert seen["task-heartbeat-interval"] == 10  # Flower's 30: every 17.5-22.5 s
        # The app's own package is imported afresh in the task, with fresh state.
        assert not seen["app-module-at-start"] and seen["imported-in-this-process"]
        assert seen["tasks-before"] == []
        assert seen["sockets"] == 0  # nothing of the warm interpreter's socket, no connection
        # The share of the cores it was given, in torch and for what it starts.
        assert seen["torch-threads"] == THREADS
        assert seen["thread-variables"] == dict.fromkeys(
            ("OMP_NUM_THREADS", "MKL_NUM_THREADS"), "3"
        )
    assert first["pid"] != second["pid"]
    # Task 1 reseeded torch and numpy on its way out; task 2 did not notice.
    # torch, numpy and random start from fresh entropy, as in new interpreters.
    assert first["torch-seed"] != second["torch-seed"] and first["torch"] != second["torch"]
    assert first["numpy"] != second["numpy"]
    assert first["random"] != second["random"]


def install_fab_of(package: Path, flwr_home: Path, changed: str | None = None) -> str:
    """A FAB installed as Flower installs one, holding a copy of ``package``; its hash.

    ``changed``: a file of the copy (relative to ``package``) given another line.
    """
    fab_hash = hashlib.sha256(f"{package}{changed}".encode()).hexdigest()
    copy = flwr_home / "apps" / f"fedx.probe.1.0.0.{fab_hash[:8]}" / package.name
    for source in package.rglob("*.py"):
        if "__pycache__" not in source.parts:
            target = copy / source.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    if changed is not None:
        (copy / changed).write_text((copy / changed).read_text() + "\nCHANGED = True\n")
    return fab_hash


def test_a_task_whose_fab_holds_the_warm_code_keeps_the_warm_modules(
    executor, tmp_path, monkeypatch
):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    same = install_fab_of(REPO / "tests", tmp_path / "flwr-home")
    other = install_fab_of(
        REPO / "tests", tmp_path / "flwr-home", changed="support/executor_probe.py"
    )
    assert executor.keeps_app(same) and not executor.keeps_app(other)
    assert not executor.keeps_app("0" * 64) and not executor.keeps_app(None)  # not installed
    for task_id, fab_hash in ((21, same), (22, same), (23, other)):
        seen, code = run_task(executor, task_id, "report", tmp_path, fab_hash=fab_hash)
        assert code == 0 and seen["ppid"] == executor.warm_pid
        kept = fab_hash == same
        # The FAB's copy of the app is the code the warm interpreter imported: kept, as it
        # was imported (no task's state in it); else imported afresh, from the FAB.
        assert seen["app-module-at-start"] == kept
        assert seen["imported-in-this-process"] != kept
        assert seen["tasks-before"] == []


def test_the_warm_interpreter_runs_no_threads_of_its_own(executor, tmp_path):
    seen, _ = run_task(executor, 3, "report", tmp_path)
    assert seen["warm-threads"] == 1, "the warm interpreter must be single-threaded when it forks"


def test_a_crashing_task_loses_only_itself(executor, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, killed = run_task(executor, 4, "kill", tmp_path)
        _, raised = run_task(executor, 5, "raise", tmp_path)
    assert killed == -9 and raised == 1
    assert "ClientApp task 4 (pid" in caplog.text and "was killed by signal 9" in caplog.text
    assert "ClientApp task 5 (pid" in caplog.text and "exited with code 1" in caplog.text
    after, code = run_task(executor, 6, "report", tmp_path)
    assert code == 0 and after["ppid"] == executor.warm_pid and after["tasks-before"] == []


def test_stopping_stops_the_running_tasks(tmp_path):
    # A task that outlives the SuperExec would run on without anyone collecting it.
    warm = WarmExecutor(preload_app=None, preload=[], task=probe_sleeping)
    try:
        warm.launch(spec_for(7, "report", tmp_path / "unused.json"))
        pid = warm.running[7]
    finally:
        started = time.monotonic()
        warm.close()
    assert time.monotonic() - started < 15
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


def run_as_flowers_superexec(
    executor: WarmExecutor, pending: list[ExecutionSpec], timeout: float = 120
) -> int:
    """Flower's SuperExec loop (``run_superexec``) until every task has ended.

    Each pass reconciles, asks for capacity and claims the oldest pending
    task of a type it may start. Returns the most task processes seen alive
    at once.
    """
    most, deadline = 0, time.monotonic() + timeout
    while (pending or executor.running or executor.queued) and time.monotonic() < deadline:
        executor.reconcile()
        eligible, _ = executor.get_eligible_capacity({TaskType.CLIENT_APP, TaskType.SERVER_APP})
        if pending and pending[0].task_type in eligible:
            assert executor.launch(pending.pop(0)) == LaunchResult.accepted()
        most = max(most, len(executor.running))
        time.sleep(0.02)
    return most


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


@pytest.fixture(scope="module")
def limited():
    """An executor that runs at most 2 tasks at once, each with one torch thread."""
    warm = probe_executor(ClientAppCores(cores=2, threads=1, max_tasks=2))
    yield warm
    warm.close()


def test_no_more_tasks_run_at_once_than_the_limit_and_all_complete(limited, tmp_path):
    # As Flower's SuperExec drives it: it claims a task only while there is room.
    specs = [spec_for(10 + i, "sleep", tmp_path / f"gated-{i}.json") for i in range(5)]
    assert run_as_flowers_superexec(limited, list(specs)) <= 2
    # Launched all at once (a caller that does not ask first): 2 run, 3 wait here.
    rush = [spec_for(20 + i, "sleep", tmp_path / f"rush-{i}.json") for i in range(5)]
    for spec in rush:
        assert limited.launch(spec) == LaunchResult.accepted()
    assert len(limited.running) == 2 and limited.queued == [22, 23, 24]
    eligible, _ = limited.get_eligible_capacity({TaskType.CLIENT_APP, TaskType.SERVER_APP})
    assert eligible == {TaskType.SERVER_APP}  # no ClientApp claimed while tasks wait
    assert run_as_flowers_superexec(limited, []) <= 2
    for spec in specs + rush:  # every task ran, to its end, as the tasks themselves saw it
        seen = json.loads(Path(spec.token.split(":", 1)[1]).read_text())
        assert "ended" in seen and seen["torch-threads"] == 1, spec.task_id
    for group in (specs, rush):
        seen = [json.loads(Path(s.token.split(":", 1)[1]).read_text()) for s in group]
        assert most_at_once([(t["started"], t["ended"]) for t in seen]) <= 2
    limited.wait_for_capacity(TaskType.CLIENT_APP)  # room now: returns at once


def test_a_task_queued_past_its_claim_is_dropped_and_the_queue_goes_on(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(warm_executor, "CLAIM_LAPSES", 2.0)
    warm = probe_executor(ClientAppCores(cores=1, threads=1, max_tasks=1))
    try:
        warm.launch(spec_for(30, "hold", tmp_path / "30.json"))  # runs until killed
        warm.launch(spec_for(31, "report", tmp_path / "31.json"))  # waits past its claim
        time.sleep(2.5)
        warm.launch(spec_for(32, "report", tmp_path / "32.json"))  # waits, claim still good
        assert warm.queued == [31, 32]
        os.kill(warm.running[30], signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="flwr"):
            assert run_as_flowers_superexec(warm, []) == 1
    finally:
        warm.close()
    assert "ClientApp task 31 waited" in caplog.text and "dropped" in caplog.text
    assert "ClientApp task 32 waited" not in caplog.text
    assert not (tmp_path / "31.json").exists()
    assert json.loads((tmp_path / "32.json").read_text())["tasks-before"] == []


def probe_ended(spec: ExecutionSpec) -> bool:
    """Whether a ``sleep`` probe task has written that it ended."""
    path = Path(spec.token.split(":", 1)[1])
    return path.exists() and "ended" in path.read_text()


def test_a_task_waiting_for_input_that_never_comes_holds_up_no_other_task(tmp_path):
    """A task of a run stopped while its SuperNode pulled the task's message waits for that
    input until Flower gives up (2 hours): it must not keep the only slot meanwhile."""
    warm = probe_executor(ClientAppCores(cores=1, threads=1, max_tasks=1))
    try:
        assert (
            warm.launch(spec_for(40, "no-input", tmp_path / "40.json")) == LaunchResult.accepted()
        )
        later = [spec_for(41 + i, "sleep", tmp_path / f"{41 + i}.json") for i in range(3)]
        pending, deadline = list(later), time.monotonic() + 90
        while not all(probe_ended(spec) for spec in later):
            assert time.monotonic() < deadline, (
                f"tasks held up by one waiting for its input: running {sorted(warm.running)}, "
                f"waiting for input {warm.waiting_for_input}, "
                f"not claimed {[spec.task_id for spec in pending]}"
            )
            # As Flower's SuperExec: a task is claimed only while the executor has room.
            warm.reconcile()
            eligible, _ = warm.get_eligible_capacity({TaskType.CLIENT_APP})
            if pending and TaskType.CLIENT_APP in eligible:
                assert warm.launch(pending.pop(0)) == LaunchResult.accepted()
            time.sleep(0.02)
        assert warm.waiting_for_input == [40]  # still waiting, as under Flower's executor
        seen = [json.loads(Path(spec.token.split(":", 1)[1]).read_text()) for spec in later]
        assert most_at_once([(t["started"], t["ended"]) for t in seen]) == 1  # the limit holds
    finally:
        warm.close()


def test_task_limits_follow_the_options_the_environment_and_the_cores(monkeypatch):
    monkeypatch.delenv("FEDX_CLIENTAPP_THREADS", raising=False)
    monkeypatch.delenv("FEDX_CLIENTAPP_MAX_TASKS", raising=False)
    monkeypatch.delenv("FEDX_SUPERNODES_PER_MACHINE", raising=False)
    resolve = ClientAppCores.resolve
    # A SuperNode alone on its machine: every core for one task at a time.
    assert resolve(cores=8) == ClientAppCores(cores=8, threads=8, max_tasks=1)
    # Three on 8 cores: 2 each (8 // 3); one thread each lets 2 run at once.
    assert resolve(cores=8, supernodes=3) == ClientAppCores(cores=2, threads=2, max_tasks=1)
    assert resolve(cores=8, supernodes=3, threads=1).max_tasks == 2
    assert resolve(cores=2, supernodes=3) == ClientAppCores(cores=1, threads=1, max_tasks=1)
    monkeypatch.setenv("FEDX_SUPERNODES_PER_MACHINE", "4")
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "")  # compose's empty default: unset
    assert resolve(cores=8).threads == 2
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "1")
    monkeypatch.setenv("FEDX_CLIENTAPP_MAX_TASKS", "3")
    assert resolve(cores=8) == ClientAppCores(cores=2, threads=1, max_tasks=3)
    assert resolve(cores=8, threads=2, max_tasks=1) == ClientAppCores(2, 2, 1)  # options first
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "many")
    with pytest.raises(ValueError, match="FEDX_CLIENTAPP_THREADS must be a whole number"):
        resolve(cores=8)
    with pytest.raises(ValueError, match="max tasks must be"):
        resolve(cores=8, threads=1, max_tasks=0)
    with pytest.raises(SystemExit, match="fedx-superexec: clientapp threads must be"):
        superexec.main(["--clientapp-threads", "0", "--insecure"])


def probe_sleeping(spec) -> None:
    """A task that takes a long time."""
    del spec
    time.sleep(300)


def test_other_tasks_and_dependency_installation_go_to_flowers_executor(executor, tmp_path):
    launched = []

    class Recorder:
        def launch(self, spec):
            launched.append(spec.task_id)
            return LaunchResult.accepted()

        def close(self):
            pass

    saved, executor._fallback = executor._fallback, Recorder()  # pylint: disable=protected-access
    try:
        executor.launch(spec_for(8, "report", tmp_path / "8.json", task_type=TaskType.SERVER_APP))
        executor.launch(spec_for(9, "report", tmp_path / "9.json", runtime_dependency_install=True))
    finally:
        executor._fallback = saved  # pylint: disable=protected-access
    assert launched == [8, 9] and not executor.running


# ----------------------------------------------------------------------
# The commands: fedx-superexec, fedx-supernode, fedx-deploy up --executor warm
# ----------------------------------------------------------------------


def test_warm_and_fast_poll_commands_use_only_flags_flower_has(tmp_path):
    tls = write_tls_certificates(tmp_path / "certificates")
    for spec in (
        FederationSpec(2, tmp_path, insecure=True, executor="warm", poll_interval=0.5),
        FederationSpec(2, tmp_path, tls=tls, auth_keys=tmp_path / "keys", executor="warm"),
    ):
        for index in range(2):
            node = spec.supernode_command(index)
            backoff = ["--idle-after", "--max-poll-interval"] if spec.poll_interval else []
            ours = ["--poll-interval", *backoff] if spec.poll_interval else []
            assert set(flags(node)) <= help_flags("flower-supernode") | set(ours)
            assert set(ours) <= help_flags("fedx-supernode")
            assert node[node.index("--isolation") + 1] == "process"
            superexec = spec.superexec_command(index, supernode_pid=4242)
            assert set(flags(superexec)) <= help_flags("flower-superexec") | set(backoff)
            assert set(backoff) <= help_flags("fedx-superexec")
            if spec.poll_interval:  # the idle backoff: to Flower's 3 s and 1 s
                assert node[node.index("--idle-after") + 1] == "10"
                assert node[node.index("--max-poll-interval") + 1] == "3"
                assert superexec[superexec.index("--idle-after") + 1] == "10"
                assert superexec[superexec.index("--max-poll-interval") + 1] == "1"
            assert (
                superexec[superexec.index("--runtime-api-address") + 1]
                == f"127.0.0.1:{spec.supernode_ports[index]}"
            )
            assert superexec[superexec.index("--parent-pid") + 1] == "4242"
            if spec.tls is not None:  # TLS and a shared secret on the Runtime API too
                assert node[node.index("--ssl-certfile") + 1] == str(tls.server_cert)
                assert superexec[superexec.index("--root-certificates") + 1] == str(tls.ca_cert)
                secret = str(spec.superexec_secret(index))
                assert node[node.index("--superexec-auth-secret-file") + 1] == secret
                assert superexec[superexec.index("--superexec-auth-secret-file") + 1] == secret
    light = FederationSpec(2, tmp_path, insecure=True, executor="warm", warm_preload=())
    options = superexec_options().parse_known_args(light.superexec_command(0, 4242)[1:])[0]
    assert (options.preload_app, options.preload) == ("", [""])  # a numpy app's: nothing ahead
    fast = FederationSpec(2, tmp_path, insecure=True, poll_interval=0.5, superlink="fedx")
    assert Path(fast.supernode_command(0)[0]).name == "fedx-supernode"
    superlink = fast.superlink_command()  # fedx-superlink takes flower-superlink's flags
    assert Path(superlink[0]).name == "fedx-superlink"
    assert set(flags(superlink)) <= help_flags("flower-superlink")
    assert help_flags("fedx-superlink") == help_flags("flower-superlink")
    assert Path(FederationSpec(2, tmp_path, insecure=True).superlink_command()[0]).name == (
        "flower-superlink"
    )
    # The SuperNodes' SuperExecs poll for tasks every 0.5 s; the SuperLink's keeps Flower's 1 s.
    assert fast.supernode_environment()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.5"
    assert "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in fast.superlink_environment()
    fixed = FederationSpec(2, tmp_path, insecure=True, poll_interval=0.5, idle_after=math.inf)
    node = fixed.supernode_command(0)
    assert node[node.index("--idle-after") + 1] == "inf"
    with pytest.raises(ValueError, match="ceiling"):
        FederationSpec(2, tmp_path, insecure=True, poll_interval=0.5, max_poll_interval=0.2)
    assert (  # without options too: on it a stopped run leaves nothing behind
        Path(FederationSpec(2, tmp_path, insecure=True).supernode_command(0)[0]).name
        == "fedx-supernode"
    )
    with pytest.raises(ValueError, match="need Flower 1.41"):
        FederationSpec(
            2,
            tmp_path,
            insecure=True,
            executor="warm",
            transport="grpc",
            fleet_port=1,
            control_port=2,
        )
    with pytest.raises(ValueError, match="poll_interval must be in"):
        FederationSpec(2, tmp_path, insecure=True, poll_interval=5.0)
    with pytest.raises(ValueError, match='superlink must be "flower" or "fedx"'):
        FederationSpec(2, tmp_path, insecure=True, superlink="fast")


def test_deploy_up_starts_warm_supernodes_with_short_polls(tmp_path, monkeypatch, capsys):
    code, started = deploy_up_faked(
        monkeypatch,
        tmp_path,
        "--insecure --supernodes 2 --executor warm --poll-interval 0.5 --superlink fedx --run app",
    )
    assert code == 0
    assert (started["spec"].executor, started["spec"].poll_interval) == ("warm", 0.5)
    assert started["spec"].superlink == "fedx"
    assert started["warm"] == [0, 1]  # the app runs once the warm interpreters are ready
    assert "warm ClientApp executor" in capsys.readouterr().out
