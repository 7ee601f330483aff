"""A SuperLink and N SuperNodes as processes on this machine, and `flwr run` against them.

:class:`FederationSpec` (:mod:`fedx.deploy.spec`) says what to start;
:class:`LocalFederation` starts it, waits for each process, and stops them
all (:mod:`fedx.deploy.processes`: every process, everything below it, and
whatever still carries the federation's marker). A second signal or a stuck
process does not cut the teardown short (:mod:`fedx.deploy.signals`).
"""

import contextlib
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from fedx.deploy import signals
from fedx.deploy.credentials import supernode_key_paths
from fedx.deploy.processes import (
    FEDERATION_VARIABLE,
    free_port,
    marked_processes,
    running,
    stop_processes,
    wait_for_port,
)
from fedx.deploy.spec import FederationSpec

#: What users of a local federation import from here: the spec, the federation, free ports.
__all__ = ["FederationSpec", "LocalFederation", "free_port", "stop_processes", "wait_for_port"]

NODE_ID_PATTERN = re.compile(r"SuperNode ID: (\d+)")
WARM_READY_PATTERN = re.compile(r"warm ClientApp interpreter \(pid (\d+)\) ready")


@dataclass(frozen=True)
class _Awaited:
    """A number a SuperNode's log will report, and what its absence means."""

    pattern: re.Pattern[str]
    #: The start of the timeout's message; ``{index}`` is the SuperNode.
    missing: str
    #: Whether the SuperNode exiting first fails the wait at once.
    needs_supernode: bool


_NODE_ID = _Awaited(NODE_ID_PATTERN, "SuperNode {index} did not connect", needs_supernode=True)
_WARM_PID = _Awaited(
    WARM_READY_PATTERN,
    "the warm executor of SuperNode {index} was not ready",
    needs_supernode=False,
)


class LocalFederation:
    """Starts, watches and stops the processes of a :class:`FederationSpec`.

    Use it as a context manager: leaving the block stops every process it
    started (and their children), whatever happened inside.
    """

    def __init__(self, spec: FederationSpec) -> None:
        self.spec = spec
        self.superlink: subprocess.Popen | None = None
        self.supernodes: dict[int, subprocess.Popen] = {}
        self.superexecs: dict[int, subprocess.Popen] = {}  # executor="warm"
        #: This federation's value of :data:`FEDERATION_VARIABLE`, in every process it starts.
        self.marker = secrets.token_hex(16)
        self._logs: list[IO] = []
        self._handles: dict[int, psutil.Process] = {}  # by pid, taken as each process starts

    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """The spec's environment with this federation's marker: what its processes get."""
        return {**self.spec.environment(), FEDERATION_VARIABLE: self.marker}

    def _spawn(self, command: list[str], log_name: str, env: dict[str, str]) -> subprocess.Popen:
        self.spec.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.spec.log_dir / log_name, "a", encoding="utf-8")  # pylint: disable=consider-using-with
        self._logs.append(log)
        process = subprocess.Popen(  # pylint: disable=consider-using-with
            command,
            cwd=self.spec.workdir or self.spec.state_dir,
            env={**env, FEDERATION_VARIABLE: self.marker},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stopping it stops its children
        )
        with contextlib.suppress(psutil.Error):  # it may have failed at once
            self._handles[process.pid] = psutil.Process(process.pid)
        return process

    def started(self) -> dict[str, subprocess.Popen]:
        """Every process this federation started and still tracks, by name."""
        processes = {} if self.superlink is None else {"superlink": self.superlink}
        processes.update({f"supernode-{i}": p for i, p in self.supernodes.items()})
        processes.update({f"superexec-{i}": p for i, p in self.superexecs.items()})
        return processes

    def ended(self) -> list[str]:
        """The names (:meth:`started`) of the processes that have ended."""
        return [name for name, process in self.started().items() if process.poll() is not None]

    def start(self, timeout: float = 120.0) -> None:
        """Start the SuperLink, register the SuperNodes' keys, start the SuperNodes."""
        self.start_superlink(timeout)
        if self.spec.auth_keys is not None:
            for index in range(self.spec.num_supernodes):
                self.register_supernode(index)
        for index in range(self.spec.num_supernodes):
            self.start_supernode(index)

    def start_superlink(self, timeout: float = 120.0) -> None:
        """Start the SuperLink and wait until it accepts connections."""
        self.spec.state_dir.mkdir(parents=True, exist_ok=True)
        self.spec.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.spec.flwr_home / "config.toml").write_text(self.spec.config_toml())
        self.superlink = self._spawn(
            self.spec.superlink_command(), "superlink.log", self.spec.superlink_environment()
        )
        host, port = self.spec.control_address.rsplit(":", 1)
        try:
            wait_for_port(host, int(port), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"the SuperLink did not start; see {self.spec.log_dir / 'superlink.log'}"
            ) from None

    def register_supernode(self, index: int) -> int | None:
        """Register SuperNode ``index``'s public key; return its node id.

        ``None`` when the key is registered already (a SuperLink restarted
        on the same database keeps its registrations).

        Raises
        ------
        RuntimeError
            When ``flwr supernode register`` fails otherwise.
        """
        assert self.spec.auth_keys is not None
        _, public = supernode_key_paths(self.spec.auth_keys, index + 1)
        done = self.flwr("supernode", "register", str(public), self.spec.connection, timeout=120)
        output = done.stdout + done.stderr
        if "Public key already in use" in output:
            return None
        match = re.search(r"SuperNode (\d+) registered", output)
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"registering {public} failed:\n{output}")
        return int(match.group(1))

    def start_supernode(self, index: int) -> subprocess.Popen:
        """Start SuperNode ``index`` (from 0); its output goes to ``logs/supernode-<index>.log``.

        With the warm executor its ``fedx-superexec`` starts too, logging to
        the same file; it ends when the SuperNode ends (``--parent-pid``).
        """
        if self.spec.executor == "warm" and self.spec.tls is not None:
            secret = self.spec.superexec_secret(index)
            if not secret.exists():
                secret.write_bytes(secrets.token_bytes(32))
                secret.chmod(0o600)
        log_name = self._supernode_log(index).name
        env = self.spec.supernode_environment()
        process = self._spawn(self.spec.supernode_command(index), log_name, env)
        self.supernodes[index] = process
        if self.spec.executor == "warm":
            self.superexecs[index] = self._spawn(
                self.spec.superexec_command(index, process.pid), log_name, env
            )
        return process

    def wait_for_warm_executor(self, index: int, timeout: float = 300.0) -> int:
        """The pid of SuperNode ``index``'s warm interpreter, once it has imported the app.

        Raises
        ------
        TimeoutError
            When it is not ready within ``timeout`` seconds.
        """
        return self._wait_for_logged(index, _WARM_PID, timeout)

    def node_id(self, index: int, timeout: float = 60.0) -> int:
        """The node id SuperNode ``index`` last reported in its log.

        Raises
        ------
        RuntimeError
            When the SuperNode exited before it connected.
        TimeoutError
            When it has not connected within ``timeout`` seconds.
        """
        return self._wait_for_logged(index, _NODE_ID, timeout)

    def _supernode_log(self, index: int) -> Path:
        """The log SuperNode ``index`` and its warm executor write to."""
        return self.spec.log_dir / f"supernode-{index}.log"

    def _logged(self, index: int, pattern: re.Pattern[str]) -> list[str]:
        """Every number ``pattern`` has found in SuperNode ``index``'s log so far, in order."""
        log = self._supernode_log(index)
        return pattern.findall(log.read_text(errors="replace")) if log.exists() else []

    def _wait_for_logged(self, index: int, awaited: _Awaited, timeout: float) -> int:
        """The last number ``awaited`` finds in SuperNode ``index``'s log, once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self._logged(index, awaited.pattern)
            if found:
                return int(found[-1])
            process = self.supernodes.get(index)
            if awaited.needs_supernode and process is not None and process.poll() is not None:
                raise RuntimeError(f"SuperNode {index} exited; see {self._supernode_log(index)}")
            time.sleep(0.5)
        missing = awaited.missing.format(index=index)
        raise TimeoutError(f"{missing} within {timeout:g}s; see {self._supernode_log(index)}")

    def rejoin_supernode(self, index: int, timeout: float = 180.0) -> int:
        """Start SuperNode ``index`` again until the SuperLink lets it in; return its node id.

        A self-registered SuperNode gets a new node id at once. A registered
        one (authentication) keeps its id and is refused until the SuperLink
        has marked its old connection offline (two missed 30 s heartbeats
        after a crash), so it is retried, as a supervisor would.

        Raises
        ------
        TimeoutError
            When it is not back within ``timeout`` seconds.
        """

        def connections() -> int:
            return len(self._logged(index, NODE_ID_PATTERN))

        before = connections()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.start_supernode(index)
            attempt_ends = min(deadline, time.monotonic() + 30.0)
            while (
                time.monotonic() < attempt_ends
                and process.poll() is None
                and connections() == before
            ):
                time.sleep(0.5)
            if connections() > before:
                return self.node_id(index)
            self._stop([self.supernodes.pop(index)], signal.SIGTERM)
            time.sleep(2.0)
        raise TimeoutError(
            f"SuperNode {index} did not rejoin within {timeout:g}s; see {self._supernode_log(index)}"
        )

    def kill_supernode(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Stop SuperNode ``index`` and its app processes (SIGKILL: a crash)."""
        processes = [self.supernodes.pop(index)]
        if index in self.superexecs:
            processes.append(self.superexecs.pop(index))
        self._stop(processes, sig)

    def flwr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this federation."""
        return subprocess.run(
            [str(self.spec.bin_dir / "flwr"), *args],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop(self) -> None:
        """Stop every process started here, everything below them and everything that carries
        this federation's marker; a second signal meanwhile waits until it is done.

        All at once: each process's own exit (a SuperNode says goodbye to the
        SuperLink, and gives up at once when the SuperLink is gone already; a
        ServerApp reports its run) overlaps the others'.
        """
        with signals.deferred():
            processes = list(self.started().values())
            self.supernodes, self.superexecs, self.superlink = {}, {}, None
            self._stop(processes, signal.SIGTERM)
            stop_processes(marked_processes(self.marker), signal.SIGTERM)
            for log in self._logs:
                log.close()
            self._logs = []

    def _stop(self, processes: list[subprocess.Popen], sig: int) -> None:
        """Stop ``processes`` (started here), their process groups and every process below them."""
        leaders = []
        for process in processes:
            handle = self._handles.pop(process.pid, None)
            if handle is not None and running(handle):
                leaders.append(handle)
        stop_processes(leaders, sig, groups=True)
        for process in processes:  # reap them (a zombie is no longer running)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1)
