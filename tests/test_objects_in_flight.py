"""fedx.flower.objects_in_flight: how many objects of a message Flower's pulls and pushes move at once.

The Flower code it changes is the code it was checked against (each
fingerprint, as tests/test_flower_changes.py checks every module of
fedx.flower), and on the installed Flower the pulls and pushes then keep N
objects in flight, more than the machine's cores. fedx-supernode's option
on real processes: tests/test_link_faults.py runs the slow-link federation;
benchmarks/links.py measures what it pays.
"""

import hashlib
import importlib
import inspect
import os
import sys
import threading
import time

import pytest
from flwr.supercore.inflatable import inflatable_utils

from fedx.deploy.local import FederationSpec
from fedx.flower import objects_in_flight
from fedx.flower.objects_in_flight import (
    KEYWORDS,
    VARIABLE,
    restore_objects_in_flight,
    set_objects_in_flight,
)
from tests.helpers import OneMessageGrid, PushedMessage


@pytest.fixture(autouse=True)
def flowers_count(monkeypatch):
    """Flower's 2 and its cap at the cores during every test, and what was there after it."""
    for name, keyword in KEYWORDS.items():
        monkeypatch.setitem(getattr(inflatable_utils, name).__kwdefaults__, keyword, 2)
    monkeypatch.setattr(
        inflatable_utils, "get_num_workers", objects_in_flight._FLOWER_GET_NUM_WORKERS
    )
    monkeypatch.setattr(objects_in_flight, "_environment_refused", False)


@pytest.mark.parametrize("name", sorted(objects_in_flight.FLOWER_CODE))
def test_the_flower_code_it_changes_is_the_code_it_was_checked_against(name):
    module_name, _, qualname = name.partition(":")
    code = importlib.import_module(module_name)
    for part in qualname.split("."):
        code = getattr(code, part)
    fingerprint = hashlib.sha256(inspect.getsource(code).encode()).hexdigest()[:16]
    assert fingerprint == objects_in_flight.FLOWER_CODE[name], (
        f"Flower's {name} changed: re-check {objects_in_flight.RECHECK}"
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
    with pytest.raises(RuntimeError, match="flwr 1.41"):
        set_objects_in_flight(8)
    # The ServerApp's exchanges read the environment: kept Flower's, said so once.
    monkeypatch.setenv(VARIABLE, "8")
    with caplog.at_level("WARNING", logger="flwr"):
        objects_in_flight.apply_environment()
        objects_in_flight.apply_environment()
    assert caplog.text.count("objects in flight kept") == 1


def test_the_serverapps_exchange_and_fedx_supernode_take_the_count(monkeypatch):
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel
    from fedx.messaging import send_and_collect  # pylint: disable=import-outside-toplevel

    monkeypatch.setenv(VARIABLE, "6")  # no reply ever: one push, pulls until the timeout
    send_and_collect(
        OneMessageGrid(), [PushedMessage()], timeout=0.05, first_interval=0.01, max_interval=0.2
    )
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
