"""The ClientApp actor pool: ClientApp actors across a Ray cluster, kept at the cluster's capacity.

Flower 1.41 runs each simulated ClientApp in a Ray actor of its
``BasicActorPool`` (``flwr/simulation/ray_transport/ray_actor.py``). On a Ray
cluster of several machines (``RAY_ADDRESS`` set for the process that starts
the simulation) that pool has two faults:

- an actor whose node died goes back into the pool: every message handed to
  it later fails, for the rest of the run, although other nodes have room;
- the pool is sized once, when the run starts: a node that joins later is
  never used.

The pool is where this belongs: it holds the actors and sees them fail. Ray's
actor restarts cannot do it (a restarted actor waits for the same resources
again, forever when the surviving nodes are full, and a pool never grows
that way), the federation config of ``flwr run`` passes no actor options
through, and a strategy only ever sees the error replies. fedx's
:class:`ActorPool`, which fedx's backend (:mod:`fedx.simulation.backend`)
uses in place of Flower's:

- hands a message only to an actor that has started and loaded the
  ClientApp, and learns its node; while more messages wait than there are
  actors, a busy actor gets the next one queued behind the one it runs
  (:data:`MESSAGES_PER_ACTOR`), so it starts it without waiting for the
  round trip through the engine (in every message, a sizeable share of a
  digits client's training at 100 clients: docs/results-record.md, "The
  simulation's fixed costs");
- drops an actor that Ray reports gone (its worker or node died, or Ray's
  memory monitor killed it) and runs the message again on another actor, on
  another node where there is one;
- watches the cluster's nodes: a lost node's actors are dropped, new actors
  are started wherever the cluster has room (a joined node, free capacity on
  the others), and one log line says what happened;
- reports how many messages each node ran when the run ends.

Its actors import what the ClientApp imports on its first message as they
start (``preload``), so that a cold start stays out of the round that first
uses them.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from logging import DEBUG, ERROR, INFO, WARNING
from typing import Any

import ray
from flwr.clientapp import ClientApp
from flwr.common import log

from fedx.flower.clientapp_actor import LoadClientAppError
from fedx.simulation.actor import start_actor
from fedx.simulation.ray_cluster import (
    capacity,
    live_nodes,
    node_death_time,
    nodes_text,
    resources_text,
    too_small,
)

# How often the pool looks at the cluster's nodes (one GCS call).
WATCH_INTERVAL = 1.0
# A message is tried on at most this many actors that die under it.
MAX_ATTEMPTS = 3
# How long a message waits when the pool has no actor at all (no node left that
# can host one): after that it fails with an error reply, and the round goes on.
NO_ACTOR_TIMEOUT = 120.0
# Actors that wait this long to start are logged (again after as long again).
SLOW_START = 60.0
# Messages an actor holds at most: the one it runs and one queued behind it, only
# while more messages wait than there are actors (so that the last messages of a
# round go to whichever actor is free first, not behind a long one).
MESSAGES_PER_ACTOR = 2


@dataclass(eq=False)
class PoolActor:
    """One ClientApp actor: its handle, and its node once it has started."""

    handle: Any
    started: Any  # ObjectRef of start_actor's answer; None once it came
    node_id: str = ""
    lost: bool = False
    in_flight: int = 0  # messages handed to it and not back yet


class ActorPool:
    """ClientApp actors across a Ray cluster, kept at the cluster's capacity.

    Parameters
    ----------
    client_resources : dict
        Resources of one ClientApp (``num_cpus``, ``num_gpus``): every actor
        is created with them, and a node's capacity is counted with them.
    create_actor : callable
        Creates one actor (:class:`fedx.simulation.actor.ClientAppActor` with those resources).
    app_fn : callable, optional
        Loads the ClientApp; every new actor calls it before it takes messages.
    preload : sequence of str
        Modules every new actor imports after loading the ClientApp.
    watch_interval : float
        Seconds between two looks at the cluster's nodes.
    death_report_delay : float, optional
        Seconds an actor that died waits to be reported as dead on its own,
        rather than with its node (default: :func:`node_death_time`).
    """

    def __init__(
        self,
        client_resources: dict[str, float],
        create_actor: Callable[[], Any],
        app_fn: Callable[[], ClientApp] | None = None,
        preload: Sequence[str] = (),
        watch_interval: float = WATCH_INTERVAL,
        death_report_delay: float | None = None,
    ) -> None:
        self.client_resources = client_resources
        self._create_actor = create_actor
        self._app_fn = app_fn
        self._preload = tuple(preload)
        self._cond = threading.Condition()
        # Every actor the pool owns and has not written off, and the states they are in.
        self._actors: set[PoolActor] = set()
        self._starting: list[PoolActor] = []
        self._idle: list[PoolActor] = []
        self._busy: set[PoolActor] = set()
        self._waiting = 0  # messages waiting for an actor
        self._nodes = live_nodes()
        self._labels = {node_id: node.label for node_id, node in self._nodes.items()}
        self.capacity = capacity(self._nodes, self.client_resources)
        if self.capacity == 0:
            raise RuntimeError(too_small(self._nodes, self.client_resources))
        self.messages_per_node: Counter[str] = Counter()
        self.peak_running = 0
        # Actors to announce once they run: (what happened, the actors, since when).
        self._announce: list[tuple[str, list[PoolActor], float]] = []
        # When an actor last started, or actors began to start: slow starts are logged.
        self._last_start = time.monotonic()
        # Actors that could not load the ClientApp are not replaced: the first error says why.
        self._unloadable = 0
        self.load_error = ""
        # Actors that left the pool, and when, until the log has said why.
        self._gone: list[tuple[PoolActor, float]] = []
        self._death_report_delay = (
            node_death_time() if death_report_delay is None else death_report_delay
        )
        self._stop = threading.Event()
        with self._cond:
            self._start_actors(self.capacity)
            self._announce.append(("", list(self._starting), time.monotonic()))
        log(
            INFO,
            "fedx Ray backend: starting %d ClientApp actors (%s each) on %s",
            self.capacity,
            resources_text(self.client_resources),
            nodes_text(self._nodes, self.client_resources),
        )
        self._watcher = threading.Thread(
            target=self._watch, args=(watch_interval,), name="fedx-ray-pool", daemon=True
        )
        self._watcher.start()

    # ------------------------------------------------------------------
    # Sizes
    # ------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Actors running, idle or starting that are not known to be lost."""
        with self._cond:
            return len(self._actors)

    @property
    def started(self) -> int:
        """Actors that have started and are not known to be lost (idle or running)."""
        with self._cond:
            return len(self._idle) + sum(not a.lost for a in self._busy)

    @property
    def idle(self) -> int:
        """Started actors waiting for a message."""
        with self._cond:
            return len(self._idle)

    # ------------------------------------------------------------------
    # Running messages
    # ------------------------------------------------------------------

    def run(self, job: Callable[[Any], Any]) -> Any:
        """``job(actor_handle)`` returns an ObjectRef; wait for it on a started actor.

        When Ray reports the actor, its worker or its node gone (any Ray
        error but the ClientApp's own, ``RayTaskError``), the actor leaves
        the pool and the job runs again on another actor, on another node
        where there is one, up to :data:`MAX_ATTEMPTS` actors. The
        ClientApp's errors are raised, and the actor stays in the pool.
        """
        failed_nodes: set[str] = set()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            actor = self._acquire(failed_nodes)
            try:
                result = ray.get(job(actor.handle))
            except ray.exceptions.RayTaskError:
                self._release(actor)
                raise
            except ray.exceptions.RayError as err:
                self._release(actor, died=True)
                failed_nodes.add(actor.node_id)
                log(
                    DEBUG,
                    "fedx Ray backend: the actor on %s is gone (%s)%s",
                    self._labels.get(actor.node_id, "?"),
                    type(err).__name__,
                    "" if attempt == MAX_ATTEMPTS else "; the message runs again on another actor",
                )
                if attempt == MAX_ATTEMPTS:
                    raise
                continue
            except BaseException:
                self._release(actor)
                raise
            self._release(actor, ran=True)
            return result
        raise AssertionError("unreachable")

    def _acquire(self, avoid_nodes: set[str]) -> PoolActor:
        """A started actor for a message, preferably not on ``avoid_nodes``; waits for one.

        An idle actor if there is one; else, while more messages wait than
        there are actors, a busy one that holds fewer than
        :data:`MESSAGES_PER_ACTOR`.
        """
        with self._cond:
            self._waiting += 1
            try:
                return self._wait_for_actor(avoid_nodes)
            finally:
                self._waiting -= 1

    def _wait_for_actor(self, avoid_nodes: set[str]) -> PoolActor:
        """:meth:`_acquire`'s wait; the caller holds the lock."""
        deadline = time.monotonic() + NO_ACTOR_TIMEOUT
        while True:
            elsewhere = [a for a in self._idle if a.node_id not in avoid_nodes]
            busy_elsewhere = any(a.node_id not in avoid_nodes for a in self._busy if not a.lost)
            if elsewhere or (self._idle and not busy_elsewhere):
                actor = (elsewhere or self._idle)[-1]
                self._idle.remove(actor)
                self._busy.add(actor)
                self.peak_running = max(self.peak_running, len(self._busy))
                actor.in_flight += 1
                return actor
            queue_behind = [
                a
                for a in self._busy
                if not a.lost and a.in_flight < MESSAGES_PER_ACTOR and a.node_id not in avoid_nodes
            ]
            if queue_behind and self._waiting > len(self._busy) + len(self._idle):
                actor = min(queue_behind, key=lambda a: a.in_flight)
                actor.in_flight += 1
                return actor
            if self.load_error and not (self._busy or self._starting):
                raise LoadClientAppError(
                    f"the ClientApp does not load in a Ray actor {self.load_error}"
                )
            if self._busy or self._starting:
                # A running actor comes back; a starting one starts (the watcher says when that is slow).
                deadline = time.monotonic() + NO_ACTOR_TIMEOUT
            elif time.monotonic() > deadline:
                raise RuntimeError(
                    f"no ClientApp actor for {NO_ACTOR_TIMEOUT:g}s: {too_small(self._nodes, self.client_resources)}"
                )
            self._cond.wait(timeout=1.0)

    def _release(self, actor: PoolActor, ran: bool = False, died: bool = False) -> None:
        with self._cond:
            actor.in_flight -= 1
            if actor.in_flight == 0:
                self._busy.discard(actor)
            if ran:
                self.messages_per_node[self._labels.get(actor.node_id, "?")] += 1
            if died or actor.lost:
                actor.lost = True  # the watcher writes it off and starts another
                _kill(actor)
            elif actor.in_flight == 0:
                self._idle.append(actor)
            self._cond.notify()

    # ------------------------------------------------------------------
    # Following the cluster
    # ------------------------------------------------------------------

    def _start_actors(self, count: int) -> None:
        """Start ``count`` actors (caller holds the lock); they become idle once they answer."""
        if count and not self._starting:
            self._last_start = time.monotonic()  # the clock for slow starts begins now
        for _ in range(count):
            handle = self._create_actor()
            actor = PoolActor(
                handle, handle.__ray_call__.remote(start_actor, self._app_fn, self._preload)
            )
            self._actors.add(actor)
            self._starting.append(actor)

    def _collect_started(self) -> None:
        """Actors whose start probe answered become idle (caller holds the lock)."""
        probes = [actor.started for actor in self._starting]
        ready = set(ray.wait(probes, num_returns=len(probes), timeout=0)[0]) if probes else set()
        for actor in [a for a in self._starting if a.started in ready]:
            self._starting.remove(actor)
            try:
                actor.node_id = ray.get(actor.started)
            except ray.exceptions.RayTaskError as err:
                # The ClientApp does not load there: another actor would fail the same way,
                # so it is not replaced (nor reported as dead).
                self._remove(actor)
                self._unloadable += 1
                cause = getattr(err, "cause", None) or err
                where = getattr(err, "ip", None)  # not on Ray's dual exception types
                self.load_error = (
                    f"{'on ' + where + ' ' if where else ''}({type(cause).__name__}: {cause})"
                )
                log(
                    ERROR,
                    "fedx Ray backend: the ClientApp does not load in a Ray actor %s; every node "
                    "needs the same fedx, flwr and torch as the head",
                    self.load_error,
                )
                self._cond.notify_all()
                continue
            except ray.exceptions.RayError:
                actor.lost = True  # died while starting: written off and replaced by the watcher
                continue
            actor.started = None
            self._last_start = time.monotonic()
            self._idle.append(actor)
            self._cond.notify()
        for entry in [e for e in self._announce if not any(a in self._starting for a in e[1])]:
            self._announce.remove(entry)
            event, actors, since = entry
            where = Counter(self._labels.get(a.node_id, "?") for a in actors if not a.lost)
            log(
                INFO,
                "fedx Ray backend: %s%s after %.1fs: %s; the pool has %s on %s",
                event,
                _count(sum(where.values()), "new ClientApp actor" if event else "ClientApp actor")
                + (" runs" if sum(where.values()) == 1 else " run"),
                time.monotonic() - since,
                ", ".join(f"{n} on {label}" for label, n in sorted(where.items())) or "none",
                _count(len(self._actors), "actor"),
                _count(len(self._nodes), "node"),
            )

    def _watch(self, interval: float) -> None:
        while not self._stop.is_set():
            with self._cond:
                probes = [actor.started for actor in self._starting]
            if probes:  # wake up as soon as an actor has started
                ray.wait(probes, num_returns=1, timeout=interval)
            else:
                self._stop.wait(interval)
            if self._stop.is_set():
                return
            try:
                self.follow_cluster()
            except Exception as err:  # pylint: disable=broad-exception-caught
                log(WARNING, "fedx Ray backend: could not look at the cluster: %s", err)

    def follow_cluster(self) -> None:
        """Take in started actors, write off lost ones, keep to the cluster's capacity; log changes.

        A lost node is logged at once, with every actor that left the pool
        on it since the last report; actors that died on a node that is
        still there are logged once Ray had time to declare that node dead
        (``death_report_delay``); a joined node once the actors started for
        it run (its capacity is in use from then).
        """
        nodes = live_nodes()
        now = time.monotonic()
        with self._cond:
            self._collect_started()
            lost_nodes = {n: node for n, node in self._nodes.items() if n not in nodes}
            joined = [node.label for n, node in nodes.items() if n not in self._nodes]
            self._nodes = nodes
            self._labels.update({n: node.label for n, node in nodes.items()})
            for actor in [a for a in self._actors if a.lost or a.node_id in lost_nodes]:
                actor.lost = True
                self._remove(actor)
                self._gone.append((actor, now))
            self.capacity = capacity(nodes, self.client_resources)
            missing = self.capacity - self._unloadable - len(self._actors)
            before = len(self._starting)
            self._start_actors(max(missing, 0))
            started = self._starting[before:]
            # Fewer nodes than actors: actors still waiting to start are the ones to give up.
            for actor in self._starting[: max(-missing, 0)]:
                self._remove(actor)
            if joined:
                self._announce.append((f"Ray node {', '.join(joined)} joined; ", started, now))
            waiting = len(self._starting)
            slow = waiting and now - self._last_start >= SLOW_START
            on_lost = Counter(a.node_id for a, _ in self._gone if a.node_id in lost_nodes)
            died = [
                a
                for a, when in self._gone
                if a.node_id not in lost_nodes and now - when >= self._death_report_delay
            ]
            self._gone = [
                (a, when) for a, when in self._gone if a.node_id not in lost_nodes and a not in died
            ]
            size = len(self._actors)
            self._cond.notify_all()
        losses = [
            f"lost Ray node {node.label}: dropped its {_count(on_lost[n], 'ClientApp actor')}"
            for n, node in lost_nodes.items()
        ]
        if died:
            where = ", ".join(
                sorted(
                    {
                        self._labels.get(a.node_id, "?") if a.node_id else "while starting"
                        for a in died
                    }
                )
            )
            losses.append(
                f"{_count(len(died), 'ClientApp actor')} died ({where}) and left the pool"
            )
        if losses:
            log(
                WARNING,
                "fedx Ray backend: %s; the messages they were running went to other actors; "
                "the pool goes on with %s on %s%s",
                "; ".join(losses),
                _count(size, "actor"),
                _count(len(nodes), "node"),
                f"; started {_count(len(started), 'new actor')} where the cluster has room"
                if started
                else "",
            )
        if self.capacity == 0 and lost_nodes:
            log(ERROR, "fedx Ray backend: %s", too_small(nodes, self.client_resources))
        if slow:
            self._last_start = now
            log(
                WARNING,
                "fedx Ray backend: %s waited %.0fs or more to start (%s each; %s): a busy "
                "machine starts them slowly; if it lasts, other jobs hold the resources (`ray status`)",
                _count(waiting, "ClientApp actor") + (" has" if waiting == 1 else " have"),
                SLOW_START,
                resources_text(self.client_resources),
                nodes_text(nodes, self.client_resources),
            )

    def _remove(self, actor: PoolActor) -> None:
        """Take ``actor`` out of the pool and stop it, unless a message still runs on it (caller holds the lock)."""
        self._actors.discard(actor)
        if actor in self._idle:
            self._idle.remove(actor)
        if actor in self._starting:
            self._starting.remove(actor)
        if actor not in self._busy:
            _kill(actor)

    def shutdown(self) -> None:
        """Stop watching and kill every actor; log how many messages each node ran."""
        self._stop.set()
        self._watcher.join(timeout=2 * WATCH_INTERVAL + 5)
        with self._cond:
            for actor in self._actors | self._busy:
                _kill(actor)
            self._actors, self._idle, self._busy, self._starting = set(), [], set(), []
        if self.messages_per_node:
            counts = ", ".join(
                f"{label} {count}" for label, count in sorted(self.messages_per_node.items())
            )
            log(
                INFO,
                "fedx Ray backend: ClientApp messages per Ray node: %s; at most %d ran at once",
                counts,
                self.peak_running,
            )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _kill(actor: PoolActor) -> None:
    try:
        ray.kill(actor.handle, no_restart=True)
    except Exception:  # pylint: disable=broad-exception-caught
        pass  # its node is gone, or it is dead already
