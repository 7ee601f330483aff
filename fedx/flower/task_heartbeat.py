"""Change: a warm ClientApp task hears within seconds that its SuperNode has ended it.

What it changes
    In the process of a ClientApp task that fedx's warm executor forks
    (:mod:`fedx.deploy.warm_executor`) only (:func:`apply`, through
    :func:`fedx.flower.install`): the module global
    ``HEARTBEAT_DEFAULT_INTERVAL`` of ``flwr.supercore.heartbeat``, by which
    Flower's ``HeartbeatSender`` spaces a task's heartbeats, becomes
    :data:`TASK_HEARTBEAT_INTERVAL`: the heartbeat goes out every 3.5-4.5 s
    instead of 17.5-22.5 s.

Why
    A task's heartbeat is how its process learns that its SuperNode has
    ended the task: the SuperNode refuses the task's token (HTTP 401), and
    Flower's client then stops its own process. ``fedx-supernode`` ends the
    task of a run stopped while the task runs
    (:mod:`~fedx.flower.stopped_runs`); with Flower's heartbeat a training
    task of a stopped run went on for up to 22.5 s more, holding its
    SuperExec's slot. With this change a warm task's process ends within
    15 s of the stop (``tests/system/test_stopped_runs.py`` stops a run while a
    task trains and checks that the task ends). The
    cost: one heartbeat every 4 s from each running task to its own
    SuperNode.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    ``flwr-clientapp`` has no flag or setting for the heartbeat's interval.

Under another Flower
    Where ``HeartbeatSender._run`` is not the code checked,
    :func:`fedx.flower.install` makes none of the task's changes, with one
    warning in the task's log: the task hears of its end at Flower's pace.
"""

import importlib

from fedx.flower._fingerprints import flower_code

#: Flower's heartbeat module, whose ``HEARTBEAT_DEFAULT_INTERVAL`` this sets.
HEARTBEAT = "flwr.supercore.heartbeat"
#: ``HEARTBEAT_DEFAULT_INTERVAL`` of a warm task's heartbeat: Flower sends it
#: every (interval - 5 s) x 0.7-0.9, 3.5-4.5 s with 10 (Flower's 30: 17.5-22.5 s).
TASK_HEARTBEAT_INTERVAL = 10

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supercore.heartbeat:HeartbeatSender._run",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that HeartbeatSender._run still waits (HEARTBEAT_DEFAULT_INTERVAL - "
    "HEARTBEAT_CALL_TIMEOUT) x (0.8 +- 0.1) between heartbeats, reading the module global "
    "HEARTBEAT_DEFAULT_INTERVAL each time"
)


def apply():
    """In this ClientApp task's process, send Flower's task heartbeat every 3.5-4.5 s.

    Made by :func:`fedx.flower.install`; returns what undoes it.
    """
    heartbeat = importlib.import_module(HEARTBEAT)
    before = heartbeat.HEARTBEAT_DEFAULT_INTERVAL
    heartbeat.HEARTBEAT_DEFAULT_INTERVAL = TASK_HEARTBEAT_INTERVAL

    def undo() -> None:
        heartbeat.HEARTBEAT_DEFAULT_INTERVAL = before

    return undo
