"""Change: how many objects of a message a process moves at once (Flower: 2, and no more than its cores).

What it changes
    In the process that makes the change only (:func:`apply`, through
    :func:`fedx.flower.install`): the
    keyword defaults (``__kwdefaults__``) ``max_concurrent_pulls`` of
    Flower's ``pull_objects`` and ``pull_and_inflate_object_from_tree`` and
    ``max_concurrent_pushes`` of ``push_objects`` and
    ``push_object_contents_from_iterable``
    (``flwr.supercore.inflatable.inflatable_utils``), and that module's
    ``get_num_workers``, which caps the threads of a pull or a push at the
    process's cores: it becomes :func:`requested_workers`, which does not.

Why
    Flower 1.41 moves a message as objects (the message, its records, each
    array, the 5 MB chunks of larger arrays), each with a request of its
    own, ``FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS`` (``..._PUSHES``) of them
    at a time, 2 by default, and never more than ``os.cpu_count()``: on a
    host of 2 cores Flower's own setting cannot raise it at all. A request
    waits a round trip, so over a long link a message costs about
    objects / 2 round trips, whatever the bandwidth: a ResNet-20 message is
    84 objects, 42 round trips, 2.1 s at 50 ms, per hop and direction,
    against 0.09 s for its 1.1 MB at 100 Mbit/s. The objects wait on the
    network, not on a core, so more of them in flight than cores is what
    pays (``benchmarks/links.py``; docs/results.md, "What each part of the
    fast setup gives" and "Slow links").

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    Flower's own settings, ``FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS`` and
    ``..._PUSHES``, are read once when Flower is imported (before fedx's
    code runs in a ServerApp's process) and capped at the cores like the
    keywords: on 2 cores they cannot raise the count at all.

Under another Flower
    Where the four functions or ``get_num_workers`` are not the code checked
    (Flower 1.36 moves messages whole), :func:`fedx.flower.install` makes
    none of the process's changes: ``fedx-supernode --objects-in-flight``
    refuses to start, fedx's ServerApp keeps Flower's, with one warning.
"""

import importlib
import os
from typing import Any

from fedx.flower import flowers_own, replace
from fedx.flower._fingerprints import flower_code

#: Flower's module of object pulls and pushes.
INFLATABLE_UTILS = "flwr.supercore.inflatable.inflatable_utils"

#: The environment variable fedx's processes read: objects in flight per pull or push.
VARIABLE = "FEDX_OBJECTS_IN_FLIGHT"
#: Flower's functions (of ``inflatable_utils``), each with the keyword set here.
KEYWORDS = {
    "pull_objects": "max_concurrent_pulls",
    "pull_and_inflate_object_from_tree": "max_concurrent_pulls",
    "push_objects": "max_concurrent_pushes",
    "push_object_contents_from_iterable": "max_concurrent_pushes",
}
#: The most objects in flight fedx sets (each is a thread while it waits).
MOST = 256

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supercore.inflatable.inflatable_utils:get_num_workers",
    "flwr.supercore.inflatable.inflatable_utils:pull_objects",
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree",
    "flwr.supercore.inflatable.inflatable_utils:push_objects",
    "flwr.supercore.inflatable.inflatable_utils:push_object_contents_from_iterable",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that the pulls and pushes still run get_num_workers(max_concurrent_...) threads, each "
    "moving one object at a time, that pull_and_inflate_object_from_tree and push_objects "
    "pass their keyword on, and that get_num_workers is still looked up in the module when "
    "a pull or a push starts"
)


def _inflatable_utils() -> Any:
    return importlib.import_module(INFLATABLE_UTILS)


def requested_workers(max_concurrent: int) -> int:
    """As many threads as objects asked to be in flight (Flower's caps them at the cores)."""
    return max(1, max_concurrent)


def check_count(count: int) -> int:
    """``count`` when it is an allowed number of objects in flight.

    Raises
    ------
    ValueError
        When it is not in [1, :data:`MOST`].
    """
    if not 1 <= count <= MOST:
        raise ValueError(f"objects in flight must be in [1, {MOST}], got {count}")
    return count


def from_environment() -> int | None:
    """The count :data:`VARIABLE` asks for, or None when it is unset or empty.

    Raises
    ------
    ValueError
        When it is set to something else than a number in [1, :data:`MOST`].
    """
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return None
    try:
        return check_count(int(text))
    except ValueError as err:
        raise ValueError(f"{VARIABLE}={text!r}: {err}") from None


def _keyword_defaults() -> dict[str, dict]:
    """The keyword defaults of each of :data:`KEYWORDS`' functions.

    Raises
    ------
    RuntimeError
        When a function or its keyword is missing (Flower 1.36).
    """
    inflatable_utils = _inflatable_utils()
    defaults = {
        name: getattr(getattr(inflatable_utils, name, None), "__kwdefaults__", None) or {}
        for name in KEYWORDS
    }
    if not hasattr(inflatable_utils, "get_num_workers") or any(
        keyword not in defaults[name] for name, keyword in KEYWORDS.items()
    ):
        raise RuntimeError(
            "this Flower's object pulls and pushes take no max_concurrent_pulls/pushes (flwr 1.36)"
        )
    return defaults


def set_objects_in_flight(count: int) -> dict[str, int]:
    """Make this process's Flower pulls and pushes move ``count`` objects at once.

    Returns
    -------
    dict
        The keywords' values before (``{"max_concurrent_pulls": .., "max_concurrent_pushes":
        ..}``), for :func:`restore_objects_in_flight`.

    Raises
    ------
    ValueError
        When ``count`` is not in [1, :data:`MOST`].
    RuntimeError
        When Flower's functions lack the keywords (Flower 1.36).
    """
    check_count(count)
    defaults = _keyword_defaults()
    before = {keyword: defaults[name][keyword] for name, keyword in KEYWORDS.items()}
    for name, keyword in KEYWORDS.items():
        defaults[name][keyword] = count
    replace(_inflatable_utils(), "get_num_workers", requested_workers)
    return before


def apply(count: int):
    """Make this process's Flower pulls and pushes move ``count`` objects at once.

    Made by :func:`fedx.flower.install` (:func:`set_objects_in_flight`);
    returns what undoes it.
    """
    before = set_objects_in_flight(count)
    return lambda: restore_objects_in_flight(before)


def objects_in_flight() -> dict[str, int]:
    """The objects this process's pulls and pushes move at once now (threads, after any cap)."""
    defaults = _keyword_defaults()
    workers = _inflatable_utils().get_num_workers
    return {
        "pulls": workers(defaults["pull_objects"]["max_concurrent_pulls"]),
        "pushes": workers(defaults["push_objects"]["max_concurrent_pushes"]),
    }


def restore_objects_in_flight(before: dict[str, int]) -> None:
    """Put back the keywords :func:`set_objects_in_flight` returned, and Flower's cap at the cores."""
    defaults = _keyword_defaults()
    for name, keyword in KEYWORDS.items():
        defaults[name][keyword] = before[keyword]
    inflatable_utils = _inflatable_utils()
    inflatable_utils.get_num_workers = flowers_own(inflatable_utils, "get_num_workers")
