"""A SuperLink and N SuperNodes as processes on this machine, and `flwr run` against them.

Flower 1.41 serves the SuperLink's Fleet API (SuperNodes), Control API (the
``flwr`` CLI) and Runtime API (the SuperExec that runs ServerApps) over
HTTP(S) on one address, ``--host``/``--port``. Flower up to 1.36 serves the
Fleet API over gRPC (``--fleet-api-address``, default port 9092) and the
Control API over gRPC (``--control-api-address``, 9093), with only the
Runtime API on ``--host``/``--port``. :class:`FederationSpec` writes the
commands for either (``transport="http"`` or ``"grpc"``); the rest is the
same: each SuperNode gets ``--node-config "partition-id=<i>
num-partitions=<N>"`` and a Runtime API port of its own, and ``flwr`` finds
the SuperLink through ``$FLWR_HOME/config.toml``.

Every process starts in its own process group, so stopping it also stops
the SuperExec and app processes it started. :class:`LocalFederation` tracks
each process it starts as a :class:`psutil.Process` (a pid that ends and is
used again by someone else is never signalled), gives each the federation's
own marker in its environment (:data:`FEDERATION_VARIABLE`, unique per
federation), and when it stops, stops those processes, everything below
them, and any process that still carries its marker (a ServerApp the
SuperLink started just before the stop, no longer below anything of ours):
never a process because it shares the federation's ``FLWR_HOME`` (a user's
shell or notebook that exported it). A second signal or a stuck process
does not cut the teardown short (:mod:`fedx.deploy.signals`).

The SuperNodes share this machine's cores: each one's ClientApps get
``cores / N`` torch threads (at least 1) and the ServerApp every core
(:mod:`fedx.deploy.cores`: ``clientapp_threads``, else
``FEDX_CLIENTAPP_THREADS``, else the share); without it torch gives every
ClientApp process one thread per core, and N of them fight over the same
cores.
"""

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import psutil

from fedx.deploy import signals
from fedx.deploy.cores import (
    SUPERNODES_VARIABLE,
    THREADS_VARIABLE,
    ClientAppCores,
    serverapp_threads,
    thread_environment,
)
from fedx.deploy.credentials import TlsFiles, supernode_key_paths
from fedx.flower import (
    IDLE_AFTER,
    SUPEREXEC_TASK_POLL,
    SUPERNODE_IDLE_WAIT,
    IdleBackoff,
    objects_in_flight,
)

Transport = Literal["http", "grpc"]
Executor = Literal["flower", "warm"]
Database = Literal["file", "memory"]
SuperLinkProgram = Literal["flower", "fedx"]
#: Where the SuperLink listens unless told (address, HTTP(S) port), and the
#: Runtime API port of SuperNode 0 (SuperNode i: this + i).
DEFAULT_HOST, DEFAULT_PORT, FIRST_SUPERNODE_PORT = "127.0.0.1", 8000, 9094
#: The variable whose value marks every process of one federation (its own random value).
FEDERATION_VARIABLE = "FEDX_FEDERATION"
#: Seconds a stopped process has between SIGTERM and SIGKILL.
STOP_GRACE = 15.0
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Wait until something accepts connections on ``host:port``.

    Raises
    ------
    TimeoutError
        When nothing does within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g}s")


# pylint: disable=too-many-instance-attributes
@dataclass
class FederationSpec:
    """What to start: addresses, security and where state and logs go.

    Parameters
    ----------
    num_supernodes : int
        N; SuperNode i (from 0) gets ``partition-id=i num-partitions=N``.
    state_dir : Path
        Receives ``logs/``, the SuperLink database and ``flwr-home/config.toml``.
    host : str
        Address the SuperLink listens on and is reached at.
    port : int
        The SuperLink's HTTP(S) port (Runtime API; in 1.41 also Fleet and
        Control API).
    supernode_ports : list[int]
        Runtime API port of each SuperNode (its ClientApps connect there);
        empty: :data:`FIRST_SUPERNODE_PORT` and the ports after it.
    tls : TlsFiles, optional
        Serve the SuperLink over TLS with these files; ``None`` is plain
        text and must be asked for with ``insecure=True``.
    insecure : bool
        Explicitly run without TLS.
    auth_keys : Path, optional
        Directory with ``supernode-<i>.key``/``.pub`` (from 1): turns on
        SuperNode authentication and registers the public keys. Needs TLS.
    transport : {"http", "grpc"}
        ``"http"`` for Flower >= 1.37, ``"grpc"`` for Flower <= 1.36.
    fleet_port, control_port : int, optional
        The gRPC Fleet and Control API ports (``transport="grpc"`` only).
    bin_dir : Path
        Where ``flower-superlink``, ``flower-supernode`` and ``flwr`` are.
    install_app_dependencies : bool
        Let the SuperLink install each app's dependencies with ``uv`` into a
        fresh environment (Flower's default). Off: apps run in the
        environment Flower is installed in.
    connection : str
        Name of the SuperLink connection in ``config.toml``.
    workdir : Path, optional
        Working directory of the processes (default: ``state_dir``). The
        ServerApp runs there, so a relative ``output-dir`` is relative to it.
    simulation : bool
        Start the SuperLink in simulation mode: each ``flwr run`` then runs
        in Flower's Ray-backed simulation with the SuperNodes that its
        ``--federation-config`` asks for, and ``num_supernodes`` must be 0.
    executor : {"flower", "warm"}
        How SuperNodes run ClientApps: ``"flower"``, Flower's default (the
        SuperNode starts a fresh ``flwr-clientapp`` process per message);
        ``"warm"``, fedx's (each SuperNode runs with ``--isolation process``
        next to a ``fedx-superexec`` that forks every ClientApp from a warm
        interpreter, see :mod:`fedx.deploy.superexec`). With TLS, the
        SuperNode's Runtime API is served over TLS too and the SuperExec
        authenticates with a shared secret (``superexec-<i>.secret``).
    poll_interval : float, optional
        Seconds an idle SuperNode waits between two pulls of the SuperLink
        after a message (Flower: 3; ``fedx-supernode --poll-interval``, see
        :mod:`fedx.deploy.supernode`) and its SuperExec between two task
        polls after a task (Flower: 1, ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``).
        ``None`` keeps Flower's.
        The SuperLink's own SuperExec, which starts ServerApps, keeps
        Flower's 1 s: a run starts up to 1 s after ``flwr run`` submits it.
    idle_after : float
        With ``poll_interval``: how long after its last message a SuperNode
        (after its last task, a SuperExec) keeps polling every
        ``poll_interval``; then its waits grow up to ``max_poll_interval``
        (a SuperExec's up to Flower's 1 s), so that an idle federation costs
        little (:class:`fedx.flower.IdleBackoff`). ``inf``: never.
    max_poll_interval : float
        With ``poll_interval``: the longest idle wait of a SuperNode (default
        Flower's 3 s).
    extra_environment : dict[str, str]
        Variables added to the environment of every process (for example a
        ``PYTHONPATH`` where an app's plug-ins are installed).
    superlink_database : {"file", "memory"}
        Where the SuperLink keeps its state and the messages' objects:
        ``"file"``, ``state_dir/superlink.db`` (SQLite), kept when the
        SuperLink restarts (runs, registered SuperNodes); ``"memory"``,
        Flower's default, lost with the SuperLink but much cheaper per
        message: the SQLite store spends far more of the SuperLink's time on
        each object of a message than the in-memory one (a model is one object
        per array and chunk, and it crosses the SuperLink twice per exchange;
        ``benchmarks/message_timeline.py`` measures both).
    superlink : {"flower", "fedx"}
        Which SuperLink program: ``"flower"``, ``flower-superlink`` as
        shipped; ``"fedx"``, ``fedx-superlink`` (:mod:`fedx.deploy.superlink`):
        Flower's SuperLink with the same options and answers, whose HTTP
        middleware runs only on the requests it acts on, so that each
        request costs it less CPU time (a model crosses it as one request
        per array). Flower 1.41 (``transport="http"``) only.
    objects_in_flight : int, optional
        Objects of a message each SuperNode pulls from and pushes to the
        SuperLink at once (``fedx-supernode --objects-in-flight``,
        :mod:`fedx.flower.objects_in_flight`); ``None`` keeps Flower's 2.
        Each object is a request of its own, so over a long link a message
        costs about objects / 2 round trips; more in flight overlap them,
        and cost the SuperLink more requests at once
        (``benchmarks/links.py``).
    clientapp_threads : int, optional
        Torch threads of each SuperNode's ClientApps. ``None``: the
        environment's ``FEDX_CLIENTAPP_THREADS``, else the SuperNode's share
        of this machine's usable cores, ``cores // num_supernodes`` (at least
        1; :class:`fedx.deploy.cores.ClientAppCores`). Set in ``__post_init__``
        to the count the SuperNodes get, which they receive as
        ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (Flower's ClientApp
        processes) and ``FEDX_CLIENTAPP_THREADS`` (``fedx-superexec``), with
        ``FEDX_SUPERNODES_PER_MACHINE`` = ``num_supernodes``.
    serverapp_threads : int, optional
        Torch threads of the ServerApp (the SuperLink's environment). ``None``:
        ``FEDX_SERVERAPP_THREADS``, else every usable core: it aggregates and
        evaluates while the ClientApps wait. A simulation SuperLink gets
        neither: its ClientApps' threads are the federation's
        ``client-resources-num-cpus``.
    warm_preload : tuple of str, optional
        Modules the warm interpreters import ahead (``executor="warm"``):
        ``None``, ``fedx-superexec``'s default (torch, fedx's ClientApp and
        strategies); ``()`` none, for an app that needs none of them (its warm
        interpreter is then ready sooner and holds a fraction of the memory).
    """

    num_supernodes: int
    state_dir: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    supernode_ports: list[int] = field(default_factory=list)
    tls: TlsFiles | None = None
    insecure: bool = False
    auth_keys: Path | None = None
    transport: Transport = "http"
    fleet_port: int | None = None
    control_port: int | None = None
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)
    install_app_dependencies: bool = False
    connection: str = "fedx-local"
    workdir: Path | None = None
    simulation: bool = False
    executor: Executor = "flower"
    poll_interval: float | None = None
    idle_after: float = IDLE_AFTER
    max_poll_interval: float = SUPERNODE_IDLE_WAIT
    extra_environment: dict[str, str] = field(default_factory=dict)
    superlink_database: Database = "file"
    superlink: SuperLinkProgram = "flower"
    objects_in_flight: int | None = None
    clientapp_threads: int | None = None
    serverapp_threads: int | None = None
    warm_preload: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.simulation and self.num_supernodes != 0:
            raise ValueError(
                "a simulation SuperLink simulates its SuperNodes: num_supernodes must be 0"
            )
        if not self.simulation and self.num_supernodes < 1:
            raise ValueError(f"num_supernodes must be >= 1, got {self.num_supernodes}")
        if (self.tls is None) != self.insecure:
            raise ValueError("give TLS certificates, or ask for insecure=True explicitly")
        if self.auth_keys is not None and self.tls is None:
            raise ValueError("SuperNode authentication needs TLS")
        if not self.supernode_ports:
            self.supernode_ports = [
                FIRST_SUPERNODE_PORT + index for index in range(self.num_supernodes)
            ]
        if len(self.supernode_ports) != self.num_supernodes:
            raise ValueError("give one Runtime API port per SuperNode")
        if self.transport == "grpc" and (self.fleet_port is None or self.control_port is None):
            raise ValueError('transport="grpc" needs fleet_port and control_port')
        if (self.executor == "warm" or self.poll_interval is not None) and self.transport != "http":
            raise ValueError(
                'the warm executor and poll_interval need Flower 1.41 (transport="http")'
            )
        if self.superlink_database not in ("file", "memory"):
            raise ValueError(
                f'superlink_database must be "file" or "memory", got {self.superlink_database!r}'
            )
        if self.superlink not in ("flower", "fedx"):
            raise ValueError(f'superlink must be "flower" or "fedx", got {self.superlink!r}')
        if self.superlink == "fedx" and self.transport != "http":
            raise ValueError('the fedx SuperLink needs Flower 1.41 (transport="http")')
        if self.poll_interval is not None and not 0.01 <= self.poll_interval <= 3:
            raise ValueError(f"poll_interval must be in [0.01, 3] s, got {self.poll_interval}")
        if self.poll_interval is not None:
            IdleBackoff(self.poll_interval, self.idle_after, self.max_poll_interval)  # checks them
            if self.max_poll_interval > SUPERNODE_IDLE_WAIT:
                raise ValueError(
                    f"max_poll_interval must be at most Flower's {SUPERNODE_IDLE_WAIT} s, got "
                    f"{self.max_poll_interval}"
                )
        if self.objects_in_flight is not None:
            if self.transport != "http":
                raise ValueError('objects_in_flight needs Flower 1.41 (transport="http")')
            objects_in_flight.check_count(self.objects_in_flight)
        if not self.simulation:  # the option, else the environment, else the share of the cores
            self.clientapp_threads = ClientAppCores.resolve(
                threads=self.clientapp_threads, supernodes=self.num_supernodes
            ).threads
            self.serverapp_threads = serverapp_threads(self.serverapp_threads)

    # ------------------------------------------------------------------
    # Addresses and files
    # ------------------------------------------------------------------

    @property
    def fleet_address(self) -> str:
        """Where SuperNodes reach the SuperLink."""
        port = self.fleet_port if self.transport == "grpc" else self.port
        return f"{self.host}:{port}"

    @property
    def control_address(self) -> str:
        """Where the ``flwr`` CLI reaches the SuperLink."""
        port = self.control_port if self.transport == "grpc" else self.port
        return f"{self.host}:{port}"

    @property
    def flwr_home(self) -> Path:
        """``FLWR_HOME`` of the ``flwr`` CLI for this federation."""
        return self.state_dir / "flwr-home"

    @property
    def log_dir(self) -> Path:
        """Where the processes' output goes."""
        return self.state_dir / "logs"

    def config_toml(self) -> str:
        """The ``config.toml`` section that points ``flwr`` at this SuperLink."""
        lines = [
            "[superlink]",
            f'default = "{self.connection}"',
            "",
            f"[superlink.{self.connection}]",
            f'address = "{self.control_address}"',
        ]
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls.ca_cert.resolve()}"')
        return "\n".join(lines) + "\n"

    def environment(self) -> dict[str, str]:
        """Environment of every process: our Flower first on PATH, our FLWR_HOME."""
        env = {
            **os.environ,
            **self.extra_environment,
            "FLWR_HOME": str(self.flwr_home.resolve()),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if not self.install_app_dependencies:
            env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        return env

    def supernode_environment(self) -> dict[str, str]:
        """Environment of a SuperNode and its SuperExec: their task polls, their ClientApps' share of the cores."""
        env = self.environment()
        if self.poll_interval is not None:
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(self.poll_interval)
        if self.clientapp_threads is not None:
            env.update(thread_environment(self.clientapp_threads))
            env[THREADS_VARIABLE] = str(self.clientapp_threads)
            env[SUPERNODES_VARIABLE] = str(self.num_supernodes)
        return env

    def superlink_environment(self) -> dict[str, str]:
        """Environment of the SuperLink, which starts the ServerApp: the ServerApp's threads."""
        env = self.environment()
        if self.serverapp_threads is not None:
            env.update(thread_environment(self.serverapp_threads))
        return env

    # ------------------------------------------------------------------
    # Commands
    # ------------------------------------------------------------------

    def _tls_server_args(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return [
            "--ssl-certfile",
            str(self.tls.server_cert),
            "--ssl-keyfile",
            str(self.tls.server_key),
            "--ssl-ca-certfile",
            str(self.tls.ca_cert),
        ]

    def superlink_command(self) -> list[str]:
        """``flower-superlink`` (or ``fedx-superlink``) with the addresses, TLS and authentication flags."""
        program = "fedx-superlink" if self.superlink == "fedx" else "flower-superlink"
        command = [str(self.bin_dir / program), *self._tls_server_args()]
        if self.simulation:
            # The legacy Control API would take its default port 9093 and
            # collide with any other SuperLink on the machine: give it a free one.
            command += [
                "--simulation",
                "--isolation",
                "subprocess",
                "--control-api-address",
                f"{self.host}:{free_port(self.host)}",
            ]
        if self.auth_keys is not None:
            command.append("--enable-supernode-auth")
        command += ["--host", self.host, "--port", str(self.port)]
        if self.transport == "grpc":
            command += [
                "--fleet-api-address",
                self.fleet_address,
                "--control-api-address",
                self.control_address,
            ]
        if self.superlink_database == "file":  # otherwise Flower's default: in memory
            command += ["--database", str((self.state_dir / "superlink.db").resolve())]
        if not self.install_app_dependencies:
            command.append("--disable-runtime-dependency-installation")
        return command

    def supernode_command(self, index: int) -> list[str]:
        """``fedx-supernode`` (Flower 1.36: ``flower-supernode``) number ``index`` (from 0) with its partition.

        ``fedx-supernode`` is Flower's SuperNode on which a stopped run
        leaves nothing behind (:mod:`fedx.flower.stopped_runs`).
        """
        program = "fedx-supernode" if self.transport == "http" else "flower-supernode"
        command = [str(self.bin_dir / program)]
        if self.poll_interval is not None:
            command += ["--poll-interval", str(self.poll_interval), *self._backoff_args()]
        if self.objects_in_flight is not None:
            command += ["--objects-in-flight", str(self.objects_in_flight)]
        if self.tls is None:
            command.append("--insecure")
        else:
            command += ["--root-certificates", str(self.tls.ca_cert)]
        if self.auth_keys is not None:
            private, _ = supernode_key_paths(self.auth_keys, index + 1)
            command += ["--auth-supernode-private-key", str(private)]
        command += [
            "--superlink",
            self.fleet_address,
            "--port",
            str(self.supernode_ports[index]),
            "--node-config",
            f"partition-id={index} num-partitions={self.num_supernodes}",
        ]
        if self.executor == "warm":
            command += ["--isolation", "process"]
            if self.tls is not None:
                command += [
                    *self._tls_server_args(),
                    "--superexec-auth-secret-file",
                    str(self.superexec_secret(index)),
                ]
        return command

    def _backoff_args(self, ceiling: float | None = None) -> list[str]:
        """The idle backoff's options (``fedx-supernode``, ``fedx-superexec``)."""
        ceiling = self.max_poll_interval if ceiling is None else ceiling
        return ["--idle-after", f"{self.idle_after:g}", "--max-poll-interval", f"{ceiling:g}"]

    def superexec_secret(self, index: int) -> Path:
        """The secret SuperNode ``index`` and its ``fedx-superexec`` share (TLS only)."""
        return self.state_dir / f"superexec-{index}.secret"

    def superexec_command(self, index: int, supernode_pid: int) -> list[str]:
        """``fedx-superexec`` for SuperNode ``index`` (``executor="warm"``), ending with it."""
        command = [
            str(self.bin_dir / "fedx-superexec"),
            "--runtime-api-address",
            f"127.0.0.1:{self.supernode_ports[index]}",
            "--parent-pid",
            str(supernode_pid),
        ]
        if self.poll_interval is not None:  # its task polls: up to Flower's 1 s once idle
            ceiling = min(SUPEREXEC_TASK_POLL, self.max_poll_interval)
            command += self._backoff_args(max(ceiling, self.poll_interval))
        if self.warm_preload is not None:
            command += ["--preload-app", ""]
            command += [f"--preload={module}" for module in self.warm_preload or ("",)]
        if self.tls is None:
            return [*command, "--insecure"]
        return [
            *command,
            "--root-certificates",
            str(self.tls.ca_cert),
            "--superexec-auth-secret-file",
            str(self.superexec_secret(index)),
        ]


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
            stop_processes(_marked(self.marker), signal.SIGTERM)
            for log in self._logs:
                log.close()
            self._logs = []

    def _stop(self, processes: list[subprocess.Popen], sig: int) -> None:
        """Stop ``processes`` (started here), their process groups and every process below them."""
        leaders = []
        for process in processes:
            handle = self._handles.pop(process.pid, None)
            if handle is not None and _running(handle):
                leaders.append(handle)
        stop_processes(leaders, sig, groups=True)
        for process in processes:  # reap them (a zombie is no longer running)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1)


def _running(process: psutil.Process) -> bool:
    """Whether ``process`` (the very one: not another with its pid) runs; a zombie has ended."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(process: psutil.Process, sig: int) -> None:
    """Send ``sig`` to ``process`` if it still is the process it was (psutil checks)."""
    with contextlib.suppress(psutil.Error):
        process.send_signal(sig)


def stop_processes(
    processes: list[psutil.Process], sig: int, *, groups: bool = False, grace: float = STOP_GRACE
) -> None:
    """Stop ``processes`` and every process below them: ``sig``, then SIGKILL after ``grace`` s.

    Flower starts some helpers in sessions of their own (the SuperLink's
    SuperExec), so a process group alone is not enough: the descendants are
    found before the signal. With ``groups``, each process's group (it leads
    one: ``start_new_session``) is signalled too, while the process still
    runs (then its group id is still its own). What still runs after
    ``grace`` s gets SIGKILL. Never raises, and returns after at most
    ``grace`` + 5 s.
    """
    members: dict[int, psutil.Process] = {}
    for process in processes:
        members[process.pid] = process
        with contextlib.suppress(psutil.Error):
            members.update({child.pid: child for child in process.children(recursive=True)})

    def send(signal_number: int) -> None:
        for process in processes if groups else ():
            if _running(process):
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal_number)
        for member in members.values():
            _signal(member, signal_number)

    if not members:
        return
    send(sig)
    if sig == signal.SIGKILL:
        psutil.wait_procs(list(members.values()), timeout=5)
        return
    _, alive = psutil.wait_procs(list(members.values()), timeout=grace)
    if alive:
        members = {process.pid: process for process in alive}
        send(signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)


def _marked(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries ``marker`` (:data:`FEDERATION_VARIABLE`).

    A process the SuperLink started just before the stop (a ServerApp or a
    simulation starting a run) is not among the descendants found at the
    stop, and once its parent is gone it is no longer below anything of ours;
    it still carries the marker. Left running, it would write into the
    federation's folders after they are removed.
    """
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(FEDERATION_VARIABLE) == marker:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _descendants(pid: int) -> list[int]:
    """Ids of all processes below ``pid`` (none when it has ended)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
