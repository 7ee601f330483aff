"""Change: a warm ClientApp task says while it waits for its input, during which it holds no slot.

What it changes
    In the process of a ClientApp task that fedx's warm executor forks
    (:mod:`fedx.deploy.warm_executor`) only: the module global
    ``pull_task_input`` of ``flwr.supernode.runtime.run_clientapp``, which
    Flower's ``run_clientapp`` calls first to get the task's message,
    context, run and FAB from its SuperNode, is wrapped
    (:func:`report_input_waits`; :func:`apply`, through
    :func:`fedx.flower.install`). Flower's function runs as before; a
    callback is told when the task starts waiting for that input and when
    the wait is over (the input arrived, or the pull failed).

Why
    The warm executor runs at most ``max_tasks`` ClientApp tasks at once
    (one, with 3 SuperNodes on 2 cores): a slot stands for cores. A task
    waiting for its input uses none, and its input may never come. Flower
    1.41's SuperNode creates a message's task and stores the message before
    it pulls the message's objects from the SuperLink
    (``flwr.supernode.start_client_internal._pull_and_store_message``). When
    the run is stopped while it pulls them (a ServerApp killed while it
    pushed a round's model, then ``flwr stop``), the pull ends with
    ``RunNotRunningException``, a ``BaseException`` that passes the
    ``except Exception`` which would delete the message and finish the task:
    the SuperNode only logs "Run ID ... is not in `RUNNING` status. Ignoring
    message ...". The task stays claimable, its message stays registered
    with objects that never arrive, and a process started for it asks its
    SuperNode for them until Flower's ``max_time`` (2 hours). Holding the
    only slot, that task kept every later task of its SuperNode, of any run,
    pending, and the SuperNode, which handles one message at a time, waited
    for a reply that never came: the container test's run resumed after
    such a stop stalled at its first message (tests/system/test_containers.py, 2
    runs of 2 since the task limit; py-spy: the stopped run's task in
    ``pull_task_input`` -> ``pull_objects``, ObjectUnavailable at every
    ask). Not counted while it waits, such a task holds up no one; under
    ``flower-supernode`` it still waits, as a process of Flower's own
    executor would, until Flower gives up (``fedx-supernode`` ends it at
    once: :mod:`fedx.flower.stopped_runs`).

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.

Under another Flower
    Where ``pull_task_input`` or ``run_clientapp`` is not the code checked,
    :func:`fedx.flower.install` makes none of the task's changes, with one
    warning in the task's log: its tasks hold their slot from their start
    to their end, so one whose input never comes holds it until Flower
    gives up, as before this change.
"""

import importlib
from collections.abc import Callable

from fedx.flower import flowers_own, replace
from fedx.flower._fingerprints import flower_code

#: Where Flower's ClientApp task pulls its input (the module global ``pull_task_input``).
RUN_CLIENTAPP = "flwr.supernode.runtime.run_clientapp"

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supernode.runtime.run_clientapp:pull_task_input",
    "flwr.supernode.runtime.run_clientapp:run_clientapp",
    "flwr.supernode.start_client_internal:_pull_and_store_message",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_clientapp still gets the task's input first, through the module global "
    "pull_task_input(client), and that pull_task_input only asks the SuperNode (PullTaskInput, "
    "PullMessages, the message's objects) and computes nothing; and whether "
    "_pull_and_store_message still leaves a claimable task whose message's objects never "
    "arrive when the run stops while it pulls them (if it no longer does, this change only "
    "keeps a waiting task from holding a slot)"
)


def report_input_waits(waiting: Callable[[bool], None]):
    """In this process, call ``waiting(True)`` when Flower's ClientApp task starts pulling its input, ``waiting(False)`` when it stops.

    Calling it again replaces the callback (Flower's function is wrapped
    once). Returns what undoes it.
    """
    flower_task = importlib.import_module(RUN_CLIENTAPP)
    flowers = flowers_own(flower_task, "pull_task_input")

    def pull_task_input(client):
        waiting(True)
        try:
            return flowers(client)
        finally:
            waiting(False)

    pull_task_input.flowers = flowers  # type: ignore[attr-defined]
    pull_task_input.__doc__ = flowers.__doc__
    return replace(flower_task, "pull_task_input", pull_task_input)


def apply(waiting: Callable[[bool], None]):
    """The change (:func:`report_input_waits`), as :func:`fedx.flower.install` makes it."""
    return report_input_waits(waiting)
