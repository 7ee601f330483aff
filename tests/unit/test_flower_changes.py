"""fedx's changes to Flower's internals (fedx/flower/): made to the Flower code they were checked against, and doing what they say.

For every module of :mod:`fedx.flower`: each piece of Flower code it names in
``FLOWER_CODE`` has, in the installed Flower, the source recorded for that
release (its fingerprint: the first 16 hex digits of the SHA-256 of
``inspect.getsource``), so that a Flower upgrade that touches it fails here
and names the change, the Flower code and what to re-check; the module says
what it changes, why, against which Flower and what happens under another;
and nothing else in fedx imports Flower's internals. The installer
(:func:`fedx.flower.install`) makes a process's changes in one order, all or
none: on a Flower whose code differs (a changed copy of a Flower function, in
process here; a changed copy of Flower on a whole simulation run in
tests/system/test_flower_mismatch.py) it makes none, says so in one warning, and
Flower's own code runs. Then a behaviour test per change on the installed
Flower. The parts of fedx that the changes
plug in are tested on their own: the actor pool, the feeder's passes and
fedx's actor on Ray in tests/unit/test_ray_backend.py and tests/system/test_ray_backend.py, the warm executor and
fedx-supernode on real processes in tests/unit/test_warm_executor.py.
"""

import ast
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import logging
import math
import pkgutil
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, RecordDict
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.backend import raybackend
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.superexec import run_superexec

import fedx.flower
from fedx import flower
from fedx.flower import (
    IdleBackoff,
    clientapp_actor,
    clientapp_task,
    engine_threads,
    linkstate_stores,
    object_pulls,
    ray_backend,
    stopped_runs,
    superexec_executor,
    superlink_middleware,
    supernode_waits,
    task_heartbeat,
    task_input,
    wire,
)
from fedx.flower.object_pulls import (
    RETRY_KEYWORDS,
    pull_functions,
    restore_object_pulls,
    retry_object_pulls_after,
)
from tests.support.changed_flower import changed_copy
from tests.support.helpers import REPO, OneMessageGrid, PushedMessage, modules_imported_by

#: The modules of fedx.flower, each a change (or, for ``wire``, a use) of Flower's internals.
CHANGES = sorted(
    info.name
    for info in pkgutil.iter_modules(fedx.flower.__path__)
    if not info.name.startswith("_")
)
#: What the rest of fedx may import of Flower: its documented API (``flwr.app``,
#: ``flwr.clientapp``, ``flwr.serverapp`` and its strategies, whose
#: ``strategy_utils`` Flower's how-to guides import, ``flwr.common``'s records,
#: logger and constants).
PUBLIC_FLOWER = (
    "flwr.app",
    "flwr.clientapp",
    "flwr.serverapp",
    "flwr.serverapp.strategy",
    "flwr.serverapp.strategy.strategy_utils",
    "flwr.common",
    "flwr.common.constant",
)
DOCSTRING_PARTS = ("Why", "Checked against", "Under another Flower")


def fingerprint(name: str) -> str:
    """The first 16 hex digits of the SHA-256 of the source of ``"module:qualified.name"``.

    The source is read from the module's file, not from the live attribute:
    a test that ran earlier in this process may have put fedx's replacement
    in its place (``fedx.simulation.install()``).
    """
    module_name, _, qualname = name.partition(":")
    source = inspect.getsource(importlib.import_module(module_name))
    body = ast.parse(source).body
    node = None
    for part in qualname.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name == part
        )
        body = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    code = "".join(inspect.getblock(source.splitlines(keepends=True)[first:]))
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def flower_code() -> list[tuple[str, str]]:
    return [(change, name) for change in CHANGES for name in module(change).FLOWER_CODE]


def module(change: str):
    return importlib.import_module(f"fedx.flower.{change}")


# ----------------------------------------------------------------------
# Every change: its Flower code, its description, its place
# ----------------------------------------------------------------------


INSTALLED = importlib.metadata.version("flwr")


@pytest.mark.parametrize(("change", "name"), flower_code())
def test_the_flower_code_a_change_relies_on_is_the_code_it_was_checked_against(change, name):
    changed = module(change)
    recorded = changed.FLOWER_CODE[name]
    # Every checked release has its fingerprint (None: that release has no such code).
    assert set(recorded) == set(fedx.flower.CHECKED_FLWR), (change, name, recorded)
    try:
        now = fingerprint(name)
    except (ImportError, AttributeError, OSError, TypeError, StopIteration):
        now = None
    summary = changed.__doc__.splitlines()[0]
    assert INSTALLED in recorded and now == recorded[INSTALLED], (
        f"fedx.flower.{change} ({summary}): Flower's {name} is not the code this change was "
        f"checked against (flwr {', '.join(fedx.flower.CHECKED_FLWR)}; installed: flwr "
        f"{INSTALLED}). Re-check {changed.RECHECK}. Then record its fingerprint {now!r} for "
        f"{INSTALLED!r} in fedx/flower/_fingerprints.py (was {recorded}), the release in "
        f"fedx.flower.CHECKED_FLWR, and the tables of docs/flower-changes.md."
    )
    # What the installer computes at run time, from the live object, is the same.
    assert flower.fingerprint(name) == now


@pytest.mark.parametrize("change", CHANGES)
def test_every_change_says_what_why_for_which_flower_and_is_listed(change):
    changed = module(change)
    assert changed.FLOWER_CODE and isinstance(changed.RECHECK, str), change
    doc = changed.__doc__
    assert "\nWhat it changes\n" in doc or "\nWhat it uses\n" in doc, change
    for part in DOCSTRING_PARTS:
        assert f"\n{part}\n" in doc, f"fedx.flower.{change}'s docstring has no '{part}' part"
    for release in fedx.flower.CHECKED_FLWR:
        assert release in doc.split("\nChecked against\n")[1], (change, release)
    assert f":mod:`~fedx.flower.{change}`" in fedx.flower.__doc__, f"fedx.flower lists no {change}"
    page = (REPO / "docs" / "flower-changes.md").read_text()
    assert f"fedx/flower/{change}.py" in page, f"docs/flower-changes.md has no row for {change}"
    for name, recorded in changed.FLOWER_CODE.items():
        assert name.replace(":", ".") in page, f"docs/flower-changes.md does not name {name}"
        for fingerprint_of_release in filter(None, recorded.values()):
            assert fingerprint_of_release in page, (
                f"docs/flower-changes.md does not list {name}'s fingerprint {fingerprint_of_release}"
            )
    if change != "wire":  # a use, made by no process
        assert callable(getattr(changed, "apply", None)) or change in (
            "clientapp_actor",
            "linkstate_stores",
        ), change
        assert any(change in changes for changes in flower.PROCESSES.values()), change


def test_importing_the_changes_imports_no_flower_internals():
    """A change imports the Flower code it changes when it is checked and made, not before."""
    changes = ["fedx.flower", *(f"fedx.flower.{change}" for change in CHANGES)]
    assert modules_imported_by(changes, "flwr", already=("flwr.app", "flwr.common")) == []


# ----------------------------------------------------------------------
# The installer: one order, all or none, the Flower code checked first
# ----------------------------------------------------------------------


def test_every_process_makes_its_changes_in_the_one_order():
    assert sorted(flower.ORDER) == sorted(set(flower.ORDER)) == [c for c in CHANGES if c != "wire"]
    for process, changes in flower.PROCESSES.items():
        assert list(changes) == [c for c in flower.ORDER if c in changes], process
    # The SuperNode's waits wrap the stopped-runs push: stopped runs come first.
    order = flower.ORDER
    assert order.index("stopped_runs") < order.index("supernode_waits")
    with pytest.raises(ValueError, match="unknown process"):
        flower.install("flwr-serverapp", {})
    with pytest.raises(ValueError, match="makes no change ray_backend"):
        flower.install("fedx-supernode", {"ray_backend": {}})


def test_the_installer_makes_all_or_none_of_a_processs_changes(supernode_loop, monkeypatch):
    """A change that fails while it is made undoes the ones made before it."""
    loop = supernode_loop
    monkeypatch.setattr(loop, "time", loop.time)
    flowers = {n: getattr(loop, n) for n in ("_pull_and_store_message", "_push_messages", "time")}

    def fails(**arguments):
        raise RuntimeError("made to fail")

    monkeypatch.setattr(supernode_waits, "apply", fails)
    with pytest.raises(RuntimeError, match="made to fail"):
        flower.install("fedx-supernode", {"supernode_waits": {"interval": 0.2}, "stopped_runs": {}})
    assert {n: getattr(loop, n) for n in flowers} == flowers  # stopped_runs undone
    monkeypatch.undo()


@pytest.fixture
def flowers_serverapp_pulls(monkeypatch):
    """Flower's object pull keywords during the test, and what was there after it."""
    for function in pull_functions():
        monkeypatch.setattr(function, "__kwdefaults__", dict(function.__kwdefaults__))


def test_a_changed_flower_function_keeps_flowers_code_with_one_warning(
    supernode_loop, monkeypatch, caplog
):
    """The mismatch: a copy of Flower's own _push_messages, changed by one line, in Flower's place.

    The installer makes none of fedx-supernode's changes, says so once, naming the change, the
    Flower code and the releases it was checked against; Flower's (changed) loop runs, with
    Flower's behaviour: the older reply goes out for the newer message. With the options that
    need the changes, fedx-supernode refuses to start, with the same words.
    """
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    copy = changed_copy(
        supernode_loop._push_messages, 'log(INFO, "a changed Flower pushes replies")'
    )
    monkeypatch.setattr(supernode_loop, "_push_messages", copy)
    monkeypatch.setattr(supernode_loop, "time", supernode_loop.time)
    monkeypatch.setattr(flower._installer, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for _ in range(2):
            made = flower.install("fedx-supernode", supernode.changes())
            assert not made and made.made == ()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    print(warning)
    checked = ", ".join(fedx.flower.CHECKED_FLWR)
    assert warning == (
        f"fedx: Flower's code is not the code fedx's changes to it were checked against (flwr "
        f"{checked}; installed: flwr {INSTALLED}): stopped_runs relies on "
        "flwr.supernode.start_client_internal:_push_messages. None of this process's changes "
        "(stopped_runs; fedx-supernode) is made: Flower's own code runs"
    )
    # Flower's code runs: the loop's functions are Flower's, the changed one included.
    assert supernode_loop._push_messages is copy
    assert not isinstance(getattr(supernode_loop._pull_and_store_message, "__self__", None),
                          stopped_runs._Loop)  # fmt: skip
    # ... with Flower's behaviour: the orphan's reply goes out in place of the new message's.
    node = OneRunSuperNode(supernode_loop)
    node.stopped = True
    orphan, _ = node.receive(supernode_loop._pull_and_store_message, 0)
    node.take()
    node.reply(orphan, Error(0, "ClientApp stopped responding"))
    node.stopped = False
    message, _ = node.receive(supernode_loop._pull_and_store_message, 1)
    _, taken = node.take()
    answer = threading.Timer(0.3, node.reply, (taken, RecordDict({"arrays": ArrayRecord()})))
    answer.start()
    node.push(supernode_loop._push_messages)
    answer.join()
    assert node.sent == [orphan.metadata.message_id]  # the new message's reply stays behind
    # The options that need the changes: fedx-supernode refuses to start, saying why.
    monkeypatch.setattr(supernode, "run_flower_supernode", lambda arguments: None)
    with pytest.raises(SystemExit) as refused:
        supernode.main(["--poll-interval", "0.2", "--insecure"])
    assert str(refused.value).startswith("fedx-supernode: fedx: Flower's code is not the code")
    assert "stopped_runs relies on flwr.supernode.start_client_internal:_push_messages" in str(
        refused.value
    )
    assert str(refused.value).endswith("; use flower-supernode")
    assert supernode_loop._push_messages is copy


def test_a_replacement_of_fedxs_own_hides_no_flower_code(supernode_loop, monkeypatch):
    """After fedx's changes, the installer still fingerprints Flower's code beneath them."""
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(supernode_loop, "time", supernode_loop.time)
    name = "flwr.supernode.start_client_internal:_push_messages"
    flowers = flower.fingerprint(name)
    assert flower.install("fedx-supernode", supernode.changes(0.2))
    assert supernode_loop._push_messages.__wrapped__.__self__.flowers_push is flower.flowers_own(
        supernode_loop, "_push_messages"
    )
    assert flower.fingerprint(name) == flowers
    assert flower.install("fedx-supernode", supernode.changes(0.2))  # again: still checked


def _flower_modules_named(path) -> list[tuple[int, str]]:
    """Flower modules that a fedx file imports or names as a string in its code."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.fullmatch(r"flwr(\.\w+)+(:\w+)?", node.value)
        ):
            named.append((node.lineno, node.value.split(":")[0]))
    return [(line, name) for line, name in named if name == "flwr" or name.startswith("flwr.")]


def test_nothing_else_in_fedx_reaches_into_flowers_internals():
    outside = []
    for path in sorted((REPO / "fedx").rglob("*.py")):
        if path.parent == REPO / "fedx" / "flower":
            continue
        for line, name in _flower_modules_named(path):
            if name not in PUBLIC_FLOWER:
                outside.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not outside, (
        "Flower's internals used outside fedx/flower/ (make the change, or the use, a module "
        "of fedx.flower): " + "; ".join(outside)
    )


# ----------------------------------------------------------------------
# object_pulls: how soon Flower asks again for an object not there yet
# ----------------------------------------------------------------------

#: Flower 1.41's retry keywords (a ServerApp's exchange run earlier in this
#: process may have changed them: fedx's ServerApp sets them for its process).
FLOWERS = {
    "initial_backoff": inflatable_utils.PULL_INITIAL_BACKOFF,
    "backoff_cap": inflatable_utils.PULL_BACKOFF_CAP,
    "max_tries_per_object": inflatable_utils.PULL_MAX_TRIES_PER_OBJECT,
}


@pytest.fixture(autouse=True)
def flowers_waits(monkeypatch):
    """Flower's retry keywords during every test, and what was there before after it."""
    for function in pull_functions():
        for keyword in RETRY_KEYWORDS:
            monkeypatch.setitem(function.__kwdefaults__, keyword, FLOWERS[keyword])


def pulls_of_an_object_that_arrives_late(late: int) -> list[float]:
    """When Flower's ``pull_objects`` asked for an object that is there from the ``late``-th ask."""
    asked = []

    def pull(object_id: str) -> bytes:
        asked.append(time.monotonic())
        if len(asked) < late:
            raise inflatable_utils.ObjectUnavailableError(object_id)
        return b"content"

    assert inflatable_utils.pull_objects(["object"], pull) == {"object": b"content"}
    return asked


def test_a_short_first_wait_and_cap_replace_flowers_1_to_10_s():
    before = retry_object_pulls_after(0.02, 0.05)
    assert (
        before == FLOWERS == {"initial_backoff": 1, "backoff_cap": 10, "max_tries_per_object": 500}
    )
    for function in pull_functions():
        assert function.__kwdefaults__["initial_backoff"] == 0.02
        assert function.__kwdefaults__["backoff_cap"] == 0.05
        # The wait is bounded by Flower's max_time alone (500 short tries would end it early).
        assert function.__kwdefaults__["max_tries_per_object"] is None
        assert function.__kwdefaults__["max_time"] == 7200
    asked = pulls_of_an_object_that_arrives_late(5)
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:], strict=False)]
    # Flower would wait 0.8-1.2 s before the second ask and 1.6-2.4 s before the third.
    assert len(gaps) == 4 and max(gaps) < 0.5, gaps
    restore_object_pulls(before)
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1
    assert inflatable_utils.pull_and_inflate_object_from_tree.__kwdefaults__["backoff_cap"] == 10


def test_a_first_wait_of_a_second_or_more_keeps_flowers_waits():
    retry_object_pulls_after(3.0)  # fedx's ServerApp with FEDX_REPLY_PULL_INTERVAL=3
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 10
    retry_object_pulls_after(0.5, 0.25)  # a longest wait below the first counts as the first
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 0.5


def test_bad_waits_and_another_flower_are_refused(monkeypatch):
    for first in (0, -1.0):
        with pytest.raises(ValueError, match="must be positive"):
            retry_object_pulls_after(first)

    def pull_objects(object_ids, pull_object_fn, *, backoff=1):  # no initial_backoff
        del object_ids, pull_object_fn, backoff

    monkeypatch.setattr(object_pulls, "pull_functions", lambda: [pull_objects])
    with pytest.raises(RuntimeError, match="flwr 1.36"):
        retry_object_pulls_after(0.1)


@pytest.fixture
def deployed_serverapp(monkeypatch):
    """fedx's ServerApp module as a deployment's ServerApp process runs it (no simulation engine)."""
    from fedx import server_app, simulation  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(simulation, "in_simulation_engine", lambda: False)
    monkeypatch.delenv("FEDX_REPLY_PULL_INTERVAL", raising=False)
    monkeypatch.delenv("FEDX_OBJECTS_IN_FLIGHT", raising=False)
    monkeypatch.setattr(
        inflatable_utils, "get_num_workers", flower.flowers_own(inflatable_utils, "get_num_workers")
    )
    return server_app


def test_the_serverapp_asks_for_reply_objects_at_the_pace_of_its_reply_pulls(
    deployed_serverapp, monkeypatch
):
    from fedx.messaging import send_and_collect  # pylint: disable=import-outside-toplevel

    # The exchange itself changes nothing of Flower's (a strategy in anyone's ServerApp).
    send_and_collect(
        OneMessageGrid(), [PushedMessage()], timeout=0.05, first_interval=0.01, max_interval=0.2
    )
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1
    deployed_serverapp.change_flower()  # as fedx's ServerApp's main does first
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 0.02
    assert inflatable_utils.pull_objects.__kwdefaults__["backoff_cap"] == 0.25
    monkeypatch.setenv("FEDX_REPLY_PULL_INTERVAL", "3")  # Flower's pace: Flower's waits
    monkeypatch.setitem(inflatable_utils.pull_objects.__kwdefaults__, "initial_backoff", 1)
    deployed_serverapp.change_flower()
    assert inflatable_utils.pull_objects.__kwdefaults__["initial_backoff"] == 1


def test_a_serverapp_on_a_changed_flower_keeps_its_waits_and_the_exchange_goes_on(
    deployed_serverapp, monkeypatch, caplog
):
    from fedx import messaging  # pylint: disable=import-outside-toplevel

    copy = changed_copy(inflatable_utils.pull_objects, "    backoff_cap = max(backoff_cap, 1)")
    monkeypatch.setattr(inflatable_utils, "pull_objects", copy)
    monkeypatch.setattr(flower._installer, "_WARNED", set())
    monkeypatch.setenv("FEDX_OBJECTS_IN_FLIGHT", "8")

    class Reply:
        class metadata:  # pylint: disable=invalid-name
            reply_to_message_id = "id-1"

    grid = OneMessageGrid([Reply()])  # the reply comes at the first pull
    with caplog.at_level("WARNING", logger="flwr"):
        for _ in range(2):
            deployed_serverapp.change_flower()
            replies = messaging.send_and_collect(grid, [PushedMessage()], timeout=1.0)
            assert len(replies) == 1 and isinstance(replies[0], Reply)
    assert caplog.text.count("fedx: Flower's code is not the code") == 1
    assert (
        "object_pulls relies on flwr.supercore.inflatable.inflatable_utils:pull_objects; "
        "objects_in_flight relies on flwr.supercore.inflatable.inflatable_utils:pull_objects. "
        "None of this process's changes (object_pulls, objects_in_flight; serverapp)"
    ) in caplog.text
    # Flower's waits and count, on both functions.
    for function in (copy, inflatable_utils.pull_and_inflate_object_from_tree):
        assert function.__kwdefaults__["initial_backoff"] == FLOWERS["initial_backoff"]
        assert function.__kwdefaults__["max_concurrent_pulls"] == 2


# ----------------------------------------------------------------------
# supernode_waits: fedx-supernode's idle and reply waits
# ----------------------------------------------------------------------


def idle_waits(backoff: IdleBackoff, until: float, work_at=()) -> list[tuple[float, float]]:
    """``(when, wait)`` of a poller following ``backoff`` for ``until`` seconds (polls take no time).

    ``work_at``: when work came; the poller finds it at its next poll, which
    restarts its idle clock.
    """
    now, last_work, pending, waits = 0.0, 0.0, sorted(work_at), []
    while now < until:
        if pending and pending[0] <= now:
            pending.pop(0)
            last_work = now
        wait = backoff.wait(now - last_work)
        waits.append((round(now, 6), wait))
        now += wait
    return waits


def test_the_idle_backoff_polls_often_after_work_then_doubles_to_its_ceiling():
    backoff = IdleBackoff(interval=0.1, idle_after=10.0, ceiling=3.0)
    waits = idle_waits(backoff, 60.0)
    # Short polls for the first 10 s: every 0.1 s.
    assert all(wait == 0.1 for when, wait in waits if when < 10.0)
    assert sum(when < 10.0 for when, _ in waits) == pytest.approx(100, abs=1)
    # Then each wait as long as the node has been idle beyond that: they double ...
    ramp = [wait for when, wait in waits if 10.0 <= when and wait < 3.0]
    assert ramp[:2] == pytest.approx([0.1, 0.1], abs=1e-6)
    assert all(
        b == pytest.approx(2 * a, rel=1e-6) for a, b in zip(ramp[1:], ramp[2:], strict=False)
    )
    # ... up to the ceiling, reached within 3 s of the spell's 10 s, and never passed.
    assert max(wait for _, wait in waits) == 3.0
    assert min(when for when, wait in waits if wait == 3.0) < 10.0 + 3.0 + 3.0
    polls_after = [when for when, _ in waits if when >= 20.0]
    assert len(polls_after) == pytest.approx(40 / 3, abs=1)  # one poll per 3 s, as Flower's
    # Work after an idle spell: found within the ceiling and within the spell beyond 10 s.
    for came in (10.05, 10.7, 12.0, 30.0, 59.0):
        found = next(when for when, _ in idle_waits(backoff, 70.0) if when >= came)
        assert found - came <= min(3.0, max(0.1, came - 10.0)) + 1e-9, came
    # Found work restarts the clock: short polls again for 10 s.
    again = idle_waits(backoff, 60.0, work_at=[30.0])
    assert all(wait == 0.1 for when, wait in again if 30.0 <= when < 40.0)
    assert [wait for when, wait in again if 44.0 <= when][:1] == [3.0]


def test_the_idle_backoff_can_be_a_fixed_interval_and_refuses_nonsense():
    assert {wait for _, wait in idle_waits(IdleBackoff(0.2, math.inf, 3.0), 100.0)} == {0.2}
    assert {wait for _, wait in idle_waits(IdleBackoff(0.5, 0.0, 0.5), 30.0)} == {0.5}
    assert IdleBackoff(0.1, 0.0, 3.0).wait(0.0) == 0.1  # never below the interval
    for interval, idle_after, ceiling in ((0.0, 1.0, 3.0), (2.0, 1.0, 1.0), (0.1, -1.0, 3.0)):
        with pytest.raises(ValueError):
            IdleBackoff(interval, idle_after, ceiling)
    with pytest.raises(ValueError):
        IdleBackoff(0.1, 1.0, math.inf)


def test_fedx_supernode_shortens_the_reply_wait_and_backs_off_its_idle_wait(monkeypatch):
    slept, clock = [], [100.0]
    monkeypatch.setattr(supernode_waits.time, "sleep", slept.append)
    monkeypatch.setattr(supernode_waits.time, "monotonic", lambda: clock[0])
    waits = supernode_waits.ShortWaits(IdleBackoff(0.2, 10.0, 3.0))
    clock[0] = 130.0  # it connected (slowly): its first idle wait starts the clock
    for seconds in (3, 1.0):
        waits.sleep(seconds)
    assert slept == [0.2, 1.0]
    clock[0] = 100.0  # the clock's idle time from here: 12 s
    waits.last_message = 100.0
    clock[0] = 112.0  # idle for 12 s: 2 s beyond the 10
    waits.sleep(3)
    clock[0] = 200.0
    waits.sleep(3)
    assert slept[2:] == [2.0, 3.0]
    waits.message_done()  # a reply sent: short polls again
    waits.sleep(3)
    assert slept[-1] == 0.2
    assert waits.monotonic() == 200.0  # the rest is the time module's


def test_fedx_supernodes_reply_wait_ends_when_a_clientapp_stores_on_the_node():
    # pylint: disable=import-outside-toplevel
    from flwr.app import Metadata
    from flwr.supercore.inflatable.inflatable_object import get_object_tree
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    def seconds_of(wait) -> float:
        start = time.monotonic()
        wait()
        return time.monotonic() - start

    state = InMemoryNodeState(ObjectStoreFactory().store())
    waits = supernode_waits.ShortWaits(IdleBackoff(0.3, 10.0, 3.0))
    waits.watch(state)
    waits.watch(state)  # wrapped once
    wrapped = state.store_object
    assert wrapped.__fedx_wakes__ and not hasattr(wrapped.__wrapped__, "__fedx_wakes__")
    # Nothing stored: Flower's 0.5 s check lasts the interval.
    assert 0.28 <= seconds_of(lambda: waits.sleep(0.5)) < 0.45
    # The ClientApp pushes an object (the Runtime API's thread): the check ends then.
    pushed = threading.Timer(0.05, state.store_object, (1, "session", "object", b"bytes"))
    pushed.start()
    assert seconds_of(lambda: waits.sleep(0.5)) < 0.25
    pushed.join()
    # A reply stored (as the Runtime API stores a ClientApp's) before the check: it ends at
    # once, and the next one waits again.
    metadata = Metadata(1, "", 0, 7, "", "1", time.time(), 3600.0, "train")
    message = Message(metadata=metadata, content=RecordDict())
    message.metadata.__dict__["_message_id"] = message.object_id
    reply = Message(RecordDict(), reply_to=message)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    stored, _ = state.store_message_and_object_tree(
        reply, get_object_tree(reply), state.start_session(1)
    )
    assert stored and state.get_messages_legacy(is_reply=True)
    assert seconds_of(lambda: waits.sleep(0.5)) < 0.1
    assert seconds_of(lambda: waits.sleep(0.5)) >= 0.28
    # Other states are left as they are.
    waits.watch(None)
    waits.watch(object())


def test_fedx_supernode_patches_flowers_loop(monkeypatch, flowers_serverapp_pulls):
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    loop = supernode_waits.supernode_loop()
    monkeypatch.setattr(loop, "time", loop.time)  # put back after the test
    flowers_push = loop._push_messages  # pylint: disable=protected-access
    monkeypatch.setattr(loop, "_push_messages", flowers_push)
    monkeypatch.setenv(stopped_runs.VARIABLE, "flower")  # the waits alone
    assert flower.install(
        "fedx-supernode", supernode.changes(0.2, idle_after=5.0, ceiling=2.0)
    ).made == ("supernode_waits", "object_pulls")
    waits = loop.time
    assert isinstance(waits, supernode_waits.ShortWaits) and waits.interval == 0.2
    assert waits.backoff == IdleBackoff(0.2, 5.0, 2.0)
    # The objects of a message are asked for again after 20 ms, then doubling up to the
    # interval or 0.25 s (Flower: 1 s, then doubling up to 10 s).
    assert loop.pull_objects.__kwdefaults__["initial_backoff"] == 0.02
    assert loop.pull_objects.__kwdefaults__["backoff_cap"] == 0.25
    # Flower's _push_messages runs as before, and its end restarts the idle clock.
    pushed = loop._push_messages  # pylint: disable=protected-access
    assert pushed is not flowers_push and pushed.__wrapped__ is flowers_push
    waits.last_message = 0.0
    with pytest.raises(TypeError):  # Flower's, called without its arguments
        pushed()
    assert waits.last_message > 0.0
    supernode_waits.shorten_loop_waits(0.2)  # again: Flower's function is wrapped once
    assert loop._push_messages.__wrapped__ is flowers_push  # pylint: disable=protected-access

    @functools.wraps(flowers_push)
    def someone_elses(*args, **kwargs):  # a tracer's, say: kept in the chain
        return flowers_push(*args, **kwargs)

    monkeypatch.setattr(loop, "_push_messages", someone_elses)
    supernode_waits.shorten_loop_waits(0.2)
    assert loop._push_messages.__wrapped__ is someone_elses  # pylint: disable=protected-access
    for interval in (0, 5):
        with pytest.raises(ValueError, match="poll interval must be in"):
            supernode.changes(interval)
    with pytest.raises(ValueError, match="longest idle wait"):
        supernode.changes(0.2, ceiling=5.0)
    monkeypatch.delattr(loop, "_push_messages")  # another Flower: refused, naming the code
    with pytest.raises(flower.FlowerCodeMismatch, match="start_client_internal:_push_messages"):
        flower.install("fedx-supernode", supernode.changes(0.2), refuse=True)


# ----------------------------------------------------------------------
# superexec_executor, clientapp_task and task_input: fedx-superexec's warm executor
# ----------------------------------------------------------------------


def test_flowers_superexec_builds_its_executor_with_fedxs_factory(monkeypatch):
    monkeypatch.setattr(run_superexec, "get_executor", run_superexec.get_executor)
    built = []

    def factory(
        executor_type, executor_config=None, *, insecure=False, root_certificates_path=None
    ):
        built.append(executor_type)

    superexec_executor.use_executor_factory(factory)
    assert run_superexec.get_executor is factory  # what run_superexec calls as it starts
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.3")
    assert superexec_executor.task_poll_interval() == 0.3


def test_fedx_superexec_refuses_to_start_on_a_changed_flower(monkeypatch):
    from fedx.deploy import superexec  # pylint: disable=import-outside-toplevel

    started = []
    monkeypatch.setattr(superexec, "run_flower_superexec", started.append)
    monkeypatch.setattr(run_superexec, "get_executor", run_superexec.get_executor)
    monkeypatch.setattr(run_superexec, "time", run_superexec.time)
    copy = changed_copy(run_superexec.run_superexec, "    task_poll_interval = 0.5")
    monkeypatch.setattr(run_superexec, "run_superexec", copy)
    with pytest.raises(SystemExit) as refused:
        superexec.main(["--insecure"])
    assert "superexec_executor relies on flwr.supercore.superexec.run_superexec:run_superexec" in (
        str(refused.value)
    )
    assert str(refused.value).endswith("; use flower-superexec") and started == []
    assert run_superexec.get_executor is flower.flowers_own(run_superexec, "get_executor")


def test_fedx_superexec_backs_off_its_task_polls_and_asks_for_none_while_a_task_runs(
    monkeypatch,
):
    monkeypatch.setattr(run_superexec, "time", run_superexec.time)  # put back after the test
    waits = superexec_executor.TaskPollWaits(IdleBackoff(0.1, 10.0, 1.0))
    superexec_executor.back_off_task_polls(waits)
    assert run_superexec.time is waits  # what the SuperExec's loop sleeps with
    clock, slept, running = [50.0], [], []

    def sleep(seconds):
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(superexec_executor.time, "sleep", sleep)
    monkeypatch.setattr(superexec_executor.time, "monotonic", lambda: clock[0])
    waits.last_busy, waits.busy = 50.0, lambda: bool(running) and running[0] > clock[0]
    waits.sleep(0.1)  # just started
    clock[0] = 70.0  # nothing for 20 s: Flower's 1 s
    waits.sleep(0.1)
    assert slept == [0.1, 1.0]
    # A task runs until 71.35: no poll until it ends (checked every 0.1 s, no request) ...
    running.append(71.35)
    slept.clear()
    waits.sleep(0.1)
    assert slept == pytest.approx([0.1] * 4) and clock[0] == pytest.approx(71.4)
    # ... then short polls for 10 s after it, then the backoff again.
    waits.sleep(0.1)
    clock[0] = 79.0
    waits.sleep(0.1)
    clock[0] = 81.9
    waits.sleep(0.1)
    assert slept[4:] == pytest.approx([0.1, 0.1, 0.5])
    # A task that runs on and on: one poll per second at most, as Flower's default.
    running[0] = 1e9
    slept.clear()
    waits.sleep(0.1)
    assert sum(slept) == pytest.approx(1.0)
    waits.sleep(2.0)  # any other sleep is the time module's
    assert slept[-1] == 2.0


def test_a_fab_is_unpacked_once_then_found_where_flower_installed_it(tmp_path, monkeypatch):
    from flwr.cli import install  # pylint: disable=import-outside-toplevel
    from flwr.cli.build import build_fab_from_files  # pylint: disable=import-outside-toplevel

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    pyproject = (REPO / "pyproject.toml").read_bytes()
    fab, _ = build_fab_from_files({"pyproject.toml": pyproject, "fedx/__init__.py": b""})
    unpacked = []
    flowers = install.install_from_fab
    monkeypatch.setattr(
        install, "install_from_fab", lambda *a, **k: unpacked.append(a) or flowers(*a, **k)
    )
    fab_hash = hashlib.sha256(fab).hexdigest()
    assert clientapp_task.installed_fab_path(fab) is None
    assert clientapp_task.installed_fab_dir(fab_hash) is None
    first = clientapp_task.install_fab_once(fab, skip_prompt=True)
    # Found from its hash alone too (what the SuperExec knows of a task's FAB).
    assert clientapp_task.installed_fab_dir(fab_hash) == first
    assert first == flowers(fab, skip_prompt=True)  # Flower's own path...
    assert (first / "fedx" / "__init__.py").is_file() and len(unpacked) == 1
    assert clientapp_task.install_fab_once(fab, skip_prompt=True) == first
    assert len(unpacked) == 1  # ...found again without unpacking
    other, _ = build_fab_from_files({"pyproject.toml": pyproject, "fedx/__init__.py": b"x = 1"})
    assert clientapp_task.install_fab_once(other, skip_prompt=True) != first  # another hash
    assert len(unpacked) == 2
    assert clientapp_task.installed_fab_dir(hashlib.sha256(other).hexdigest()) != first
    assert clientapp_task.installed_fab_dir("0" * 64) is None
    assert clientapp_task.installed_fab_path(b"not a zip") is None  # Flower's function says why


class SilentSuperNode:
    """A stand-in Runtime API client: asked for a task's input, it records what was reported."""

    def __init__(self, reported: list[bool]) -> None:
        self.reported = reported
        self.asked: list[list[bool]] = []

    def PullTaskInput(self, request):  # noqa: N802  # pylint: disable=invalid-name
        del request
        self.asked.append(list(self.reported))
        raise ConnectionError("the SuperNode is gone")


def test_a_warm_task_says_while_it_waits_for_its_input(monkeypatch, caplog):
    from flwr.supernode.runtime import run_clientapp  # pylint: disable=import-outside-toplevel

    flowers = run_clientapp.pull_task_input
    monkeypatch.setattr(run_clientapp, "pull_task_input", flowers)  # put back after the test
    reported: list[bool] = []
    assert task_input.report_input_waits(reported.append)
    supernode = SilentSuperNode(reported)
    with pytest.raises(ConnectionError):  # Flower's function ran, and its error passes
        run_clientapp.pull_task_input(supernode)
    assert supernode.asked == [[True]] and reported == [True, False]
    # Again, with another callback: Flower's function is wrapped once, not twice.
    again: list[bool] = []
    assert task_input.report_input_waits(again.append)
    assert run_clientapp.pull_task_input.flowers is flowers
    with pytest.raises(ConnectionError):
        run_clientapp.pull_task_input(SilentSuperNode(again))
    assert again == [True, False] and reported == [True, False]
    # A changed Flower: none of the task's changes is made, one warning says so.
    monkeypatch.setattr(run_clientapp, "pull_task_input", lambda client: None)
    monkeypatch.setattr(run_clientapp, "install_from_fab", run_clientapp.install_from_fab)
    monkeypatch.setattr(flower._installer, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert not flower.install(
            "clientapp-task", {"clientapp_task": {}, "task_input": {"waiting": reported.append}}
        )
    assert "task_input relies on flwr.supernode.runtime.run_clientapp:pull_task_input" in (
        caplog.text
    )
    assert run_clientapp.install_from_fab is flower.flowers_own(run_clientapp, "install_from_fab")


def test_a_warm_task_makes_its_changes_all_at_once(monkeypatch):
    from flwr.supercore import heartbeat  # pylint: disable=import-outside-toplevel
    from flwr.supernode.runtime import run_clientapp  # pylint: disable=import-outside-toplevel

    for name in ("pull_task_input", "install_from_fab"):
        monkeypatch.setattr(run_clientapp, name, getattr(run_clientapp, name))
    monkeypatch.setattr(
        heartbeat, "HEARTBEAT_DEFAULT_INTERVAL", heartbeat.HEARTBEAT_DEFAULT_INTERVAL
    )
    made = flower.install(
        "clientapp-task",
        {
            "object_pulls": {"first": 0.02, "longest": 0.1},
            "clientapp_task": {},
            "task_input": {"waiting": print},
            "task_heartbeat": {},
        },
    )
    assert made.made == ("object_pulls", "clientapp_task", "task_input", "task_heartbeat")
    assert run_clientapp.install_from_fab is clientapp_task.install_fab_once
    assert run_clientapp.pull_task_input.flowers is flower.flowers_own(
        run_clientapp, "pull_task_input"
    )
    assert heartbeat.HEARTBEAT_DEFAULT_INTERVAL == task_heartbeat.TASK_HEARTBEAT_INTERVAL


# ----------------------------------------------------------------------
# stopped_runs: fedx-supernode's stopped runs and replies (end to end: tests/system/test_stopped_runs.py)
# ----------------------------------------------------------------------

RUN, NODE = 7, 11


@pytest.fixture
def supernode_loop(monkeypatch):
    """Flower's SuperNode loop module, whose functions are put back after the test."""
    loop = importlib.import_module(stopped_runs.LOOP)
    for name in ("_pull_and_store_message", "_push_messages"):
        monkeypatch.setattr(loop, name, getattr(loop, name))
    monkeypatch.delenv(stopped_runs.VARIABLE, raising=False)
    return loop


class OneRunSuperNode:
    """A SuperNode's state as Flower keeps it, a stand-in SuperLink and ClientApps, for one run.

    ``receive(stage, step)`` runs a receive stage of the SuperNode's loop on
    the SuperLink's message number ``step`` (whose objects the SuperLink
    gives, or refuses once the run is ``stopped``); ``take()`` is a
    ClientApp task taking a message of the run as Flower's Runtime API hands
    them out; ``reply`` stores a task's reply; ``push(stage)`` runs a push
    stage, and ``sent`` lists the messages its replies answered.
    """

    def __init__(self, loop) -> None:
        # pylint: disable=import-outside-toplevel
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.run import Run
        from flwr.supernode.nodestate import NodeStateFactory

        self.loop = loop
        factory = NodeStateFactory(ObjectStoreFactory())
        self.state, self.store = factory.state(), factory.objectstore_factory.store()
        self.state.set_node_id(NODE)
        self.run = Run.create_empty(RUN)
        self.state.store_run(self.run)  # a known run: the receive stage asks for no FAB
        self.stopped = False
        self.sent: list[str] = []
        self.replies: list[Message] = []

    def refuse_a_stopped_run(self, *args) -> None:
        """What the SuperLink answers about a stopped run (HTTP 403, raised as this)."""
        from flwr.supercore.run import RunNotRunningException  # pylint: disable=C0415

        del args
        if self.stopped:
            raise RunNotRunningException

    def receive(self, stage, step: int) -> tuple[Message, int | None]:
        """The message number ``step``, and what the receive stage returned for it."""
        # pylint: disable=import-outside-toplevel
        from flwr.app import Metadata
        from flwr.supercore.inflatable.inflatable_object import (
            get_all_nested_objects,
            get_object_tree,
        )

        content = RecordDict({"arrays": ArrayRecord([np.full(4, step, dtype=np.float32)])})
        metadata = Metadata(RUN, "", 0, NODE, "", "1", time.time(), 3600.0, "train")
        message = Message(metadata=metadata, content=content)
        message.metadata.__dict__["_message_id"] = message.object_id
        objects = {i: o.deflate() for i, o in get_all_nested_objects(message).items()}

        def pull_object(run_id: int, object_id: str) -> bytes:
            self.refuse_a_stopped_run()
            return objects[object_id]

        def get_run(run_id: int):
            self.refuse_a_stopped_run()
            return self.run

        run_id = stage(
            state=self.state,
            object_store=self.store,
            node_config={},
            receive=lambda: (message, get_object_tree(message)),
            get_run=get_run,
            get_fab=None,
            pull_object=pull_object,
            confirm_message_received=self.refuse_a_stopped_run,
            trusted_entities=None,
        )
        return message, run_id

    def take(self) -> tuple[int, Message | None]:
        """A ClientApp task starts (the oldest pending) and takes a message of the run."""
        from flwr.common.constant import Status  # pylint: disable=import-outside-toplevel

        (task, *_) = self.state.get_tasks(statuses=[Status.PENDING], order_by="pending_at")
        assert self.state.claim_task(task.task_id) and self.state.activate_task(task.task_id)
        taken = self.state.get_messages_legacy(run_ids=[RUN], is_reply=False, limit=1)
        return task.task_id, (taken[0] if taken else None)

    def reply(self, message: Message, answer: RecordDict | Error) -> None:
        """A reply to ``message``: a ClientApp's content, or an error reply."""
        reply = Message(answer, reply_to=message)
        self.loop._insert_message(reply, self.state, self.store)  # pylint: disable=W0212

    def push(self, stage) -> None:
        def send(message, object_tree, runtime):
            del object_tree, runtime
            self.refuse_a_stopped_run()
            self.sent.append(message.metadata.reply_to_message_id)
            self.replies.append(message)
            return set(), "session"

        stage(state=self.state, object_store=self.store, send=send, push_object=print)

    def status(self, task_id: int) -> tuple[str, str]:
        (task,) = self.state.get_tasks(task_ids=[task_id])
        return task.status.status, task.status.sub_status


def test_a_message_of_a_run_stopped_while_it_is_received_is_dropped(supernode_loop, caplog):
    flower = OneRunSuperNode(supernode_loop)
    flower.stopped = True  # the SuperLink refuses the message's objects: the run was stopped
    message, run_id = flower.receive(supernode_loop._pull_and_store_message, 1)
    assert run_id is None
    # Flower 1.41 leaves the message's task to start and the message for it to
    # take, with objects that never come.
    task_id, taken = flower.take()
    assert taken is not None and taken.metadata.message_id == message.metadata.message_id
    assert message.metadata.message_id in flower.store
    assert flower.status(task_id)[0] == "running"

    assert stopped_runs.apply()
    fedx = OneRunSuperNode(supernode_loop)
    fedx.stopped = True
    with caplog.at_level(logging.INFO, logger="flwr"):
        message, run_id = fedx.receive(supernode_loop._pull_and_store_message, 1)
    assert run_id is None
    (task,) = fedx.state.get_tasks(run_ids=[RUN])
    assert fedx.status(task.task_id) == ("finished", "stopped")  # no ClientApp starts for it
    assert fedx.state.get_messages_legacy(run_ids=[RUN]) == []
    assert len(fedx.store) == 0  # the message's objects (registered, never arrived) are gone
    assert f"message {message.metadata.message_id} of run {RUN} dropped" in caplog.text


def test_the_reply_to_the_message_received_goes_out_not_an_older_ones(supernode_loop):
    """Flower 1.41 pushes whichever reply is there once it has received a message: an error reply
    to a stopped run's message, left behind and answered when its task was lost, goes out in place
    of the reply to the next message, which leaves one message late. fedx's waits for its own."""
    flowers_receive = supernode_loop._pull_and_store_message
    pushed = {}
    for name in ("flower", "fedx"):
        if name == "fedx":
            assert stopped_runs.apply()
        node = OneRunSuperNode(supernode_loop)
        node.stopped = True  # a stopped run's message, left behind by Flower's receive...
        orphan, _ = node.receive(flowers_receive, 0)
        node.take()
        node.reply(orphan, Error(0, "ClientApp stopped responding"))  # ...its task lost
        node.stopped = False  # (one run stands for both: the SuperLink takes either reply)
        message, run_id = node.receive(supernode_loop._pull_and_store_message, 1)
        assert run_id == RUN
        _, taken = node.take()
        answer = threading.Timer(0.3, node.reply, (taken, RecordDict({"arrays": ArrayRecord()})))
        answer.start()
        node.push(supernode_loop._push_messages)
        answer.join()
        ids = {orphan.metadata.message_id: "orphan", message.metadata.message_id: "message"}
        pushed[name] = [ids[replied_to] for replied_to in node.sent]
    # Flower's: the reply to `message` waits in the SuperNode for the next message.
    assert pushed == {"flower": ["orphan"], "fedx": ["orphan", "message"]}


def test_a_clientapp_whose_run_stops_is_ended_and_its_message_dropped(
    supernode_loop, monkeypatch, caplog
):
    monkeypatch.setattr(stopped_runs, "RUN_CHECK", 0.05)
    monkeypatch.setattr(stopped_runs, "REPLY_WAIT", 0.01)
    assert stopped_runs.apply()
    node = OneRunSuperNode(supernode_loop)
    message, _ = node.receive(supernode_loop._pull_and_store_message, 1)
    task_id, _ = node.take()  # trains, and would reply much later
    token = node.state.task_token_store[task_id].token
    threading.Timer(0.2, setattr, (node, "stopped", True)).start()  # flwr stop
    with caplog.at_level(logging.INFO, logger="flwr"):
        node.push(supernode_loop._push_messages)  # returns without a reply: the run stopped
    assert node.status(task_id) == ("finished", "stopped") and node.sent == []
    assert node.state.get_task_by_token(token) is None  # its next request is refused (HTTP 401)
    assert message.metadata.message_id not in node.store
    assert "dropped (the run was stopped); its ClientApp task" in caplog.text
    # A task that ends without a reply (it could not push one) ends the wait too: with the
    # error reply of a task that stopped responding (below).
    node.stopped = False
    message, _ = node.receive(supernode_loop._pull_and_store_message, 2)
    task_id, _ = node.take()
    threading.Timer(0.2, node.state.finish_task, (task_id, "failed", "no reply")).start()
    node.push(supernode_loop._push_messages)
    assert node.sent == [message.metadata.message_id]
    assert message.metadata.message_id not in node.store


def test_a_message_whose_task_ends_without_a_reply_gets_flowers_error_reply(
    supernode_loop, monkeypatch, caplog
):
    """A task finished before any reply was stored (its process could not push one, or Flower
    had not stored its "stopped responding" reply yet): the message is answered with that error,
    not dropped, and the ServerApp hears of it at once instead of at its round's timeout."""
    from flwr.common.constant import ErrorCode  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(stopped_runs, "REPLY_WAIT", 0.01)
    assert stopped_runs.apply()
    node = OneRunSuperNode(supernode_loop)
    message, _ = node.receive(supernode_loop._pull_and_store_message, 1)
    task_id, _ = node.take()
    threading.Timer(0.2, node.state.finish_task, (task_id, "failed", "no reply")).start()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        node.push(supernode_loop._push_messages)
    (reply,) = node.replies
    assert reply.metadata.reply_to_message_id == message.metadata.message_id
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_CRASHED
    assert reply.metadata.run_id == RUN and reply.metadata.dst_node_id == 0  # to the ServerApp
    assert "ended without a reply" in caplog.text
    # Nothing of the message is left: no message, no object, no later reply.
    assert node.state.get_messages_legacy(run_ids=[RUN]) == [] and len(node.store) == 0


def test_asking_whether_the_run_runs_never_holds_a_ready_reply(supernode_loop, monkeypatch):
    """Flower's get_run retries a SuperLink out of reach for as long as it takes: the reply that
    comes meanwhile goes out at once."""
    monkeypatch.setattr(stopped_runs, "RUN_CHECK", 0.05)
    monkeypatch.setattr(stopped_runs, "REPLY_WAIT", 0.01)
    assert stopped_runs.apply()
    node = OneRunSuperNode(supernode_loop)
    message, _ = node.receive(supernode_loop._pull_and_store_message, 1)
    back = threading.Event()
    asked = threading.Event()

    def out_of_reach(run_id):
        asked.set()
        back.wait(30)  # retrying

    supernode_loop._push_messages.__self__.received.get_run = out_of_reach
    _, taken = node.take()
    threading.Timer(0.5, node.reply, (taken, RecordDict({"arrays": ArrayRecord()}))).start()
    started = time.monotonic()
    try:
        node.push(supernode_loop._push_messages)
        took = time.monotonic() - started
    finally:
        back.set()
    assert asked.is_set() and node.sent == [message.metadata.message_id]
    assert took < 10, took  # not the 30 s the question takes


@pytest.mark.parametrize("error, logged", [("connection", False), ("other", True)])
def test_an_error_asking_for_the_run_other_than_a_connection_error_is_logged_once(
    supernode_loop, monkeypatch, caplog, error, logged
):
    import httpx  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(stopped_runs, "RUN_CHECK", 0.02)
    monkeypatch.setattr(stopped_runs, "REPLY_WAIT", 0.01)
    assert stopped_runs.apply()
    node = OneRunSuperNode(supernode_loop)
    message, _ = node.receive(supernode_loop._pull_and_store_message, 1)
    asked = []

    def failing(run_id):
        asked.append(run_id)
        if error == "connection":
            raise httpx.ConnectError("connection refused")
        raise KeyError("a bug")

    supernode_loop._push_messages.__self__.received.get_run = failing
    _, taken = node.take()
    threading.Timer(0.6, node.reply, (taken, RecordDict({"arrays": ArrayRecord()}))).start()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        node.push(supernode_loop._push_messages)
    assert len(asked) >= 3 and node.sent == [message.metadata.message_id]  # asked on, replied
    lines = [r for r in caplog.records if "whether run" in r.getMessage()]
    assert len(lines) == (1 if logged else 0), caplog.text
    if logged:
        assert "KeyError" in lines[0].getMessage()


def test_a_warm_task_hears_within_seconds_that_its_supernode_ended_it(monkeypatch):
    from flwr.supercore import heartbeat  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(
        heartbeat, "HEARTBEAT_DEFAULT_INTERVAL", heartbeat.HEARTBEAT_DEFAULT_INTERVAL
    )
    waits = []

    def one_heartbeat_wait() -> float:
        """Flower's heartbeat sender's wait after its first heartbeat."""
        sender = heartbeat.HeartbeatSender(lambda: True)
        sender._stop_event.wait = lambda seconds: waits.append(seconds) or sender._stop_event.set()
        sender._run()  # pylint: disable=protected-access
        return waits[-1]

    assert 17.5 <= one_heartbeat_wait() <= 22.5  # Flower's
    undo = task_heartbeat.apply()
    assert 3.5 <= one_heartbeat_wait() <= 4.5
    undo()
    assert heartbeat.HEARTBEAT_DEFAULT_INTERVAL == 30


def test_another_flowers_supernode_keeps_its_own_loop(supernode_loop, monkeypatch, caplog):
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    flowers = supernode_loop._pull_and_store_message

    def pull_and_store_message(state, object_store, fetch):  # another signature
        del state, object_store, fetch

    monkeypatch.setattr(supernode_loop, "_pull_and_store_message", pull_and_store_message)
    monkeypatch.setattr(flower._installer, "_WARNED", set())
    monkeypatch.setattr(supernode, "run_flower_supernode", lambda arguments: None)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        supernode.main(["--insecure"])  # starts: Flower's loop, one warning
    assert supernode_loop._pull_and_store_message is pull_and_store_message
    assert "_pull_and_store_message. None of this process's changes (stopped_runs" in caplog.text
    # Flower's loop, and FEDX_STOPPED_RUNS=flower: kept as it is, on purpose.
    monkeypatch.setattr(supernode_loop, "_pull_and_store_message", flowers)
    monkeypatch.setenv(stopped_runs.VARIABLE, "flower")
    assert supernode.changes() == {}
    supernode.main(["--insecure"])
    assert supernode_loop._pull_and_store_message is flowers


def test_fedx_supernode_installs_the_change(supernode_loop, monkeypatch):
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    ran = []
    monkeypatch.setattr(supernode, "run_flower_supernode", ran.append)
    supernode.main(["--insecure", "--superlink", "127.0.0.1:1"])
    assert ran == [["--insecure", "--superlink", "127.0.0.1:1"]]
    assert isinstance(supernode_loop._push_messages.__self__, stopped_runs._Loop)
    changed = supernode_loop._push_messages
    assert stopped_runs.apply()  # again: the loop is changed once
    assert supernode_loop._push_messages is changed


def test_fedx_supernodes_idle_clock_restarts_after_a_dropped_message_too(
    supernode_loop, monkeypatch
):
    """With --poll-interval the idle clock wraps the stopped-runs push: it restarts once per
    message received, whether the message's reply went out or the message was dropped."""
    from fedx.deploy import supernode  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(supernode_loop, "time", supernode_loop.time)
    pulls = supernode_loop.pull_objects
    monkeypatch.setattr(pulls, "__kwdefaults__", dict(pulls.__kwdefaults__))
    monkeypatch.setattr(supernode, "run_flower_supernode", lambda arguments: None)
    monkeypatch.setattr(stopped_runs, "RUN_CHECK", 0.05)
    monkeypatch.setattr(stopped_runs, "REPLY_WAIT", 0.01)
    supernode.main(["--poll-interval", "0.2", "--insecure", "--superlink", "127.0.0.1:1"])
    waits = supernode_loop.time
    assert isinstance(waits, supernode_waits.ShortWaits)
    push = supernode_loop._push_messages  # pylint: disable=protected-access
    assert isinstance(push.__wrapped__.__self__, stopped_runs._Loop)
    node = OneRunSuperNode(supernode_loop)
    node.receive(supernode_loop._pull_and_store_message, 1)
    task_id, _ = node.take()  # trains, and would reply much later
    threading.Timer(0.2, setattr, (node, "stopped", True)).start()  # flwr stop
    waits.last_message = 0.0
    node.push(push)  # returns without a reply: the message is dropped
    assert node.sent == [] and node.status(task_id) == ("finished", "stopped")
    assert waits.last_message > 0.0  # the node had a message: short polls again


# ----------------------------------------------------------------------
# superlink_middleware: fedx-superlink's middleware, scoped to the requests it acts on
# ----------------------------------------------------------------------


def _superlink_answers(requests) -> list[tuple[int, bytes, list]]:
    """What Flower's SuperLink app, as this process builds it, answers each of ``requests``."""
    import asyncio  # pylint: disable=import-outside-toplevel

    import httpx  # pylint: disable=import-outside-toplevel  (Flower's own dependency)
    from flwr.superlink import main as superlink_app  # pylint: disable=import-outside-toplevel

    app = superlink_app.create_app()

    async def ask():
        answers = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://superlink") as c:
                for method, path, headers, body in requests:
                    reply = await c.request(method, path, headers=headers, content=body)
                    kept = sorted((k, v) for k, v in reply.headers.items() if k != "date")
                    answers.append((reply.status_code, reply.content, kept))
        return answers

    return asyncio.run(ask())


def test_the_scoped_superlink_answers_every_kind_of_request_as_flowers_does(monkeypatch):
    from flwr.proto.control_pb2 import (  # pylint: disable=import-outside-toplevel
        GetLoginDetailsRequest,
        StopRunRequest,
    )
    from flwr.proto.message_pb2 import PullObjectRequest  # pylint: disable=import-outside-toplevel
    from flwr.superlink import main as superlink_app  # pylint: disable=import-outside-toplevel

    protobuf = {"content-type": "application/protobuf"}
    pull = PullObjectRequest(object_id="0" * 64).SerializeToString()
    requests = [
        ("GET", "/health", {}, b""),
        ("POST", "/v1/fleet/pull-object", protobuf, pull),  # unsigned: SuperNode auth refuses
        ("POST", "/v1/fleet/pull-object", protobuf, b"not protobuf"),
        ("POST", "/v1/fleet/pull-object", {"content-type": "text/plain"}, pull),
        ("POST", "/v1/runtime/pull-task-input", protobuf, b""),  # no task token
        ("POST", "/v1/control/stop-run", protobuf, StopRunRequest(run_id=7).SerializeToString()),
        (
            "POST",
            "/v1/control/get-login-details",
            protobuf,
            GetLoginDetailsRequest().SerializeToString(),
        ),
        ("GET", "/no-such-route", {}, b""),
    ]
    monkeypatch.setattr(superlink_app, "_get_middleware", superlink_app._get_middleware)
    flowers = _superlink_answers(requests)
    assert flower.install("fedx-superlink", {"superlink_middleware": {}})
    assert flower.install("fedx-superlink", {"superlink_middleware": {}})  # twice: scoped once
    scoped = _superlink_answers(requests)
    assert [status for status, _, _ in flowers] == [200, 401, 400, 415, 401, 404, 200, 404]
    assert scoped == flowers
    # Seven of Flower 1.41's nine are scoped (six of 1.42's eight: it has no tracing
    # middleware); the errors' and protobuf translations run on all.
    stack = superlink_app._get_middleware()
    listed = superlink_middleware.FLOWER_MIDDLEWARE[INSTALLED]
    scoped_count = sum(name in superlink_middleware.SCOPES for name in listed)
    assert (INSTALLED, len(stack), scoped_count) in (("1.41.0", 9, 7), ("1.42.0", 8, 6))
    assert [entry.cls for entry in stack].count(
        superlink_middleware.ScopedMiddleware
    ) == scoped_count
    assert {entry.cls.__name__ for entry in stack} == {
        "ScopedMiddleware", "BaseHTTPMiddleware", "ProtobufTranslationMiddleware"
    }  # fmt: skip


def test_each_scoped_middleware_acts_on_its_own_requests_only():
    class Plugged:
        fleet_event_log_plugin = object()

    class App:
        state = Plugged()

    def scope(path):
        return {"type": "http", "path": path, "app": App()}

    scopes = superlink_middleware.SCOPES
    assert scopes["NodeAuthMiddleware"](scope("/v1/fleet/pull-object"))
    assert not scopes["NodeAuthMiddleware"](scope("/v1/runtime/pull-object"))
    assert scopes["ControlAuthenticationMiddleware"](scope("/v1/control/start-run"))
    assert not scopes["ControlAuthenticationMiddleware"](scope("/v1/fleet/pull-object"))
    assert scopes["FleetEventLogMiddleware"](scope("/v1/fleet/pull-object"))
    Plugged.fleet_event_log_plugin = None  # no event log asked for: nothing to log
    assert not scopes["FleetEventLogMiddleware"](scope("/v1/fleet/pull-object"))


def test_another_flowers_superlink_middleware_runs_as_shipped(monkeypatch, caplog):
    from flwr.superlink import main as superlink_app  # pylint: disable=import-outside-toplevel

    flowers = superlink_app._get_middleware
    monkeypatch.setattr(superlink_app, "_get_middleware", lambda: flowers()[:-1])
    monkeypatch.setattr(flower._installer, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert not flower.install("fedx-superlink", {"superlink_middleware": {}})
    assert "superlink_middleware relies on flwr.superlink.main:_get_middleware" in caplog.text
    assert "Flower's own code runs" in caplog.text
    assert superlink_middleware.scoped(flowers()[1:]) is None


# ----------------------------------------------------------------------
# ray_backend, engine_threads, message_feeder: fedx's parts in the simulation engine
# ----------------------------------------------------------------------


@pytest.fixture
def flowers_engine(monkeypatch):
    """The simulation engine as Flower ships it during the test, and as it was after it."""
    monkeypatch.setattr(raybackend, "RayBackend", ray_backend.FlowerRayBackend)
    monkeypatch.setattr(vce_api, "ThreadPoolExecutor", ThreadPoolExecutor)
    monkeypatch.setattr(
        vce_api, "add_messages_to_queue", flower.flowers_own(vce_api, "add_messages_to_queue")
    )
    monkeypatch.setattr(flower._installer, "_WARNED", set())


def test_install_puts_fedxs_backend_threads_and_feeder_into_flowers_engine(flowers_engine):
    # pylint: disable=import-outside-toplevel
    from fedx.simulation import install
    from fedx.simulation.backend import ClusterRayBackend
    from fedx.simulation.feeder import feed_messages

    assert install(actor_preload=("json",))
    # What start_vce's backend_fn imports when it builds the backend:
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    assert RayBackend is ClusterRayBackend and ClusterRayBackend.actor_preload == ("json",)
    assert vce_api.ThreadPoolExecutor is engine_threads.ThreadPerWorker
    assert vce_api.add_messages_to_queue is feed_messages
    assert install(actor_preload=()) and ClusterRayBackend.actor_preload == ()  # idempotent


def test_another_flowers_engine_keeps_its_own_parts(flowers_engine, monkeypatch, caplog):
    # pylint: disable=import-outside-toplevel
    from fedx.simulation import install

    # One part differs (the feeder: a changed copy of Flower's): none of the parts is made,
    # not the backend nor the threads either, and one warning names the change.
    copy = changed_copy(vce_api.add_messages_to_queue, "    nodes_mapping = dict(nodes_mapping)")
    monkeypatch.setattr(vce_api, "add_messages_to_queue", copy)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert not install()
        assert not install()
    assert raybackend.RayBackend is ray_backend.FlowerRayBackend
    assert vce_api.add_messages_to_queue is copy
    assert vce_api.ThreadPoolExecutor is ThreadPoolExecutor
    assert caplog.text.count("fedx: Flower's code is not the code") == 1
    assert (
        "message_feeder relies on flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue. "
        "None of this process's changes (clientapp_actor, linkstate_stores, ray_backend, "
        "engine_threads, message_feeder; simulation) is made: Flower's own code runs"
    ) in caplog.text


def test_the_engine_runs_every_worker_loop_at_once():
    """Flower's ThreadPoolExecutor() would run min(32, cores + 4) of these and never the rest."""
    loops = 100
    all_running = threading.Barrier(loops, timeout=30)
    with engine_threads.ThreadPerWorker() as executor:
        futures = [executor.submit(all_running.wait) for _ in range(loops)]
    assert sorted(future.result() for future in futures) == list(range(loops))


# ----------------------------------------------------------------------
# linkstate_stores: the run state's stores, hooked while fedx's feeder runs
# ----------------------------------------------------------------------


def test_the_states_stores_call_back_while_hooked(simulation_state):
    state, grid, nodes, _ = simulation_state
    stored, replied = [], []
    with linkstate_stores.hooked(
        state,
        lambda m, i: stored.append((m.metadata.dst_node_id, i)),
        lambda m, i: replied.append(i),
    ) as hooked:
        assert hooked
        ids = list(
            grid.push_messages([Message(RecordDict(), dst_node_id=nodes[0], message_type="train")])
        )
        assert stored == [(nodes[0], ids[0])] and ids[0]  # Flower's method stored it first
        (delivered,) = state.get_message_ins(node_id=nodes[0], limit=1)
        reply = Message(RecordDict(), reply_to=delivered)
        reply.metadata.__dict__["_message_id"] = "reply-0"  # as Flower's engine does
        assert state.store_message_res(reply) == "reply-0" and replied == ["reply-0"]
    assert "store_message_ins" not in vars(state) and "store_message_res" not in vars(state)
    with linkstate_stores.hooked(object(), print, print) as hooked:
        assert not hooked  # another Flower's state: not hooked


# ----------------------------------------------------------------------
# clientapp_actor: fedx's actors raise the errors Flower's engine answers
# ----------------------------------------------------------------------


def test_fedxs_actor_raises_the_errors_flowers_engine_turns_into_error_replies():
    # What the engine's worker checks (the actor itself on Ray: tests/system/test_ray_backend.py).
    assert vce_api.ClientAppException is clientapp_actor.ClientAppException
    assert vce_api.LoadClientAppError is clientapp_actor.LoadClientAppError
    from fedx.simulation import actor  # pylint: disable=import-outside-toplevel

    assert actor.ClientAppException is clientapp_actor.ClientAppException


# ----------------------------------------------------------------------
# wire: Flower's serialization for the loopback grid
# ----------------------------------------------------------------------


def test_the_loopback_grid_sends_contents_through_flowers_serialization():
    weights = np.arange(1000, dtype=np.float32)
    content = RecordDict(
        {"arrays": ArrayRecord([weights]), "config": ConfigRecord({"server-round": 3})}
    )
    copy, size = wire.over_the_wire(content)
    assert copy is not content and copy["config"]["server-round"] == 3
    np.testing.assert_array_equal(copy["arrays"].to_numpy_ndarrays()[0], weights)
    assert weights.nbytes < size < weights.nbytes + 1000
