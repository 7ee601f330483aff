"""Client groups: which of a round's training messages one simulation actor answers together.

Flower's engine hands each message to a worker thread, and each worker asks
the backend to run its one message. Where the run config's
``client-group-size`` is above 1, fedx's backend
(:mod:`fedx.simulation.backend`) passes a training message through
:class:`GroupCollector` instead: the messages of one round (the same run,
``group_id`` and message type) wait together until the round's messages have
arrived, are split into groups, and each group runs as one call on one actor
(:meth:`fedx.simulation.actor.ClientAppActor.run_group`), which trains them
as one batched step (:mod:`fedx.client.groups`). Every worker gets its own
message's reply, or its own error, as before.

When a round's messages have arrived: the feeder (:mod:`fedx.simulation.feeder`)
announces each message it hands the workers (:meth:`GroupCollector.announce`),
so the collector knows how many are on their way to the backend; it closes
a round's batch once none is, and none has come for :data:`GROUP_QUIET`
seconds (the ServerApp may still be storing the round's last messages), or
as soon as the batch holds what every actor can take (``actors x
client-group-size``), or what the engine's worker threads can carry. A
batch waits at most :data:`GROUP_WAIT` seconds in any case.

How a batch is split: into as many groups as there are actors (so that each
takes a share of the round), more where a group would exceed
``client-group-size``; the messages in the order of their partitions, the
groups as even as can be. A group of one message runs as a single message.

A group ends for every member, whatever happens: its call runs in a thread
of its own, and each member (the one whose thread started it too) waits for
its outcome at most the group's timeout (the messages' time to live, which
Flower's engine gives a reply, or the collector's ``timeout``), then gets a
``TimeoutError``. Any exception of the call (a lost actor, a
``BaseException``), and an answer that does not give one outcome per
member, becomes every member's error.
"""

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context, Message

#: A closed batch waits this long after its last arrival (seconds) before it is split.
GROUP_QUIET = 0.05
#: A batch is split at most this long after its first message arrived (seconds).
GROUP_WAIT = 2.0
#: How long a group's members wait for its call when their messages give no time to live (seconds).
GROUP_TIMEOUT = 3600.0

#: Runs a group of messages on one actor: per message, ``(reply or its exception, context)``.
RunGroup = Callable[[list[Message], list[Context]], list[tuple[Any, Context]]]
#: Runs one message on one actor.
RunOne = Callable[[Message, Context], tuple[Message, Context]]


def round_key(message: Message) -> tuple[int, str, str]:
    """The messages that may share a group: one run, one round (``group_id``), one message type."""
    metadata = message.metadata
    return (metadata.run_id, metadata.group_id, metadata.message_type)


@dataclass(eq=False)
class _Member:
    message: Message
    context: Context
    order: int  # its partition: groups are made in this order
    group: "_Group | None" = None
    outcome: Any = None  # (reply, context), or the exception to raise


@dataclass(eq=False)
class _Group:
    members: list[_Member]
    done: bool = False
    deadline: float = math.inf  # time.monotonic() after which its members stop waiting


@dataclass(eq=False)
class _Batch:
    key: tuple[int, str, str]
    capacity: int
    members: list[_Member] = field(default_factory=list)
    first_at: float = 0.0
    last_at: float = 0.0


class GroupCollector:
    """Gathers a round's training messages into client groups and runs each group on one actor.

    Parameters
    ----------
    actors : callable
        How many actors the pool has now (the number of groups a batch is
        split into, at least); the backend sets it (:meth:`configure`).
    workers : callable
        How many worker threads the engine runs: a batch never waits for
        more messages than these can bring.
    quiet, longest_wait : float
        :data:`GROUP_QUIET` and :data:`GROUP_WAIT`.
    timeout : float, optional
        Seconds a group's members wait for its call. ``None``: what is left
        of the shortest time to live of their messages (Flower's engine
        drops a reply after it), :data:`GROUP_TIMEOUT` where they have none.
    """

    # pylint: disable-next=too-many-arguments
    def __init__(
        self,
        actors: Callable[[], int] = lambda: 1,
        workers: Callable[[], int] = lambda: 2,
        quiet: float = GROUP_QUIET,
        longest_wait: float = GROUP_WAIT,
        timeout: float | None = None,
    ) -> None:
        self._actors, self._workers = actors, workers
        self._quiet, self._longest_wait = quiet, longest_wait
        self._timeout = timeout
        self._cond = threading.Condition()
        self._on_the_way: dict[tuple[int, str, str], int] = {}
        self._open: dict[tuple[int, str, str], _Batch] = {}
        #: How many groups of each size ran (the backend logs it when the run ends).
        self.group_sizes: Counter[int] = Counter()

    def configure(self, actors: Callable[[], int], workers: Callable[[], int]) -> None:
        """Where the actors' and the workers' numbers come from (the backend, when it is built)."""
        with self._cond:
            self._actors, self._workers = actors, workers

    def announce(self, message: Message) -> None:
        """The feeder hands ``message`` to the engine's workers: it is on its way to :meth:`run`."""
        with self._cond:
            key = round_key(message)
            self._on_the_way[key] = self._on_the_way.get(key, 0) + 1

    def arrived(self, message: Message) -> None:
        """``message`` reached the backend (every message does, grouped or not)."""
        with self._cond:
            self._arrived(round_key(message))

    def _arrived(self, key: tuple[int, str, str]) -> None:
        left = self._on_the_way.get(key, 0) - 1
        if left > 0:
            self._on_the_way[key] = left
        else:
            self._on_the_way.pop(key, None)
        self._cond.notify_all()

    # pylint: disable-next=too-many-arguments
    def run(
        self,
        message: Message,
        context: Context,
        order: int,
        group_size: int,
        run_group: RunGroup,
        run_one: RunOne,
    ) -> tuple[Message, Context]:
        """Run ``message`` in a group of its round's messages; its own reply (or error) comes back.

        ``order`` places the message among its round's (its partition);
        ``group_size`` is the largest group. The call returns when its group has run.
        """
        key = round_key(message)
        member = _Member(message, context, order)
        with self._cond:
            self._arrived(key)
            batch = self._open.get(key)
            if batch is None:
                capacity = max(1, self._actors()) * group_size
                batch = self._open[key] = _Batch(key, capacity, first_at=time.monotonic())
            batch.members.append(member)
            batch.last_at = time.monotonic()
            self._cond.notify_all()
            while member.group is None:
                # Any member may close its batch: none waits on another's thread.
                wait = self._close_in(batch)
                if wait <= 0:
                    self._split(batch, group_size)
                    self._cond.notify_all()
                    break
                self._cond.wait(timeout=min(wait, 1.0))
            group = member.group
            assert group is not None
            leads = group.members[0] is member
        if leads:
            threading.Thread(
                target=self._dispatch,
                args=(group, run_group, run_one),
                name="fedx-client-group",
                daemon=True,  # a call that never returns holds no worker of the engine
            ).start()
        with self._cond:
            while not group.done:
                left = group.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"the client group of {len(group.members)} messages did not answer "
                        "within its timeout"
                    )
                self._cond.wait(timeout=min(left, 1.0))
        if isinstance(member.outcome, BaseException):
            raise member.outcome
        return member.outcome

    def _deadline(self, members: Sequence[_Member]) -> float:
        """When (``time.monotonic()``) the members of a group stop waiting for its call."""
        if self._timeout is not None:
            return time.monotonic() + self._timeout
        now = time.time()
        left = [
            m.message.metadata.created_at + m.message.metadata.ttl - now
            for m in members
            if getattr(m.message.metadata, "ttl", 0)
            and getattr(m.message.metadata, "created_at", 0)
        ]
        return time.monotonic() + (max(min(left), 0.0) if left else GROUP_TIMEOUT)

    def _close_in(self, batch: _Batch) -> float:
        """Seconds until ``batch`` should be split (0 or less: now); the caller holds the lock."""
        now = time.monotonic()
        waiting = sum(len(b.members) for b in self._open.values())
        if len(batch.members) >= batch.capacity or waiting >= max(1, self._workers() - 1):
            return 0.0
        until_longest = batch.first_at + self._longest_wait - now
        if self._on_the_way.get(batch.key, 0) > 0:
            return min(until_longest, self._quiet)  # look again after a while
        return min(until_longest, batch.last_at + self._quiet - now)

    def _split(self, batch: _Batch, group_size: int) -> None:
        """Close ``batch``: its members into groups (the caller holds the lock)."""
        del self._open[batch.key]
        members = sorted(batch.members, key=lambda m: m.order)
        count = max(math.ceil(len(members) / group_size), min(max(1, self._actors()), len(members)))
        for chunk in _even_chunks(members, count):
            group = _Group(chunk, deadline=self._deadline(chunk))
            for member in chunk:
                member.group = group
            self.group_sizes[len(chunk)] += 1

    def _dispatch(self, group: _Group, run_group: RunGroup, run_one: RunOne) -> None:
        """Run ``group`` (one actor call) and hand each member its outcome, whatever happens."""
        members = group.members
        outcomes: Sequence[Any] = []
        try:
            if len(members) == 1:
                outcomes = [run_one(members[0].message, members[0].context)]
            else:
                outcomes = [
                    _error(reply) if isinstance(reply, BaseException) else (reply, context)
                    for reply, context in run_group(
                        [m.message for m in members], [m.context for m in members]
                    )
                ]
                if len(outcomes) != len(members):
                    raise RuntimeError(
                        f"the client group's call gave {len(outcomes)} outcomes for "
                        f"{len(members)} messages"
                    )
        # Each member's error; a BaseException too (this thread ends here, the members go on).
        except BaseException as err:  # pylint: disable=broad-exception-caught
            outcomes = [_error(err)] * len(members)
        finally:
            with self._cond:
                for member, outcome in zip(members, outcomes, strict=True):
                    member.outcome = outcome
                group.done = True
                self._cond.notify_all()


def _error(error: BaseException) -> Exception:
    """``error`` as a member's error: one that is no ``Exception`` (``SystemExit``, ``KeyboardInterrupt``
    in the call) is wrapped, so that it ends the member's message, not its worker thread."""
    if isinstance(error, Exception):
        return error
    wrapped = RuntimeError(f"the client group's call ended with {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


def _even_chunks(items: list[_Member], count: int) -> list[list[_Member]]:
    """``items`` in ``count`` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(items), count)
    chunks, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        chunks.append(items[start:end])
        start = end
    return [chunk for chunk in chunks if chunk]


#: The collector of this process's simulation engine (its backend configures it, its feeder announces).
COLLECTOR = GroupCollector()
