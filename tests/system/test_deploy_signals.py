"""``fedx-deploy up`` signalled at any time stops whole, and stops nothing that is not its own.

Real processes on 127.0.0.1: ``fedx-deploy up --insecure --supernodes 2``
started as a user would, then SIGINT, SIGTERM or SIGHUP at start-up (while
it waits for its SuperNodes to connect), mid-run (``--run`` of the numpy
test app, while a round trains) and under ``nohup ... &`` (started by a
shell in the background: SIGINT and SIGHUP arrive ignored; SIGHUP stays
ignored, as nohup asks, and SIGINT or SIGTERM stops it). After each, no
process of the federation is left, and a shell that exported the same
``FLWR_HOME`` (a user's, beside it) is still running. Each case prints the
seconds from the signal to ``fedx-deploy``'s exit (``pytest -s``): the table
of docs/results-record.md ("``fedx-deploy up``, signalled") is their output.

The teardown itself, on sleeping processes: a second signal while it runs
waits until it is done; a process that cannot be waited for does not cut it
short; it stops what carries its federation's marker (a ServerApp started
just before the stop), and neither a process that only shares its
``FLWR_HOME`` nor another federation's.
"""

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from tests.support.deployment import WIRE_APP, wait_for
from tests.support.helpers import BIN

pytestmark = pytest.mark.cost(5)

#: The test app's run: long enough to be mid-run when the signal comes.
LONG_RUN = 'strategies="fedmr" num-server-rounds=200 min-nodes=2 train-delay=0.3 round-timeout=60.0'
#: A stop is done well within this (two teardown phases of 15 s each at the very worst).
STOP_WITHIN = 60.0


@dataclass
class Deployment:
    """A ``fedx-deploy up`` of the test's own, and a user's shell with the same ``FLWR_HOME``."""

    pid: int
    state: Path
    shell: subprocess.Popen
    popen: subprocess.Popen | None = None

    @property
    def home(self) -> str:
        return str((self.state / "flwr-home").resolve())

    def log(self, name: str) -> str:
        path = self.state / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def federation(self) -> list[psutil.Process]:
        """The processes of the federation: every one with its FLWR_HOME but the user's shell."""
        shell = {self.shell.pid, *(p.pid for p in _children(self.shell.pid))}
        found = []
        for process in psutil.process_iter():
            try:
                if process.pid not in shell and process.environ().get("FLWR_HOME") == self.home:
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def stop_by(self, sig: int) -> float:
        """Send ``sig``; seconds until ``fedx-deploy`` has exited."""
        started = time.monotonic()
        os.kill(self.pid, sig)
        deadline = started + STOP_WITHIN
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return time.monotonic() - started

    def clean_up(self) -> None:
        """Whatever a failed case left: fedx-deploy, its federation, the shell."""
        leftovers = self.federation()
        for process in leftovers + [p for p in [_handle(self.pid)] if p is not None]:
            process.kill()
        psutil.wait_procs(leftovers, timeout=10)
        self.shell.kill()
        self.shell.wait(timeout=10)
        if self.popen is not None:
            self.popen.kill()
            self.popen.wait(timeout=10)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _handle(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def up_command(state: Path, run: bool) -> list[str]:
    command = [
        str(BIN / "fedx-deploy"),
        "up",
        "--insecure",
        "--supernodes",
        "2",
        "--port",
        str(free_port()),
        "--supernode-port",
        str(free_port()),
        "--superlink-database",
        "memory",
        "--state-dir",
        str(state),
    ]
    if run:
        command += ["--run", str(WIRE_APP), "--run-config", LONG_RUN]
    return command


def start(tmp_path: Path, *, run: bool = False, nohup: bool = False) -> Deployment:
    """``fedx-deploy up`` in the foreground of a session of its own, or as ``nohup ... &``."""
    state = tmp_path / "state"
    env = {**os.environ, "FLWR_HOME": str((state / "flwr-home").resolve())}
    # A user's shell that exported the federation's FLWR_HOME (to run `flwr` against it).
    shell = subprocess.Popen(["bash", "-c", "sleep 600"], env=env, start_new_session=True)
    command = shlex.join(up_command(state, run))
    if nohup:
        # A non-interactive shell starts a background job with SIGINT ignored; nohup ignores SIGHUP.
        launcher = subprocess.run(
            ["bash", "-c", f"nohup {command} > {tmp_path / 'up.log'} 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            start_new_session=True,
        )
        return Deployment(int(launcher.stdout.strip()), state, shell)
    with open(tmp_path / "up.log", "w", encoding="utf-8") as out:
        popen = subprocess.Popen(
            up_command(state, run), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Deployment(popen.pid, state, shell, popen)


def assert_stopped_whole(deployment: Deployment, seconds: float, case: str) -> None:
    assert not deployment.running(), f"{case}: fedx-deploy still runs {seconds:.1f} s after"
    left = [f"{p.pid} {' '.join(p.cmdline()[:3])}" for p in deployment.federation()]
    assert left == [], f"{case}: left running: {left}"
    assert deployment.shell.poll() is None, f"{case}: the user's shell was stopped"
    print(f"\n{case}: stopped in {seconds:.2f} s, nothing left, the shell with FLWR_HOME runs")


SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP}


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_at_start_up_stops_what_was_started(tmp_path, name):
    deployment = start(tmp_path)
    try:
        # The SuperLink is up and SuperNodes start: fedx-deploy waits for their node ids.
        wait_for(lambda: deployment.log("supernode-0"), 120, "the first SuperNode to start", 0.05)
        assert deployment.federation(), "nothing started yet"
        seconds = deployment.stop_by(SIGNALS[name])
        assert_stopped_whole(deployment, seconds, f"SIG{name} at start-up")
    finally:
        deployment.clean_up()


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_mid_run_stops_the_run_and_the_federation(tmp_path, name):
    deployment = start(tmp_path, run=True)
    try:
        wait_for(
            lambda: deployment.log("supernode-1").count("Received successfully") >= 2,
            300,
            "round 2 on SuperNode 1",
            0.2,
        )
        seconds = deployment.stop_by(SIGNALS[name])
        assert_stopped_whole(deployment, seconds, f"SIG{name} mid-run (--run)")
    finally:
        deployment.clean_up()


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_under_nohup_a_signal_stops_everything_and_a_hangup_does_not(tmp_path, name):
    """SIGINT arrives ignored under ``nohup ... &``; it stops everything, as SIGTERM does."""
    deployment = start(tmp_path, nohup=True)
    try:
        wait_for(
            lambda: "Ctrl-C" in (tmp_path / "up.log").read_text(errors="replace"),
            180,
            "the federation to be up",
        )
        # nohup: a hangup (the terminal closing) is ignored on purpose.
        os.kill(deployment.pid, signal.SIGHUP)
        time.sleep(3.0)
        assert deployment.running() and len(deployment.federation()) >= 3
        seconds = deployment.stop_by(SIGNALS[name])
        assert_stopped_whole(deployment, seconds, f"SIG{name} under nohup ... & (idle)")
    finally:
        deployment.clean_up()


def test_sigterm_while_idle_stops_everything(tmp_path):
    deployment = start(tmp_path)
    try:
        wait_for(
            lambda: "Ctrl-C" in (tmp_path / "up.log").read_text(errors="replace"),
            180,
            "the federation to be up",
        )
        seconds = deployment.stop_by(signal.SIGTERM)
        assert_stopped_whole(deployment, seconds, "SIGTERM while idle")
    finally:
        deployment.clean_up()


# ----------------------------------------------------------------------
# The teardown itself: a second signal, a process that cannot be waited for, strangers
# ----------------------------------------------------------------------

#: A process that sleeps; with ``{on_term}`` run when it gets SIGTERM.
SLEEPER = (
    "import os, signal, sys, time\n"
    "def on_term(*_):\n"
    "    {on_term}\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def sleepers(federation: LocalFederation, count: int, on_term: str = "sys.exit(0)") -> list:
    """``count`` sleeping processes started as the federation starts its SuperNodes."""
    started = []
    for index in range(count):
        code = SLEEPER.format(on_term=on_term if index == 0 else "sys.exit(0)")
        process = federation._spawn(  # pylint: disable=protected-access
            [sys.executable, "-c", code], f"sleeper-{index}.log", federation.spec.environment()
        )
        federation.supernodes[index] = process
        started.append(process)
    for index in range(count):
        log = federation.spec.log_dir / f"sleeper-{index}.log"
        wait_for(lambda log=log: "ready" in log.read_text(), 60, f"sleeper {index}", 0.05)
    return started


def test_a_second_signal_during_the_teardown_waits_until_it_is_done(tmp_path):
    federation = LocalFederation(FederationSpec(3, tmp_path / "state", insecure=True))
    # The first process's exit sends its parent (this test) a SIGINT: a second Ctrl-C.
    processes = sleepers(federation, 3, on_term="os.kill(os.getppid(), signal.SIGINT); sys.exit(0)")
    with pytest.raises(KeyboardInterrupt):  # raised once the teardown is done
        federation.stop()
    assert all(process.poll() is not None for process in processes)


def test_a_process_that_cannot_be_waited_for_does_not_cut_the_teardown_short(tmp_path, monkeypatch):
    federation = LocalFederation(FederationSpec(3, tmp_path / "state", insecure=True))
    processes = sleepers(federation, 3)
    stuck = processes[0].pid
    wait = subprocess.Popen.wait

    def waiting(self, timeout=None):
        if self.pid == stuck:  # as a process in uninterruptible sleep: it never ends in time
            raise subprocess.TimeoutExpired(self.args, timeout)
        return wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", waiting)
    federation.stop()
    monkeypatch.undo()
    assert all(process.poll() is not None for process in processes)


def test_the_teardown_stops_what_carries_its_marker_and_nothing_that_only_shares_flwr_home(
    tmp_path,
):
    mine = LocalFederation(FederationSpec(1, tmp_path / "mine", insecure=True))
    other = LocalFederation(FederationSpec(1, tmp_path / "other", insecure=True))
    sleepers(mine, 1)
    home = {**mine.spec.environment()}  # FLWR_HOME of `mine`, no marker: a user's shell
    code = SLEEPER.format(on_term="sys.exit(0)")

    def started(env: dict) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
        )
        assert process.stdout.readline().strip() == "ready"
        return process

    # A ServerApp the SuperLink started just before the stop: below nothing of ours any more.
    orphan = started({**home, "FEDX_FEDERATION": getattr(mine, "marker", "")})
    user = started(home)  # the same FLWR_HOME, exported by a user's shell
    neighbour = started(
        {**other.spec.environment(), "FEDX_FEDERATION": getattr(other, "marker", "")}
    )
    try:
        mine.stop()
        assert orphan.wait(timeout=30) is not None
        assert user.poll() is None and neighbour.poll() is None
        assert mine.marker != other.marker  # one per federation
    finally:
        for process in (orphan, user, neighbour):
            process.kill()
            process.wait(timeout=10)
            process.stdout.close()
        other.stop()
