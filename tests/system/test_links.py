"""The slow-link machinery of benchmarks/links.py: namespaces as hosts, tc tbf, the delaying relay.

One site and the SuperLink's host on 20 Mbit/s links, 25 ms each way
through the relay, nothing of a federation: a probe server on the
SuperLink's port (benchmarks/fedx_bench/slow_links.py). The relay's delay shows in every
round trip, the token buckets in a transfer's time, and a cut resets what
is open and holds what comes until it is restored. The federation on such
links, with a cut in a model transfer: tests/system/test_link_faults.py.
"""

import os
import socket

import pytest

from fedx_bench import slow_links as links

RATE_MBIT, DELAY = 20.0, 0.025
SITE = links.site(0)


@pytest.fixture(scope="module")
def wan():
    problem = links.missing()
    if problem is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"no slow-link test: {problem}")
    with links.Wan(1, RATE_MBIT, DELAY) as wan:
        yield wan


def test_the_relay_delays_each_way_and_the_token_buckets_set_the_rate(wan):
    nbytes = 2_500_000
    before = wan.link_bytes()
    probe = links.probe(wan, SITE, nbytes)
    carried = {
        host: {way: n - before[host][way] for way, n in ways.items()}
        for host, ways in wan.link_bytes().items()
    }
    # A round trip is both delays; a new connection first pays the handshake's.
    assert probe.round_trip >= 2 * DELAY
    assert probe.connect >= 4 * DELAY
    # 2.5 MB take 1 s at 20 Mbit/s: never less (the buckets), and not much more
    # (the relay adds its delay once and keeps the links busy).
    at_rate = nbytes * 8 / (RATE_MBIT * 1e6)
    assert at_rate <= probe.seconds <= 2.5 * at_rate + DELAY, probe
    # Both links carried the bytes, headers on top: the site's up, the SuperLink's down.
    assert nbytes <= carried[SITE]["up"] < 1.1 * nbytes
    assert nbytes <= carried[links.LINK]["down"] < 1.1 * nbytes


def test_a_cut_resets_open_connections_and_holds_new_ones_until_restored(wan):
    with links.ProbeServer(wan), links.connect_through_relay(wan, SITE) as open_before:
        links.exchange(open_before, b"echo\n")
        cut = wan.relay.cut(SITE)
        assert cut["route"] == SITE
        with pytest.raises(OSError):  # reset, or closed
            links.exchange(open_before, b"echo\n")
        with links.connect_through_relay(wan, SITE) as during:
            during.sendall(b"echo\n")
            during.settimeout(1.0)
            with pytest.raises(socket.timeout):
                during.recv(64)
            assert wan.relay.restore(SITE)["held"] == 1
            during.settimeout(30.0)
            assert during.recv(64) == b"echo\n"


def test_a_cut_after_some_bytes_breaks_a_transfer_in_the_middle(wan):
    with links.ProbeServer(wan), links.connect_through_relay(wan, SITE) as connection:
        links.exchange(connection, b"echo\n")
        armed = wan.relay.cut(SITE, after_bytes=1_000_000)
        connection.sendall(b"source 3000000\n")
        received = 0
        with pytest.raises(OSError):
            while data := connection.recv(1 << 16):
                received += len(data)
            raise ConnectionError("closed")  # a clean end is a cut too
        cut = wan.relay.wait("cut", SITE)
        assert armed["at_down"] <= cut["down"] < armed["at_down"] + 2_000_000
        assert received < 3_000_000
        wan.relay.restore(SITE)
    # The route serves again.
    assert links.probe(wan, SITE, 1000).round_trip >= 2 * DELAY
