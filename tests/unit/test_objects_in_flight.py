"""fedx.flower.objects_in_flight: how many objects of a message Flower's pulls and pushes move at once.

The Flower code it changes is the code it was checked against
(tests/unit/test_flower_changes.py checks every module of fedx.flower), and on
the installed Flower the pulls and pushes then keep N objects in flight,
more than the machine's cores. fedx-supernode's option
on real processes: tests/system/test_link_faults.py runs the slow-link federation;
benchmarks/links.py measures what it pays.
"""

import os
import sys
import threading
import time

import pytest
from flwr.supercore.inflatable import inflatable_utils

from fedx import flower
from fedx.deploy.local import FederationSpec
from fedx.flower import objects_in_flight
from fedx.flower.objects_in_flight import (
    KEYWORDS,
    VARIABLE,
    restore_objects_in_flight,
    set_objects_in_flight,
)


@pytest.fixture(autouse=True)
def flowers_count(monkeypatch):
    """Flower's 2 and its cap at the cores during every test, and what was there after it."""
    for name, keyword in KEYWORDS.items():
        monkeypatch.setitem(getattr(inflatable_utils, name).__kwdefaults__, keyword, 2)
    monkeypatch.setattr(
        inflatable_utils, "get_num_workers", flower.flowers_own(inflatable_utils, "get_num_workers")
    )


def most_at_once(move, count: int = 24) -> int:
    """The most objects ``move(ids, fn)`` had in ``fn`` at once, each taking 50 ms."""
    lock, now, most = threading.Lock(), [0], [0]

    def one(*_args) -> bytes:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return b"content"

    move([f"object-{i}" for i in range(count)], one)
    return most[0]


def pull(ids, one) -> None:
    assert len(inflatable_utils.pull_objects(ids, one)) == len(ids)


def push(ids, one) -> None:
    inflatable_utils.push_object_contents_from_iterable(((i, b"content") for i in ids), one)


def test_pulls_and_pushes_move_the_objects_asked_for_at_once_more_than_the_cores():
    assert most_at_once(pull) <= 2 and most_at_once(push) <= 2  # Flower's
    before = set_objects_in_flight(12)
    assert before == {"max_concurrent_pulls": 2, "max_concurrent_pushes": 2}
    assert objects_in_flight.objects_in_flight() == {"pulls": 12, "pushes": 12}
    assert most_at_once(pull) == most_at_once(push) == 12 > (os.cpu_count() or 1) // 2
    restore_objects_in_flight(before)
    assert objects_in_flight.objects_in_flight()["pulls"] == min(2, os.cpu_count() or 1)


def test_bad_counts_and_another_flower_are_refused(monkeypatch, caplog):
    for count in (0, objects_in_flight.MOST + 1):
        with pytest.raises(ValueError, match="objects in flight must be in"):
            set_objects_in_flight(count)
    with pytest.raises(ValueError, match="must be in"):
        FederationSpec(1, state_dir=".", insecure=True, objects_in_flight=0)
    monkeypatch.setenv(VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"{VARIABLE}='lots'"):
        objects_in_flight.from_environment()

    def pull_objects(object_ids, pull_object_fn, *, backoff=1):  # no max_concurrent_pulls
        del object_ids, pull_object_fn, backoff

    monkeypatch.setattr(inflatable_utils, "pull_objects", pull_objects)
    with pytest.raises(RuntimeError, match="flwr 1.36"):
        set_objects_in_flight(8)
    # fedx's ServerApp reads the environment: a bad value keeps Flower's, and says so.
    from fedx import server_app, simulation  # pylint: disable=import-outside-toplevel

    monkeypatch.undo()
    monkeypatch.setattr(simulation, "in_simulation_engine", lambda: False)
    for function in (
        inflatable_utils.pull_objects,
        inflatable_utils.pull_and_inflate_object_from_tree,
    ):
        monkeypatch.setattr(function, "__kwdefaults__", dict(function.__kwdefaults__))
    monkeypatch.setenv(VARIABLE, "lots")
    with caplog.at_level("WARNING", logger="flwr"):
        server_app.change_flower()
    assert "objects in flight kept: FEDX_OBJECTS_IN_FLIGHT='lots'" in caplog.text
    assert inflatable_utils.get_num_workers(8) == min(8, os.cpu_count() or 1)


def test_the_serverapp_and_fedx_supernode_take_the_count(monkeypatch):
    from fedx import server_app, simulation  # pylint: disable=import-outside-toplevel
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(simulation, "in_simulation_engine", lambda: False)  # a deployment's
    for function in (
        inflatable_utils.pull_objects,
        inflatable_utils.pull_and_inflate_object_from_tree,
    ):
        monkeypatch.setattr(function, "__kwdefaults__", dict(function.__kwdefaults__))
    monkeypatch.setenv(VARIABLE, "6")
    server_app.change_flower()  # as fedx's ServerApp's main does first
    assert objects_in_flight.objects_in_flight() == {"pulls": 6, "pushes": 6}

    started = []
    monkeypatch.setattr(sys, "argv", ["fedx-supernode"])  # main hands Flower the rest
    monkeypatch.setattr("flwr.supernode.cli.flower_supernode", lambda: started.append(1))
    supernode.main(["--objects-in-flight", "9", "--insecure"])
    assert started and objects_in_flight.objects_in_flight() == {"pulls": 9, "pushes": 9}
    with pytest.raises(SystemExit, match="fedx-supernode: objects in flight must be in"):
        supernode.main(["--objects-in-flight", "0"])
    spec = FederationSpec(2, state_dir=".", insecure=True, objects_in_flight=9)
    command = spec.supernode_command(1)
    assert command[0].endswith("fedx-supernode")
    assert command[command.index("--objects-in-flight") + 1] == "9"
