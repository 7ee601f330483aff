"""A Ray cluster of two hosts on one machine: network namespaces joined by a veth pair.

Each namespace is a host with an address of its own (``10.231.0.1`` and
``10.231.0.2`` on a /24 that exists only on the veth pair between them) and
a loopback of its own, so Ray's default ports inside them collide with
nothing on the machine. Everything running inside the namespaces was started
by the test: closing :class:`HostPair` kills each of those processes by pid
and deletes both namespaces, and the veth pair with them. Namespace and
interface names carry the test process's pid, so concurrent test runs do not
meet.

Needs root and iproute2 (``ip netns``), as CI has.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr.cli.constant import LOCAL_CONTROL_API_ADDRESS, LOCAL_SUPERLINK_HTTP_API_PORT

from tests.support.helpers import BIN, REPO

# Its Namespaces: made, and closed by pid, as the slow links' hosts.
from fedx_bench import slow_links as links

SUBNET = "10.231.0"
HEAD, WORKER = "head", "worker"


class HostPair(links.Namespaces):
    """Two network namespaces, ``head`` and ``worker``, joined by a veth pair."""

    def __init__(self) -> None:
        tag = os.getpid()
        self.namespaces = {HEAD: f"fx16h{tag}", WORKER: f"fx16w{tag}"}
        self.addresses = {HEAD: f"{SUBNET}.1", WORKER: f"{SUBNET}.2"}
        self._veth = {HEAD: f"v16h{tag}", WORKER: f"v16w{tag}"}  # at most 15 characters

    def _build(self) -> None:
        for namespace in self.namespaces.values():
            _ip("netns", "add", namespace)
        _ip("link", "add", self._veth[HEAD], "type", "veth", "peer", "name", self._veth[WORKER])
        for host, namespace in self.namespaces.items():
            _ip("link", "set", self._veth[host], "netns", namespace)
            address = f"{self.addresses[host]}/24"
            _ip("-n", namespace, "addr", "add", address, "dev", self._veth[host])
            _ip("-n", namespace, "link", "set", self._veth[host], "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def kill_all(self, host: str) -> list[int]:
        """SIGKILL every process inside ``host``'s namespace: the machine goes down."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def can_create_namespaces() -> str | None:
    """Why this machine cannot run the cluster tests, or None when it can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


class RayCluster:
    """A Ray head in one namespace and a Ray worker node in the other.

    Each node keeps its session files in a directory of its own; paths stay
    short because Ray's Unix sockets live under them.
    """

    # Ray's defaults declare a node dead after 5 failed health checks 3 s apart;
    # the tests do not wait that long.
    HEAD_ENV = {
        "RAY_health_check_initial_delay_ms": "1000",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }

    def __init__(self, hosts: HostPair, num_cpus: int = 1, object_store_mb: int = 100) -> None:
        self.hosts = hosts
        self.num_cpus = num_cpus
        self.object_store_mb = object_store_mb
        self.root = Path(tempfile.mkdtemp(prefix="fx16-"))
        self.address = f"{hosts.addresses[HEAD]}:6379"
        self.worker_starts = 0

    def environment(self, **extra: str) -> dict[str, str]:
        """Environment of every process on the cluster: this venv first on PATH."""
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            # Ray's memory monitor kills workers when the *machine* is nearly full,
            # which a shared test machine may be for reasons of its own.
            "RAY_memory_monitor_refresh_ms": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            **extra,
        }

    def _ray_start(self, host: str, *args: str, env: dict[str, str] | None = None) -> None:
        command = self.hosts.command(
            host,
            str(BIN / "ray"),
            "start",
            "--node-ip-address",
            self.hosts.addresses[host],
            "--num-cpus",
            str(self.num_cpus),
            "--object-store-memory",
            str(self.object_store_mb * 1024 * 1024),
            "--temp-dir",
            str(self.root / host),
            "--disable-usage-stats",
            *args,
        )
        done = subprocess.run(
            command,
            env=env or self.environment(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"`ray start` on {host} failed:\n{done.stdout}{done.stderr}")

    def start_head(self) -> None:
        self._ray_start(
            HEAD,
            "--head",
            "--port",
            "6379",
            "--include-dashboard",
            "false",
            env=self.environment(**self.HEAD_ENV),
        )

    def start_worker(self) -> None:
        """Start (or start again) the worker node; it joins the head's cluster."""
        self.worker_starts += 1
        self._ray_start(WORKER, "--address", self.address)

    def kill_worker(self) -> list[int]:
        """SIGKILL every process of the worker node, as if its machine died."""
        return self.hosts.kill_all(WORKER)

    def actor_logs(self, host: str) -> list[Path]:
        """Ray's log files of the ClientApp actor processes that ran on ``host``."""
        return [
            path
            for path in (self.root / host).glob("session_*/logs/worker-*.out")
            if ":actor_name:ClientAppActor" in path.read_text(errors="replace")
        ]

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def start_local_superlink(
    cluster: RayCluster, flwr_home: Path, ray_address: str | None = None, timeout: float = 180.0
) -> dict[str, str]:
    """Start the local SuperLink of ``flwr run`` on the head, with the recipe's environment.

    It is Flower's own command (``flwr/cli/local_superlink.py``): ``flwr run``
    then finds it running and uses it. Starting it ahead only allows it more
    than the 15 s that ``flwr run`` waits for it, which a busy machine needs.
    Returns the environment for ``flwr run``.
    """
    env = cluster.environment(
        FLWR_HOME=str(flwr_home),
        RAY_ADDRESS=ray_address or cluster.address,
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
    )
    state = flwr_home / "local-superlink"
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "superlink.log", "w", encoding="utf-8") as log:
        # Runs until the namespace is closed.
        subprocess.Popen(  # pylint: disable=consider-using-with
            cluster.hosts.command(
                HEAD,
                str(BIN / "flower-superlink"),
                "--insecure",
                "--simulation",
                "--isolation",
                "subprocess",
                "--control-api-address",
                LOCAL_CONTROL_API_ADDRESS,
                "--host",
                "127.0.0.1",
                "--port",
                str(LOCAL_SUPERLINK_HTTP_API_PORT),
                "--database",
                str(state / "state.db"),
            ),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    probe = (
        "import httpx, time\n"
        f"deadline = time.monotonic() + {timeout}\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        if httpx.get('http://127.0.0.1:{LOCAL_SUPERLINK_HTTP_API_PORT}/health', timeout=2).is_success:\n"
        "            raise SystemExit(0)\n"
        "    except httpx.HTTPError:\n"
        "        pass\n"
        "    time.sleep(0.5)\n"
        "raise SystemExit(1)\n"
    )
    done = subprocess.run(
        cluster.hosts.command(HEAD, sys.executable, "-c", probe),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the SuperLink did not start; see {state / 'superlink.log'}:\n{done.stderr}"
        )
    return env


class FlwrRun:
    """``flwr run . --stream`` on the head, attached to the cluster, as docs/simulation.md says.

    ``env`` comes from :func:`start_local_superlink`: ``RAY_ADDRESS`` and
    ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` were in the
    environment of the SuperLink, whose simulation process attaches to the
    cluster. It runs in ``app`` (the ``app`` fixture's copy: a checkout with
    its virtual environment inside costs ``flwr run .`` seconds of reading
    files). Output goes to ``log``.
    """

    def __init__(
        self,
        cluster: RayCluster,
        env: dict[str, str],
        log: Path,
        federation: str,
        run_config: str,
        app: Path = REPO,
    ) -> None:
        self.log = log
        with open(log, "w", encoding="utf-8") as out:
            self.process = subprocess.Popen(  # pylint: disable=consider-using-with
                cluster.hosts.command(
                    HEAD,
                    str(BIN / "flwr"),
                    "run",
                    ".",
                    "--stream",
                    "--federation-config",
                    federation,
                    "--run-config",
                    run_config,
                ),
                cwd=app,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """Wait until the output matches ``pattern``; fail when the run ends or time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output())
            if match:
                return match
            if self.process.poll() is not None:
                raise AssertionError(f"the run ended before {pattern!r}:\n{self.output()[-5000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} after {timeout:g}s:\n{self.output()[-5000:]}")

    def wait(self, timeout: float) -> str:
        """Wait for the run to end; its whole output."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"flwr run still running after {timeout:g}s:\n{self.output()[-5000:]}"
            ) from None
        return self.output()
