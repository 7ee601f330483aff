"""Hosts joined by slow, distant links on one machine: network namespaces, ``tc tbf`` and a relay.

The hosts form a star around a router::

    site-0 ──┐
    site-1 ──┼── router ── link
    site-2 ──┘

Each host is a network namespace joined to the router's namespace by a
veth pair, a link of its own. Both ends of every pair shape what they send
with ``tc``'s token bucket (``tbf``) at the link's rate, so each direction
of each link carries at most that rate. The router runs the delaying relay
(``benchmarks/fedx_bench/relay.py``): one route per site, listening on the router's
address on that site's link and forwarding to the SuperLink's port on the
``link`` host, every byte held ``delay`` seconds in each direction. The
router does not forward IP: whatever a SuperNode and the SuperLink say to
each other goes through the relay, over the site's link and the
SuperLink's, which all sites share.

Addresses (a /24 per link, on no other interface of the machine): the
``link`` host is ``10.233.0.2``, site i is ``10.233.<i+1>.2``, and the
router is ``.1`` on each. Namespace and interface names carry this
process's id and a counter, so concurrent runs do not meet. Closing
:class:`Wan` (also on an error or Ctrl-C) stops every process inside the
namespaces by pid and deletes the namespaces, and with them the links.

:class:`LinkedFederation` is ``fedx.deploy.local``'s federation on these
hosts: the SuperLink (and the ServerApps it starts) on ``link``, SuperNode i
on ``site-i`` reaching the SuperLink through its route of the relay.

Needs root, iproute2 (``ip``, ``tc``) and the ``tbf`` queueing discipline:
:func:`missing` says what is missing.
"""

import contextlib
import ctypes
import itertools
import json
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from fedx.deploy.local import FederationSpec, LocalFederation

ROUTER, LINK = "router", "link"
SUBNET = "10.233"
#: The SuperLink's port on the link host, and the relay's on the router.
SUPERLINK_PORT = 9092
RELAY = Path(__file__).resolve().with_name("relay.py")
CLONE_NEWNET = 0x40000000
_count = itertools.count()


def site(index: int) -> str:
    """The name of site ``index``'s host."""
    return f"site-{index}"


def missing() -> str | None:
    """Why this machine cannot make the hosts (one line), or None when it can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2's `{tool}` is not installed"
    if os.geteuid() != 0:
        return "network namespaces and tc need root"
    return None


def namespace_pids(namespace: str) -> list[int]:
    """Every process inside the network namespace ``namespace``."""
    done = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    )
    return [int(pid) for pid in done.stdout.split()]


def delete_namespaces(namespaces: list[str]) -> None:
    """Stop every process inside ``namespaces`` by pid, then delete the namespaces.

    Each process is sent SIGTERM and given up to 10 s to end, then SIGKILL;
    deleting a namespace deletes the interfaces inside it (both ends of a
    veth pair go with either end).
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for namespace in namespaces:
            for pid in namespace_pids(namespace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(map(namespace_pids, namespaces)):
            time.sleep(0.2)
    for namespace in namespaces:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def _program(process: psutil.Process) -> str:
    """The name of the program a process runs (its script for Python, else its executable)."""
    command = process.cmdline()
    if len(command) > 1 and Path(command[0]).name.startswith("python"):
        if command[1] == "-c":
            return "python -c"
        return Path(command[1]).name
    return Path(command[0]).name if command else process.name()


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


class Namespaces:
    """Network namespaces this process makes and deletes, one per host: a context manager.

    A subclass names them in ``namespaces`` (``{host: namespace}``) and makes
    them, and what joins them, in :meth:`_build`. Leaving the block, or an
    error in :meth:`_build`, closes them: every process inside is stopped by
    pid and the namespaces are deleted, with the interfaces in them.
    """

    namespaces: dict[str, str]

    def __enter__(self) -> Self:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _build(self) -> None:
        raise NotImplementedError

    def command(self, host: str, *command: str) -> list[str]:
        """``command`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host], *command]

    def pids(self, host: str) -> list[int]:
        """Every process inside ``host``'s namespace."""
        return namespace_pids(self.namespaces[host])

    def close(self) -> None:
        """Stop every process in the namespaces (by pid), then delete the namespaces."""
        delete_namespaces(list(self.namespaces.values()))


class Wan(Namespaces):
    """The router, the ``link`` host and ``sites`` site hosts, their links and the relay.

    Parameters
    ----------
    sites : int
        Site hosts (one per SuperNode).
    rate_mbit : float
        Every link's rate in each direction, Mbit/s.
    delay : float
        Seconds the relay holds each byte, each way (a round trip is twice that).
    """

    def __init__(self, sites: int, rate_mbit: float, delay: float) -> None:
        if not 1 <= sites <= 250:
            raise ValueError(f"sites must be in [1, 250], got {sites}")
        self.rate_mbit, self.delay = rate_mbit, delay
        tag = f"{os.getpid():x}{next(_count):x}"
        self.hosts = [LINK, *(site(i) for i in range(sites))]
        self.namespaces = {host: f"fx{tag}{self._short(host)}" for host in [ROUTER, *self.hosts]}
        self._veth = {
            host: (f"fx{tag}{self._short(host)}h", f"fx{tag}{self._short(host)}r")
            for host in self.hosts
        }
        if max(len(name) for pair in self._veth.values() for name in pair) > 15:
            raise ValueError("this process's id is too long for interface names")
        self.relay: Relay | None = None

    @staticmethod
    def _short(host: str) -> str:
        return {ROUTER: "r", LINK: "l"}.get(host, f"s{host.removeprefix('site-')}")

    def _subnet(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        """``host``'s address on its link."""
        return f"{self._subnet(host)}.2"

    def router_address(self, host: str) -> str:
        """The router's address on ``host``'s link (where the relay listens for a site)."""
        return f"{self._subnet(host)}.1"

    @property
    def superlink_address(self) -> str:
        """Where the SuperLink listens, on the ``link`` host."""
        return f"{self.address(LINK)}:{SUPERLINK_PORT}"

    def relayed_address(self, host: str) -> str:
        """Where a SuperNode on site ``host`` reaches the SuperLink: its route of the relay."""
        return f"{self.router_address(host)}:{SUPERLINK_PORT}"

    # ------------------------------------------------------------------

    def _build(self) -> None:
        """The namespaces, the links (each end shaped by its token bucket) and the relay."""
        for namespace in self.namespaces.values():
            _run("ip", "netns", "add", namespace)
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
        router = self.namespaces[ROUTER]
        for host in self.hosts:
            namespace, (host_end, router_end) = self.namespaces[host], self._veth[host]
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", router_end)
            for end, where, address in (
                (host_end, namespace, self.address(host)),
                (router_end, router, self.router_address(host)),
            ):
                _run("ip", "link", "set", end, "netns", where)
                _run("ip", "-n", where, "addr", "add", f"{address}/24", "dev", end)
                _run("ip", "-n", where, "link", "set", end, "up")
                # The token bucket: the rate, a burst of 32 KB, at most 20 ms queued.
                _run(
                    "ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", end, "root",
                    "tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", "32kb", "latency", "20ms",
                )  # fmt: skip
        self.relay = Relay(self)

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[None]:
        """Run the block in ``host``'s network namespace.

        Only this thread moves (``setns``): the sockets it opens and the
        processes it starts in the block belong to ``host``; it comes back at
        the end.
        """
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            theirs = os.open(f"/run/netns/{self.namespaces[host]}", os.O_RDONLY)
            try:
                _setns(theirs)
            finally:
                os.close(theirs)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(own)

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each link has carried so far: ``{host: {"up": to the router, "down": from it}}``.

        What the token buckets sent, Ethernet frames with their headers, as ``tc -s`` counts them.
        """
        carried = {}
        for host in self.hosts:
            host_end, router_end = self._veth[host]
            sent = {}
            for end, where in ((host_end, host), (router_end, ROUTER)):
                shown = _run(*self.command(where, "tc", "-s", "-j", "qdisc", "show", "dev", end))
                sent[where] = sum(q["bytes"] for q in json.loads(shown) if q.get("root"))
            carried[host] = {"up": sent[host], "down": sent[ROUTER]}
        return carried

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds the processes inside the namespaces have used so far, by program.

        A program is ``host/name`` (``link/flower-superlink``, ``site-0/fedx-supernode``
        ...); ``host/ended`` counts the processes that ended and were waited for
        by a process of that host.
        """
        used: dict[str, float] = {}
        for host in self.namespaces:
            for pid in self.pids(host):
                with contextlib.suppress(psutil.Error):
                    process = psutil.Process(pid)
                    times = process.cpu_times()
                    program = f"{host}/{_program(process)}"
                    ended = f"{host}/ended"
                    used[program] = used.get(program, 0.0) + times.user + times.system
                    used[ended] = used.get(ended, 0.0) + times.children_user + times.children_system
        return used

    def close(self) -> None:
        """Stop the relay and every process in the namespaces, then delete the namespaces."""
        if self.relay is not None:
            self.relay.close()
        super().close()


class Relay:
    """The relay process on the router of ``wan``: one route per site, named after the site."""

    def __init__(self, wan: Wan) -> None:
        routes = [
            f"--route={host}={wan.relayed_address(host)},{wan.superlink_address}"
            for host in wan.hosts
            if host != LINK
        ]
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            wan.command(ROUTER, sys.executable, str(RELAY), f"--delay={wan.delay}", *routes),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._events: queue.Queue[dict] = queue.Queue()
        self._unclaimed: list[dict] = []
        self.events: list[dict] = []  # every event, in order
        threading.Thread(target=self._read, daemon=True).start()
        self.wait("ready", timeout=30)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            self.events.append(event)
            self._events.put(event)
        self._events.put({"event": "exited"})

    def _send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def wait(self, event: str, route: str | None = None, timeout: float = 30.0) -> dict:
        """The next ``event`` (of ``route``) the relay reports.

        Raises
        ------
        TimeoutError
            When none comes within ``timeout`` seconds.
        RuntimeError
            When the relay reports an error or exits.
        """

        def wanted(candidate: dict) -> bool:
            return candidate["event"] == event and route in (None, candidate.get("route"))

        for index, candidate in enumerate(self._unclaimed):
            if wanted(candidate):
                return self._unclaimed.pop(index)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                candidate = self._events.get(timeout=left)
            except queue.Empty:
                break
            if candidate["event"] in ("error", "exited"):
                raise RuntimeError(f"the relay failed: {candidate}")
            if wanted(candidate):
                return candidate
            self._unclaimed.append(candidate)
        raise TimeoutError(f"the relay reported no {event} {route or ''} within {timeout:g}s")

    def cut(self, host: str, after_bytes: int | None = None) -> dict:
        """Cut ``host``'s route now, or once ``after_bytes`` more have gone down it (returns at once)."""
        if after_bytes is None:
            self._send(f"cut {host}")
            return self.wait("cut", host)
        self._send(f"cut {host} after {after_bytes}")
        return self.wait("armed", host)

    def restore(self, host: str) -> dict:
        """Serve ``host``'s route again."""
        self._send(f"restore {host}")
        return self.wait("restored", host)

    def stats(self) -> dict[str, dict]:
        """Each route's bytes up and down, connections and requests so far."""
        self._send("stats")
        return self.wait("stats")["routes"]

    def close(self) -> None:
        """End the relay (it ends when its stdin closes)."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@dataclass
class LinkedSpec(FederationSpec):
    """A federation spec whose SuperNode i reaches the SuperLink at ``relayed_addresses[i]``."""

    relayed_addresses: list[str] = field(default_factory=list)

    def supernode_command(self, index: int) -> list[str]:
        command = super().supernode_command(index)
        command[command.index("--superlink") + 1] = self.relayed_addresses[index]
        return command


def linked_spec(wan: Wan, state_dir: Path, **kwargs) -> LinkedSpec:
    """A plain-text federation on ``wan``: the SuperLink on ``link``, SuperNode i on site i."""
    sites = [host for host in wan.hosts if host != LINK]
    return LinkedSpec(
        num_supernodes=len(sites),
        state_dir=state_dir,
        host=wan.address(LINK),
        port=SUPERLINK_PORT,
        insecure=True,
        relayed_addresses=[wan.relayed_address(host) for host in sites],
        **kwargs,
    )


class LinkedFederation(LocalFederation):
    """:class:`~fedx.deploy.local.LocalFederation` with each process on its host of ``wan``.

    The SuperLink and the ``flwr`` CLI run on ``link``, SuperNode i (and its
    warm executor) on ``site-i``.
    """

    def __init__(self, spec: LinkedSpec, wan: Wan) -> None:
        super().__init__(spec)
        self.wan = wan

    def start_superlink(self, timeout: float = 120.0) -> None:
        with self.wan.inside(LINK):
            super().start_superlink(timeout)

    def start_supernode(self, index: int) -> subprocess.Popen:
        with self.wan.inside(site(index)):
            return super().start_supernode(index)

    def flwr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        with self.wan.inside(LINK):
            return super().flwr(*args, timeout=timeout)


# ----------------------------------------------------------------------
# What the links deliver
# ----------------------------------------------------------------------


@dataclass
class Probe:
    """What a connection from a site to the SuperLink's host saw through the relay."""

    connect: float  # seconds to the first answer on a new connection
    round_trip: float  # seconds, the median of a few one-byte exchanges after that
    nbytes: int
    seconds: float  # to send ``nbytes`` and have them acknowledged

    @property
    def mbit(self) -> float:
        """The transfer's rate, Mbit/s."""
        return self.nbytes * 8 / self.seconds / 1e6


class ProbeServer:
    """A server on the ``link`` host at the SuperLink's port (free before the SuperLink starts).

    Each connection answers a line ``echo`` with ``echo``; after a line
    ``sink N`` it reads N bytes and answers ``done``; to ``source N`` it
    answers N bytes.
    """

    def __init__(self, wan: Wan) -> None:
        with wan.inside(LINK):
            self.listener = socket.create_server((wan.address(LINK), SUPERLINK_PORT))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    @staticmethod
    def _serve(connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream, contextlib.suppress(OSError):
            for line in stream:
                if line == b"echo\n":
                    connection.sendall(b"echo\n")
                elif line.startswith(b"sink "):
                    left = int(line.split()[1])
                    while left > 0 and (data := stream.read1(min(left, 1 << 20))):
                        left -= len(data)
                    connection.sendall(b"done\n")
                elif line.startswith(b"source "):
                    connection.sendall(bytes(int(line.split()[1])))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()

    def __enter__(self) -> "ProbeServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def connect_through_relay(wan: Wan, host: str, timeout: float = 30.0) -> socket.socket:
    """A connection from site ``host`` to the SuperLink's port, through its route of the relay."""
    address, port = wan.relayed_address(host).rsplit(":", 1)
    with wan.inside(host):
        connection = socket.create_connection((address, int(port)), timeout=timeout)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def exchange(connection: socket.socket, line: bytes) -> float:
    """Send ``line``, wait for the answer line; the seconds it took."""
    start = time.monotonic()
    connection.sendall(line)
    answer = b""
    while not answer.endswith(b"\n"):
        data = connection.recv(64)
        if not data:
            raise ConnectionError("the connection closed")
        answer += data
    return time.monotonic() - start


def probe(wan: Wan, host: str, nbytes: int, exchanges: int = 5) -> Probe:
    """Round trips and a transfer of ``nbytes`` from site ``host`` to the SuperLink's host.

    Run it while nothing listens on the SuperLink's port (no federation).
    """
    with ProbeServer(wan), connect_through_relay(wan, host) as connection:
        connect = exchange(connection, b"echo\n")
        round_trip = statistics.median(exchange(connection, b"echo\n") for _ in range(exchanges))
        payload = b"sink %d\n" % nbytes + bytes(nbytes)
        seconds = exchange(connection, payload)
    return Probe(connect, round_trip, nbytes, seconds)
