"""A delaying TCP relay: a long-distance link's latency between hosts on one machine.

This kernel has no ``netem``, so a link's delay cannot be set on an
interface; ``benchmarks/fedx_bench/slow_links.py`` puts this relay on the "router" host
between the SuperNodes and the SuperLink instead. Each route listens on an
address and forwards every connection it accepts to its target. Each chunk
of bytes read from one side is held for ``--delay`` seconds and then
written to the other side, in order, so every byte takes ``--delay`` to
cross in each direction and a request and its answer take a round trip of
twice that. Throughput is not limited here: many chunks are in flight at
once (up to ``QUEUE_LIMIT`` bytes per direction and connection, far more
than 100 Mbit/s carry in one delay), so the rate is whatever ``tc tbf``
allows on the hosts' links. A new connection waits a round trip before its
first byte is read (TCP's handshake over the long link).

What it does not model: TCP's congestion window over the long path. Each
side's TCP talks to the relay over a link of its own without delay, so a
new or idle connection is at full speed at once, where a real 50 ms path
would need a few round trips of slow start: rounds here are, if anything,
faster than on a real link of that delay.

Commands, one per line on stdin; each answer is a JSON line on stdout:

``cut ROUTE``
    Reset every open connection of ROUTE and hold the new ones (accepted,
    nothing read or forwarded) until ``restore``: the link is down, and a
    client's request hangs as over a broken path. Answer: ``{"event":
    "cut", ...}`` with the route's byte counts.
``cut ROUTE after BYTES``
    The same, once BYTES more bytes have gone down the route (to the
    client); answers ``{"event": "armed", ...}`` now and ``{"event":
    "cut", ...}`` when it happens.
``restore ROUTE``
    Connect and serve the held connections; new ones are served again.
``stats``
    ``{"event": "stats", "routes": {ROUTE: {"up": .., "down": ..,
    "connections": .., "requests": {PATH: COUNT}}}}``: bytes forwarded to
    the target (up) and to the client (down), connections accepted, and
    the HTTP requests seen going up, by the last part of their path.

On start it prints ``{"event": "ready"}`` once every route listens. Only
the standard library: the relay runs as a process of its own.

Usage::

    python _relay.py --delay 0.025 --route site-0=10.233.1.1:9092,10.233.0.2:9092 ...
"""

import argparse
import asyncio
import json
import re
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

#: Bytes read at once from a socket.
CHUNK = 256 * 1024
#: Bytes a socket's send buffer, and the relay's read and write buffers, may hold: 80 ms at
#: 100 Mbit/s.
BUFFER = 1024 * 1024
#: Bytes one direction of one connection may hold in its delay line before
#: it stops reading (100 Mbit/s for 25 ms is 312 KB).
QUEUE_LIMIT = 16 * 1024 * 1024
#: An HTTP request line going up: its path's last part is counted.
REQUEST_LINE = re.compile(rb"POST /(?:[\w.-]+/)*([\w.-]+) HTTP/1\.[01]\r\n")
#: Bytes of one chunk kept to find a request line split across two reads.
TAIL = 128


def emit(event: str, **fields) -> None:
    """One JSON line on stdout."""
    print(json.dumps({"event": event, "time": time.monotonic(), **fields}), flush=True)


def keep_the_link_busy(writer: asyncio.StreamWriter) -> None:
    """Large buffers for a connection's socket, so the link keeps sending while the relay waits
    for the CPU (on a busy machine it may not run for tens of milliseconds)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    writer.transport.set_write_buffer_limits(high=BUFFER)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a reset (RST), as a broken path appears to its ends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


@dataclass(eq=False)  # kept in sets, by identity
class Connection:
    """A client's connection through a route, and the relay's to the target."""

    client: asyncio.StreamWriter
    client_reader: asyncio.StreamReader
    accepted: float
    target: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)

    def reset(self) -> None:
        """Reset both sides and stop forwarding."""
        for task in self.tasks:
            task.cancel()
        reset(self.client)
        if self.target is not None:
            reset(self.target)


class Route:
    """One listening address forwarded to one target, with its delay line and its cut."""

    def __init__(self, name: str, listen: tuple[str, int], target: tuple[str, int], delay: float):
        self.name, self.listen, self.target, self.delay = name, listen, target, delay
        self.up = self.down = self.accepted = 0
        self.requests: Counter[str] = Counter()
        self.open: set[Connection] = set()
        self.held: list[Connection] = []
        self.is_cut = False
        self.cut_at_down: int | None = None  # cut once ``down`` reaches this

    def counts(self) -> dict:
        """Bytes up and down, connections accepted, requests by path."""
        return {
            "up": self.up,
            "down": self.down,
            "connections": self.accepted,
            "requests": dict(self.requests),
        }

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client connected: serve it, or hold it while the route is cut."""
        self.accepted += 1
        connection = Connection(writer, reader, time.monotonic())
        if self.is_cut:
            self.held.append(connection)
            return
        await self.serve(connection)

    async def serve(self, connection: Connection) -> None:
        """Connect to the target after the handshake's round trip; carry both directions."""
        self.open.add(connection)
        try:
            handshake_done = connection.accepted + 2 * self.delay
            await asyncio.sleep(max(0.0, handshake_done - time.monotonic()))
            target_reader, connection.target = await asyncio.open_connection(
                *self.target, limit=BUFFER
            )
            for writer in (connection.client, connection.target):
                keep_the_link_busy(writer)
            connection.tasks = [
                asyncio.ensure_future(
                    self.carry(connection.client_reader, connection.target, "up")
                ),
                asyncio.ensure_future(self.carry(target_reader, connection.client, "down")),
            ]
            await asyncio.gather(*connection.tasks, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open.discard(connection)
            for writer in (connection.client, connection.target):
                if writer is not None:
                    writer.close()

    async def carry(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str
    ) -> None:
        """Forward one direction, each chunk ``delay`` seconds after it was read."""
        line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        room = asyncio.Event()
        room.set()
        held = 0

        async def read() -> None:
            nonlocal held
            tail = b""
            while True:
                await room.wait()
                data = await reader.read(CHUNK)
                line.put_nowait((time.monotonic() + self.delay, data))
                if not data:
                    return
                if direction == "up":
                    tail = self.count_requests(tail + data)
                held += len(data)
                if held > QUEUE_LIMIT:
                    room.clear()

        async def write() -> None:
            nonlocal held
            while True:
                due, data = await line.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                held -= len(data)
                if held <= QUEUE_LIMIT:
                    room.set()
                if direction == "up":
                    self.up += len(data)
                else:
                    self.down += len(data)
                    if self.cut_at_down is not None and self.down >= self.cut_at_down:
                        self.cut()

        reading = asyncio.ensure_future(read())
        try:
            await write()
            await reading
        finally:
            reading.cancel()

    def count_requests(self, seen: bytes) -> bytes:
        """Count the request lines in ``seen``; return what may start one split by the next read."""
        counted_to, start = 0, seen.find(b"POST /")  # bytes.find: no regex over a model's bytes
        while start >= 0:
            if match := REQUEST_LINE.match(seen, start):
                self.requests[match.group(1).decode()] += 1
                counted_to = match.end()
            start = seen.find(b"POST /", start + 1)
        return seen[max(counted_to, len(seen) - TAIL) :]

    def cut(self) -> None:
        """Reset the open connections; hold new ones until :meth:`restore`."""
        self.is_cut, self.cut_at_down = True, None
        for connection in list(self.open):
            connection.reset()
        emit("cut", route=self.name, **self.counts())

    def cut_after(self, more_down: int) -> None:
        """Cut once ``more_down`` more bytes have gone to the client."""
        self.cut_at_down = self.down + more_down
        emit("armed", route=self.name, at_down=self.cut_at_down, **self.counts())

    def restore(self) -> None:
        """Serve again, the held connections first."""
        self.is_cut = False
        held, self.held = self.held, []
        for connection in held:
            asyncio.ensure_future(self.serve(connection))
        emit("restored", route=self.name, held=len(held), **self.counts())


def parse_route(text: str) -> tuple[str, tuple[str, int], tuple[str, int]]:
    """``NAME=LISTEN_HOST:PORT,TARGET_HOST:PORT``."""
    name, addresses = text.split("=", 1)
    listen, target = (address.rsplit(":", 1) for address in addresses.split(","))
    return name, (listen[0], int(listen[1])), (target[0], int(target[1]))


async def control(routes: dict[str, Route]) -> None:
    """Read commands from stdin until it closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        words = line.decode().split()
        try:
            if words[:1] == ["stats"]:
                emit("stats", routes={name: route.counts() for name, route in routes.items()})
            elif len(words) == 2 and words[0] in ("cut", "restore"):
                getattr(routes[words[1]], words[0])()
            elif len(words) == 4 and words[0] == "cut" and words[2] == "after":
                routes[words[1]].cut_after(int(words[3]))
            else:
                emit("error", reason=f"unknown command {line.decode().strip()!r}")
        except (KeyError, ValueError) as err:
            emit("error", reason=f"{line.decode().strip()!r}: {err!r}")


async def main(arguments: argparse.Namespace) -> None:
    routes = {}
    for text in arguments.route:
        name, listen, target = parse_route(text)
        routes[name] = Route(name, listen, target, arguments.delay)
    servers = [
        await asyncio.start_server(route.accept, *route.listen, reuse_address=True, limit=BUFFER)
        for route in routes.values()
    ]
    emit("ready", routes={name: list(route.listen) for name, route in routes.items()})
    try:
        await control(routes)
    finally:
        for server in servers:
            server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--delay", type=float, required=True, help="seconds one way")
    parser.add_argument("--route", action="append", required=True, help="NAME=LISTEN,TARGET")
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        pass
