"""Change: a stopped run leaves nothing on a SuperNode, and each reply goes to its own message.

What it changes
    In the process of ``fedx-supernode`` (:func:`apply`, through
    :func:`fedx.flower.install`): two module
    globals of ``flwr.supernode.start_client_internal``, the SuperNode's
    loop, which receives one message from the SuperLink
    (``_pull_and_store_message``), then pushes replies
    (``_push_messages``), and again. The receiving is wrapped
    (``_Loop.receive``): Flower's function runs as before, and when it
    gives up on a message because the run was stopped while it pulled the
    message's objects, the message and its objects are deleted and the
    message's task is finished as stopped. The pushing is replaced
    (``_Loop.push``): it waits for the reply *to the message just
    received*, pushing every other reply it finds on the way with Flower's
    own ``_push_messages``; while it waits it asks the SuperLink every
    :data:`RUN_CHECK` seconds whether the message's run still runs (in a
    thread of its own: Flower's ``get_run`` retries a SuperLink out of reach
    for as long as it takes, and a reply that comes meanwhile goes out; a
    connection error is no answer, any other error is logged once), and when
    it does not, drops the message and finishes its task as stopped. A task
    that ends without a reply ends the wait too: the message gets the error
    reply Flower gives one whose task stopped responding ("ClientApp stopped
    responding."), with a warning, so that the ServerApp hears of it at once
    instead of at its round's timeout. A warm task hears of its end sooner
    through its own change (:mod:`~fedx.flower.task_heartbeat`).

Why
    Flower 1.41's SuperNode pairs replies with messages by count, not by
    identity, and a run stopped while the SuperNode receives one of its
    messages leaves it one message too many (line numbers of flwr 1.41.0):

    1. ``_pull_and_store_message`` (``start_client_internal.py``) creates
       the message's task (``state.create_task``, line 388) and stores the
       message (``state.store_message``, line 411) before it pulls the
       message's objects (line 415). When the run is stopped meanwhile (a
       ServerApp killed while it pushed a round, then ``flwr stop``), the
       pull ends with ``RunNotRunningException``, a ``BaseException`` that
       passes the ``except Exception`` which would delete the message and
       finish the task (lines 425-439); the outer ``except
       RunNotRunningException`` (lines 441-455) only logs "Run ID ... is
       not in `RUNNING` status. Ignoring message ...". The task stays
       claimable, the message stored, its objects never arrive, and the
       ClientApp started for the task asks for them until Flower's
       ``max_time`` (2 hours), then ends without a reply.
    2. A ClientApp takes whichever message of its run is there
       (``runtime_handlers.pull_messages``, line 174:
       ``get_messages_legacy(run_ids=[run_id], is_reply=False, limit=1)``),
       so when a task's heartbeat stops (its process killed, its network
       cut), ``InMemoryNodeState._store_error_replies``
       (``in_memory_nodestate.py``, lines 194-223) answers *every* message
       of the run that a ClientApp took and nobody answered, the stopped
       run's one included, with "ClientApp stopped responding".
    3. ``_push_messages`` waits for *any* reply (lines 469-470: ``while not
       (reply_messages := state.get_messages_legacy(is_reply=True))``),
       pushes what it found and returns, and ``start_client_internal``'s
       loop calls it only after it received a message (lines 260-264: no
       message, ``time.sleep(3)`` and ``continue``). The one reply more than
       messages, the stopped run's error reply, goes out in place of the
       reply to the next message; that reply waits in the SuperNode until
       the message after it arrives, and so on: from then on every reply
       leaves one message late, after its round has given up on the node,
       until the SuperNode is restarted. The container tests saw it (a
       reconnected SuperNode never replied in time again);
       ``tests/system/test_stopped_runs.py`` shows it with processes: no reply from
       that node in any round of the next run.

    And a ClientApp of a stopped run that trains runs to its end, while its
    SuperNode takes no other message. With this change the ClientApp of a
    task finished this way ends at its next request to its SuperNode, which
    refuses the task's token (HTTP 401; Flower's client then stops its own
    process, as on SIGINT, within Flower's 5 s exit): a task waiting for its
    message's objects at once, a running one at its next heartbeat. ``tests/system/test_stopped_runs.py`` checks
    that both end after ``flwr stop`` (with Flower's SuperNode both still run
    30 s later). With the
    warm executor that is within 15 s (up to :data:`RUN_CHECK` until the
    SuperNode sees the stop, 4.5 s to the heartbeat
    (:mod:`~fedx.flower.task_heartbeat`), 5 s to exit); with
    Flower's ``flwr-clientapp`` processes, whose heartbeat this does not
    change, up to about 33 s. The cost: while a ClientApp runs longer than
    :data:`RUN_CHECK`, one ``GetRun`` request to the SuperLink every
    :data:`RUN_CHECK` seconds per SuperNode (the SuperLink logs each at
    INFO); a warm task's heartbeat every 4 s to its own SuperNode.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code;
    1.42 still has both bugs. The fix, as a patch against Flower's
    repository with its reproduction tests: ``patches/flower/``.

Under another Flower
    Where the Flower code this relies on is not the code checked,
    :func:`fedx.flower.install` makes none of ``fedx-supernode``'s changes,
    with one warning in the process's log: the SuperNode then leaves
    stopped runs and pairs replies as that Flower does (with
    ``--poll-interval`` or ``--objects-in-flight``, ``fedx-supernode``
    refuses to start). ``FEDX_STOPPED_RUNS=flower`` keeps Flower's
    behaviour on purpose (for comparisons), with one line (:func:`wanted`).
"""

import importlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

from fedx.flower import replace
from fedx.flower._fingerprints import flower_code

#: The SuperNode's loop (the module whose globals :func:`install` changes).
LOOP = "flwr.supernode.start_client_internal"
#: Seconds between two questions to the SuperLink whether the run of the
#: message whose reply the SuperNode waits for still runs.
RUN_CHECK = 5.0
#: Flower's wait between two looks for a reply (through the loop's ``time``,
#: which ``fedx-supernode --poll-interval`` shortens: fedx.flower.supernode_waits).
REPLY_WAIT = 0.5
#: ``FEDX_STOPPED_RUNS=flower``: Flower's behaviour (for comparisons).
VARIABLE = "FEDX_STOPPED_RUNS"

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supernode.start_client_internal:start_client_internal",
    "flwr.supernode.start_client_internal:_pull_and_store_message",
    "flwr.supernode.start_client_internal:_push_messages",
    "flwr.supernode.nodestate.in_memory_nodestate:InMemoryNodeState._store_error_replies",
    "flwr.supernode.servicer.runtime.runtime_handlers:pull_messages",
    "flwr.supercore.corestate.in_memory_corestate:InMemoryCoreState.finish_task",
    "flwr.supercore.retry.http_retry:make_simple_http_retry_invoker",
    "flwr.superlink.servicer.fleet.fleet_handlers:get_run",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that start_client_internal still calls _pull_and_store_message(state=, object_store=, "
    "receive=, get_run=, ...) and, after it returned a run id, _push_messages(state=, "
    "object_store=, send=, push_object=); that _pull_and_store_message creates the message's "
    "task with state.create_task and stores the message before it pulls the objects, and "
    "still leaves both when the pull raises RunNotRunningException (if it cleans up now, "
    "that part of this change only does it again); that _push_messages still pushes the "
    "replies state.get_messages_legacy(is_reply=True) returns and deletes them; that a "
    "finished task's token is revoked (finish_task) and a Runtime API client answered 401 "
    "stops its process; and that the SuperLink's GetRun refuses a stopped run (HTTP 403, "
    "RunNotRunningException on the SuperNode)"
)


@dataclass
class _Received:
    """The message the SuperNode received last and handed to a ClientApp task."""

    message: Any  # its metadata: what an error reply to it needs
    run_id: int
    task_id: int | None
    get_run: Callable[[int], Any]

    @property
    def message_id(self) -> str:
        return str(self.message.metadata.message_id)


class _RunCheck:
    """Whether a run still runs, asked of the SuperLink in a thread of its own.

    Flower's ``get_run`` retries a connection error for as long as it takes,
    so the loop that waits for a reply never waits on it: it starts a
    question (:meth:`ask`) and reads the answer once there is one
    (:meth:`answer`), pushing the replies that come meanwhile. One question at
    a time, per process. A connection error is no answer; any other error is
    logged once (per kind) and is no answer either.
    """

    def __init__(self) -> None:
        self._asked: tuple[int, Future] | None = None
        self._logged: set[str] = set()

    def ask(self, get_run: Callable[[int], Any], run_id: int) -> None:
        """Ask whether ``run_id`` runs, unless a question is still on its way."""
        if self._asked is not None and not self._asked[1].done():
            return
        future: Future = Future()

        def asking() -> None:
            from flwr.supercore.run import RunNotRunningException  # pylint: disable=C0415

            try:
                get_run(run_id)
                future.set_result(True)
            except RunNotRunningException:
                future.set_result(False)
            except BaseException as err:  # pylint: disable=broad-exception-caught  (read by answer)
                future.set_exception(err)

        self._asked = (run_id, future)
        threading.Thread(target=asking, name="fedx-run-check", daemon=True).start()

    def answer(self, run_id: int) -> bool | None:
        """Whether ``run_id`` runs, once the SuperLink said so; ``None`` while it has not."""
        if self._asked is None or not self._asked[1].done():
            return None
        asked, future = self._asked
        self._asked = None
        if asked != run_id:
            return None
        error = future.exception()
        if error is None:
            return bool(future.result())
        if not _is_connection_error(error):
            kind = type(error).__name__
            if kind not in self._logged:
                self._logged.add(kind)
                from flwr.common import log  # pylint: disable=import-outside-toplevel

                log(
                    WARNING,
                    "fedx: asking the SuperLink whether run %s runs failed (%s: %s); the reply "
                    "is still awaited (said once)",
                    run_id,
                    kind,
                    error,
                )
        return None


def _is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` says the SuperLink could not be reached (it may come back)."""
    import httpx  # pylint: disable=import-outside-toplevel  (Flower's HTTP client)

    return isinstance(error, (httpx.TransportError, ConnectionError, TimeoutError))


class _NotingState:
    """The SuperNode's state, as Flower's ``_pull_and_store_message`` uses it: notes the task it creates."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self.task_id: int | None = None

    def create_task(self, *args: Any, **kwargs: Any) -> int | None:
        self.task_id = self._state.create_task(*args, **kwargs)
        return self.task_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _HandedReplies:
    """The SuperNode's state, whose ``get_messages_legacy`` hands Flower's ``_push_messages`` these replies."""

    def __init__(self, state: Any, replies: list[Any]) -> None:
        self._state = state
        self._replies = replies

    def get_messages_legacy(self, **kwargs: Any) -> list[Any]:
        del kwargs
        replies, self._replies = self._replies, []
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _Loop:
    """Flower's receive and push stages of the SuperNode loop, with fedx's changes around them."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.flowers_pull = loop._pull_and_store_message  # pylint: disable=protected-access
        self.flowers_push = loop._push_messages  # pylint: disable=protected-access
        self.received: _Received | None = None
        self.run_check = _RunCheck()

    def receive(self, *, state: Any, receive: Callable[[], Any], **rest: Any) -> int | None:
        """Flower's ``_pull_and_store_message``; a message of a run stopped meanwhile is dropped."""
        # pylint: disable=import-outside-toplevel
        from flwr.common.constant import Status

        received: list[Any] = []

        def receive_and_note():
            got = receive()
            if got is not None:
                received.append(got[0])
            return got

        noting = _NotingState(state)
        run_id = self.flowers_pull(state=noting, receive=receive_and_note, **rest)
        self.received = None
        if not received:
            return run_id
        message = received[0]
        if run_id is None and noting.task_id is not None:
            tasks = state.get_tasks(task_ids=[noting.task_id])
            if tasks and tasks[0].status.status != Status.FINISHED:
                # Flower gave up on the message without cleaning up: its run was
                # stopped while the message's objects were pulled.
                self._drop(
                    state,
                    rest["object_store"],
                    message.metadata.message_id,
                    message.metadata.run_id,
                    noting.task_id,
                )
            return run_id
        if run_id is not None:
            self.received = _Received(message, run_id, noting.task_id, rest["get_run"])
        return run_id

    def push(self, *, state: Any, object_store: Any, send: Any, push_object: Any) -> None:
        """Push replies until the one to the message received last is pushed (or will never come)."""
        from flwr.common.constant import Status  # pylint: disable=import-outside-toplevel

        received, self.received = self.received, None
        if received is None:  # not after fedx's receive: Flower's own wait for any reply
            self.flowers_push(
                state=state, object_store=object_store, send=send, push_object=push_object
            )
            return
        pushing = {"object_store": object_store, "send": send, "push_object": push_object}
        next_check = time.monotonic() + RUN_CHECK
        task_ended = False
        while True:
            replies = list(state.get_messages_legacy(is_reply=True))
            if replies:
                self.flowers_push(state=_HandedReplies(state, replies), **pushing)
            if any(r.metadata.reply_to_message_id == received.message_id for r in replies):
                return
            if task_ended:  # ended before the look above, and no reply came
                self._reply_lost(state, received, pushing)
                return
            if received.task_id is None:  # no task to wait for (Flower's FAB errors reply at once)
                return
            tasks = state.get_tasks(task_ids=[received.task_id])
            task_ended = not tasks or tasks[0].status.status == Status.FINISHED
            if task_ended:
                continue  # a reply stored before the task ended is there now: look once more
            if self.run_check.answer(received.run_id) is False:
                self._drop(
                    state, object_store, received.message_id, received.run_id, received.task_id
                )
                return
            if time.monotonic() >= next_check:
                self.run_check.ask(received.get_run, received.run_id)
                next_check = time.monotonic() + RUN_CHECK
            self.loop.time.sleep(REPLY_WAIT)  # the loop's own `time` (fedx-supernode's waits)

    def _reply_lost(self, state: Any, received: _Received, pushing: dict[str, Any]) -> None:
        """Answer a message whose ClientApp task ended without a reply as Flower answers one
        whose task stopped responding (an error reply), and forget the message."""
        # pylint: disable=import-outside-toplevel
        from flwr.app import Message
        from flwr.common import log
        from flwr.supercore.inflatable.inflatable_object import (
            get_all_nested_objects,
            get_object_tree,
            no_object_id_recompute,
        )
        from flwr.supernode.nodestate.in_memory_nodestate import CLIENT_APP_CRASHED_ERROR

        reply = Message(CLIENT_APP_CRASHED_ERROR, reply_to=received.message)
        reply.metadata.__dict__["_message_id"] = reply.object_id  # as Flower's error replies
        object_store = pushing["object_store"]
        with no_object_id_recompute():
            object_store.preregister(received.run_id, get_object_tree(reply))
            for object_id, obj in get_all_nested_objects(reply).items():
                object_store.put(object_id, obj.deflate())
        state.record_message_processing_start(received.message_id)
        state.record_message_processing_end(received.message_id)
        log(
            WARNING,
            "fedx: the ClientApp task of message %s of run %s ended without a reply: "
            "replying with Flower's error (%s)",
            received.message_id,
            received.run_id,
            CLIENT_APP_CRASHED_ERROR.reason,
        )
        self.flowers_push(state=_HandedReplies(state, [reply]), **pushing)
        # Flower's push forgets the message; its objects go here.
        object_store.delete(received.message_id)

    @staticmethod
    def _drop(
        state: Any,
        object_store: Any,
        message_id: str,
        run_id: int,
        task_id: int | None,
        why: str = "the run was stopped",
        level: int = INFO,
    ) -> None:
        """Delete a message and its objects; finish its task, if given, as stopped."""
        from flwr.common import log  # pylint: disable=import-outside-toplevel
        from flwr.common.constant import SubStatus  # pylint: disable=import-outside-toplevel

        state.delete_messages(message_ids=[message_id])
        object_store.delete(message_id)
        if task_id is not None:
            state.finish_task(task_id, sub_status=SubStatus.STOPPED, details=f"fedx: {why}")
        log(
            level,
            "fedx: message %s of run %s dropped (%s)%s",
            message_id,
            run_id,
            why,
            f"; its ClientApp task {task_id} ended" if task_id is not None else "",
        )


def wanted() -> bool:
    """Whether ``fedx-supernode`` should make this change: not with ``FEDX_STOPPED_RUNS=flower``
    (Flower's behaviour on purpose, said in one line)."""
    if os.environ.get(VARIABLE, "").strip().lower() == "flower":
        from flwr.common import log  # pylint: disable=import-outside-toplevel

        log(INFO, "fedx: %s=flower: stopped runs are left as Flower leaves them", VARIABLE)
        return False
    return True


def apply():
    """In this process, make Flower's SuperNode loop drop stopped runs' messages and pair replies.

    Made by :func:`fedx.flower.install`; idempotent. Returns what undoes it.
    """
    loop = importlib.import_module(LOOP)
    before = {name: getattr(loop, name) for name in ("_pull_and_store_message", "_push_messages")}
    if isinstance(getattr(before["_pull_and_store_message"], "__self__", None), _Loop):
        return lambda: None
    changed = _Loop(loop)
    replace(loop, "_pull_and_store_message", changed.receive)
    replace(loop, "_push_messages", changed.push)

    def undo() -> None:
        for name, value in before.items():
            setattr(loop, name, value)

    return undo
