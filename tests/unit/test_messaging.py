"""send_and_collect: replies as they arrive, on a Grid whose replies land at scripted times.

The Grid here is a real ``flwr.serverapp.Grid`` subclass whose nodes answer
a given number of seconds after the push (or never, or with an error reply
as the SuperLink writes for a lost node), and whose push refuses chosen
messages as Flower's HttpGrid does (a ``None`` id). Time is a virtual
clock: ``fedx.messaging``'s sleeps advance it, so the tests check when each
pull happened without waiting for anything.
"""

import logging
import threading
import time
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.serverapp import Grid

from fedx import messaging
from fedx.messaging import MAX_PULL_INTERVAL, ReplySignal, send_and_collect

NEVER = None
REFUSED = "refused"
LOST = "lost"  # the SuperLink answers for the node with an error reply


class VirtualClock:
    """``time.monotonic`` and ``time.sleep`` of a clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedGrid(Grid):
    """Node ``n`` answers ``script[n]`` seconds after the push (NEVER, REFUSED or LOST)."""

    def __init__(self, clock: VirtualClock, script: dict[int, float | str | None]) -> None:
        self.clock = clock
        self.script = script
        self.pushed_at: float | None = None
        self.pulls: list[tuple[float, set[str]]] = []
        self.brought: list[int] = []  # replies each pull returned
        self.ids: dict[str, Message] = {}
        self.delivered: set[str] = set()

    # What the tests use ------------------------------------------------

    def push_messages(self, messages: Iterable[Message]) -> list[str | None]:
        self.pushed_at = self.clock.now
        ids: list[str | None] = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as Flower's Grid does
            if self.script[message.metadata.dst_node_id] == REFUSED:
                ids.append(None)
                continue
            self.ids[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        message_ids = set(message_ids)
        self.pulls.append((self.clock.now, message_ids))
        replies = []
        for message_id in sorted(message_ids - self.delivered):
            message = self.ids[message_id]
            delay = self.script[message.metadata.dst_node_id]
            if delay is NEVER:
                continue
            if delay == LOST:
                replies.append(Message(Error(code=0, reason="node offline"), reply_to=message))
            elif self.clock.now - self.pushed_at >= delay:
                replies.append(
                    Message(RecordDict({"config": ConfigRecord({"node": 1})}), reply_to=message)
                )
            else:
                continue
            self.delivered.add(message_id)
        self.brought.append(len(replies))
        return replies

    # The rest of Flower's Grid -----------------------------------------

    def set_run(self, run):  # pragma: no cover - unused
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover - unused
        raise NotImplementedError

    def create_message(self, *args, **kwargs):  # pragma: no cover - unused
        raise NotImplementedError

    def get_node_ids(self) -> list[int]:
        return list(self.script)

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("send_and_collect must use push_messages and pull_messages")


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    virtual = VirtualClock()
    monkeypatch.setattr(messaging, "time", virtual)
    return virtual


def exchange(grid: ScriptedGrid, timeout: float | None) -> list[Message]:
    messages = [
        Message(
            RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=node, message_type="query"
        )
        for node in grid.script
    ]
    return send_and_collect(grid, messages, timeout)


def replied_nodes(grid: ScriptedGrid, replies: list[Message]) -> list[int]:
    return [grid.ids[r.metadata.reply_to_message_id].metadata.dst_node_id for r in replies]


def test_replies_are_collected_as_they_arrive(server_task_identity, clock):
    grid = ScriptedGrid(clock, {11: 0.05, 12: 0.4, 13: 7.3})
    replies = exchange(grid, timeout=600)
    assert replied_nodes(grid, replies) == [11, 12, 13]  # in the order they arrived
    last_pull, _ = grid.pulls[-1]
    # The last reply landed 7.3 s after the push and was pulled at most one
    # (longest) pause later, not in Flower's 3-second steps (which would be 9 s).
    assert 7.3 <= last_pull - grid.pushed_at <= 7.3 + MAX_PULL_INTERVAL
    assert max(clock.sleeps) <= MAX_PULL_INTERVAL
    # The pause after pull i is sleeps[i]: short again after each pull that brought a reply,
    # growing (up to the longest) while none came.
    brought = [i for i, count in enumerate(grid.brought[:-1]) if count]
    assert brought and all(clock.sleeps[i] == messaging.FIRST_PULL_INTERVAL for i in brought)
    assert clock.sleeps[-1] == MAX_PULL_INTERVAL


def test_the_timeout_ends_the_wait_with_the_replies_so_far(server_task_identity, clock, caplog):
    grid = ScriptedGrid(clock, {11: 0.2, 12: NEVER, 13: 30.0})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        replies = exchange(grid, timeout=5.0)
    assert replied_nodes(grid, replies) == [11]
    last_pull, waiting = grid.pulls[-1]
    assert last_pull - grid.pushed_at == pytest.approx(5.0)  # one last pull at the deadline
    assert len(waiting) == 2
    assert "2 of 3 node(s) did not reply within 5s: [12, 13]" in caplog.text


def test_a_refused_message_is_not_waited_for(server_task_identity, clock, caplog):
    grid = ScriptedGrid(clock, {11: REFUSED, 12: 0.1})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        replies = exchange(grid, timeout=600)
    assert replied_nodes(grid, replies) == [12]
    assert clock.now - grid.pushed_at < 1.0  # not the timeout
    assert all(len(ids) <= 1 for _, ids in grid.pulls)  # never asked for a None id
    assert "1 of 2 message(s) could not be pushed (to node(s) [11])" in caplog.text


def test_error_replies_the_superlink_writes_for_lost_nodes_count_as_replies(
    server_task_identity, clock
):
    grid = ScriptedGrid(clock, {11: LOST, 12: 0.3})
    replies = exchange(grid, timeout=600)
    assert sorted(replied_nodes(grid, replies)) == [11, 12]
    assert [r.has_error() for r in replies] == [True, False]
    assert clock.now - grid.pushed_at < 1.0


def test_no_timeout_waits_for_every_reply(server_task_identity, clock):
    grid = ScriptedGrid(clock, {11: 0.1, 12: 4000.0})
    replies = exchange(grid, timeout=None)
    assert sorted(replied_nodes(grid, replies)) == [11, 12]
    assert 4000.0 <= clock.now - grid.pushed_at <= 4000.0 + MAX_PULL_INTERVAL


def test_replies_already_there_are_pulled_at_once_even_with_timeout_zero(
    server_task_identity, clock
):
    grid = ScriptedGrid(clock, {11: 0.0, 12: 0.0})
    replies = exchange(grid, timeout=0)
    assert sorted(replied_nodes(grid, replies)) == [11, 12]
    assert len(grid.pulls) == 1 and clock.sleeps == []


def test_nothing_to_send_sends_nothing(clock):
    grid = ScriptedGrid(clock, {})
    assert send_and_collect(grid, [], timeout=10) == []
    assert grid.pushed_at is None and grid.pulls == []


def test_a_grid_without_push_and_pull_is_asked_through_send_and_receive(server_task_identity):
    class OnlySendAndReceive:  # an in-process test grid
        def send_and_receive(self, messages, *, timeout=None):
            self.timeout = timeout
            return [Message(RecordDict(), reply_to=m) for m in messages]

    grid = OnlySendAndReceive()
    message = Message(RecordDict(), dst_node_id=3, message_type="query")
    message.metadata.__dict__["_message_id"] = message.object_id
    assert len(send_and_collect(grid, [message], 7.0)) == 1
    assert grid.timeout == 7.0


def test_intervals_are_checked():
    with pytest.raises(ValueError, match="first_interval <= max_interval"):
        send_and_collect(None, [], 1.0, first_interval=0.5, max_interval=0.1)


def test_a_fixed_interval_from_the_environment_pulls_in_flowers_steps(
    server_task_identity, clock, monkeypatch
):
    monkeypatch.setenv(messaging.PULL_INTERVAL_VARIABLE, "3")
    grid = ScriptedGrid(clock, {11: 0.05, 12: 4.0})
    replies = exchange(grid, timeout=600)
    assert sorted(replied_nodes(grid, replies)) == [11, 12]
    assert [at - grid.pushed_at for at, _ in grid.pulls] == [0.0, 3.0, 6.0]  # as send_and_receive
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv(messaging.PULL_INTERVAL_VARIABLE, bad)
        with pytest.raises(ValueError, match="FEDX_REPLY_PULL_INTERVAL must be a positive number"):
            exchange(grid, timeout=600)


def test_a_pause_ends_when_replies_are_stored_in_this_process():
    """Flower's simulation stores replies in the ServerApp's process, and fedx's engine says so."""
    signal = ReplySignal()
    seen = signal.count
    started = time.monotonic()
    signal.pause(seen, 0.2)  # nobody stores replies here: a plain sleep
    assert time.monotonic() - started >= 0.2
    with signal.notifying():
        threading.Timer(0.2, signal.notify).start()
        started = time.monotonic()
        signal.pause(seen, 120)
        assert time.monotonic() - started < 60 and signal.count == seen + 1
        started = time.monotonic()
        signal.pause(seen, 120)  # a reply came since `seen`: pull again at once
        assert time.monotonic() - started < 1
