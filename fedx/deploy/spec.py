"""What a federation on this machine is made of: :class:`FederationSpec`.

A spec holds the addresses, security, programs and settings of a SuperLink
and N SuperNodes, and writes their commands, environments and the ``flwr``
CLI's ``config.toml``; :class:`fedx.deploy.local.LocalFederation` starts
them. Flower 1.41 serves the SuperLink's Fleet API (SuperNodes), Control
API (the ``flwr`` CLI) and Runtime API (the SuperExec that runs ServerApps)
over HTTP(S) on one address, ``--host``/``--port``. Flower up to 1.36
serves the Fleet API over gRPC (``--fleet-api-address``, default port 9092)
and the Control API over gRPC (``--control-api-address``, 9093), with only
the Runtime API on ``--host``/``--port``. The spec writes the commands for
either (``transport="http"`` or ``"grpc"``); the rest is the same: each
SuperNode gets ``--node-config "partition-id=<i> num-partitions=<N>"`` and a
Runtime API port of its own, and ``flwr`` finds the SuperLink through
``$FLWR_HOME/config.toml``.

The SuperNodes share this machine's cores: each one's ClientApps get
``cores / N`` torch threads (at least 1) and the ServerApp every core
(:mod:`fedx.deploy.cores`: ``clientapp_threads``, else
``FEDX_CLIENTAPP_THREADS``, else the share); without it torch gives every
ClientApp process one thread per core, and N of them fight over the same
cores.
"""

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedx.deploy.cores import (
    SUPERNODES_VARIABLE,
    THREADS_VARIABLE,
    ClientAppCores,
    serverapp_threads,
    thread_environment,
)
from fedx.deploy.credentials import TlsFiles, supernode_key_paths
from fedx.deploy.processes import free_port
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


# pylint: disable=too-many-instance-attributes
@dataclass
class FederationSpec:
    """What to start: addresses, security and where state and logs go.

    docs/deployment/processes.md ("A federation's settings") says more of
    each setting: the Flower defaults they keep or change, and their costs.

    Parameters
    ----------
    num_supernodes : int
        N; SuperNode i (from 0) gets ``partition-id=i num-partitions=N``.
    state_dir : Path
        Receives ``logs/``, the SuperLink database and ``flwr-home/config.toml``.
    host, port : str, int
        Where the SuperLink listens and is reached (HTTP(S); Runtime API).
    supernode_ports : list[int]
        Each SuperNode's Runtime API port; empty: from :data:`FIRST_SUPERNODE_PORT`.
    tls : TlsFiles, optional
        Serve over TLS with these files; ``None`` needs ``insecure=True``.
    insecure : bool
        Explicitly run without TLS.
    auth_keys : Path, optional
        Folder of ``supernode-<i>.key``/``.pub`` (from 1): SuperNode authentication (TLS only).
    transport : {"http", "grpc"}
        ``"http"`` for Flower >= 1.37, ``"grpc"`` for Flower <= 1.36.
    fleet_port, control_port : int, optional
        The gRPC Fleet and Control API ports (``transport="grpc"`` only).
    bin_dir : Path
        Where ``flower-superlink``, ``flower-supernode`` and ``flwr`` are.
    install_app_dependencies : bool
        Let the SuperLink install each app's dependencies with ``uv`` (Flower's default).
    connection : str
        Name of the SuperLink connection in ``config.toml``.
    workdir : Path, optional
        Working directory of the processes (default: ``state_dir``).
    simulation : bool
        A simulation SuperLink (``num_supernodes`` must be 0).
    executor : {"flower", "warm"}
        How SuperNodes run ClientApps: Flower's process per message, or ``fedx-superexec``.
    poll_interval : float, optional
        An idle SuperNode's and SuperExec's wait between polls; ``None`` keeps Flower's.
    idle_after, max_poll_interval : float
        With ``poll_interval``: when the waits start growing, and up to what.
    extra_environment : dict[str, str]
        Variables added to the environment of every process.
    superlink_database : {"file", "memory"}
        ``state_dir/superlink.db`` (kept over restarts), or Flower's in-memory store.
    superlink : {"flower", "fedx"}
        ``flower-superlink``, or ``fedx-superlink`` (:mod:`fedx.deploy.superlink`; HTTP only).
    objects_in_flight : int, optional
        Objects each SuperNode pulls and pushes at once; ``None`` keeps Flower's 2.
    clientapp_threads, serverapp_threads : int, optional
        Torch threads of the ClientApps and of the ServerApp; ``None``: from the cores.
    warm_preload : tuple of str, optional
        Modules the warm interpreters import ahead; ``None``: ``fedx-superexec``'s default.
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
