"""Change: how soon Flower asks again for a message's object that is not there yet.

What it changes
    The keyword defaults (``__kwdefaults__``) ``initial_backoff``,
    ``backoff_cap`` and ``max_tries_per_object`` of Flower's
    ``flwr.supercore.inflatable.inflatable_utils.pull_objects`` and
    ``pull_and_inflate_object_from_tree``, in the process that calls
    :func:`retry_object_pulls_after` only (the functions are not replaced).

Why
    Flower 1.41 moves a message from process to process as objects (the
    message, its records, each array and its chunks), each pulled with a
    request of its own. A receiver often learns of a message before its
    sender has pushed all of its objects, on every hop of a message on real
    processes:

    * the SuperLink hands a message to the SuperNode as soon as the
      ServerApp has stored it, while the ServerApp is still pushing the
      model's arrays;
    * the SuperNode creates the ClientApp's task before it has pulled those
      arrays from the SuperLink, so the ClientApp asks for them early too;
    * the SuperLink hands a reply to the ServerApp while the SuperNode is
      still pushing its arrays.

    An object that is not there yet is asked for again after
    ``PULL_INITIAL_BACKOFF`` (1 s), then 2 s, 4 s, ... up to 10 s. On one
    machine or a LAN the rest of a message arrives tens of milliseconds
    later, so each of the three hops waited about 1 s for nothing: 3 s of
    every exchange (``benchmarks/message_timeline.py`` measures the steps;
    docs/results-record.md, "Run 4: where a warm message's seconds went, and
    the fixed costs cut", has the exchange before and after).

    :func:`retry_object_pulls_after` makes those waits short: the first one
    ``first`` seconds, then doubling up to ``longest`` (default 0.25 s, the
    longest pause of fedx's reply pulls), so an object is fetched at most
    ``longest`` after it arrived. The one limit on the wait is then
    Flower's ``max_time`` (2 hours; Flower's 500 tries per object, which at
    10 s each last about as long, would run out after two minutes at
    0.25 s). While a receiver waits, each of its two pull threads asks every
    ``longest`` seconds: with 0.25 s, 8 requests a second per waiting
    process instead of one every 10 s. A ``first`` of 1 s or more leaves
    Flower's waits as they are. fedx's processes call it with their own
    poll interval: fedx's ServerApp in a deployment (:mod:`fedx.server_app`,
    the pace of its reply pulls, 20 ms to 250 ms:
    :func:`fedx.messaging.pull_intervals`), ``fedx-supernode --poll-interval``
    (:data:`FIRST_WAIT`, up to 0.25 s) and the ClientApp processes of
    ``fedx-superexec`` (:data:`FIRST_WAIT`, up to its task poll interval:
    they ask their own SuperNode, a cheap request). A SuperNode sees a
    message as soon as the ServerApp has pushed the message itself, before
    its arrays, and a task as soon as its SuperNode has it: starting at the
    poll interval (0.1 s in the README's fast setup), each of the two waited
    most of it in most exchanges.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    Flower reads no setting for these waits (``PULL_INITIAL_BACKOFF`` and
    the rest are constants of ``flwr.supercore.constant``).

Under another Flower
    Where the pull functions are not the code checked (Flower 1.36 has no
    ``initial_backoff``), :func:`fedx.flower.install` makes none of the
    process's changes: fedx's ServerApp keeps Flower's waits, with one
    warning; ``fedx-supernode --poll-interval`` refuses to start.
"""

import importlib
from collections.abc import Callable
from typing import Any

from fedx.flower._fingerprints import flower_code

#: Flower's module of object pulls and pushes.
INFLATABLE_UTILS = "flwr.supercore.inflatable.inflatable_utils"
#: Flower's functions that pull objects (of :data:`INFLATABLE_UTILS`), each with the keywords
#: set here.
PULL_FUNCTIONS = ("pull_objects", "pull_and_inflate_object_from_tree")
RETRY_KEYWORDS = ("initial_backoff", "backoff_cap", "max_tries_per_object")
#: Flower's first wait (seconds) before asking again for an object (``PULL_INITIAL_BACKOFF``
#: of flwr 1.41 and 1.42).
FLOWER_INITIAL_BACKOFF = 1.0
#: The longest wait between two requests for an object, by default.
LONGEST_WAIT = 0.25
#: The first wait of fedx's SuperNodes and ClientApp tasks, whatever their poll interval: the
#: object's sender is pushing it that moment, and most arrive within tens of milliseconds.
FIRST_WAIT = 0.02

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supercore.inflatable.inflatable_utils:pull_objects",
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that both functions still take initial_backoff, backoff_cap and max_tries_per_object as "
    "keywords, wait initial_backoff doubling up to backoff_cap between two asks for an object "
    "not there yet, and stop at max_time alone when max_tries_per_object is None"
)


def pull_functions() -> list[Callable[..., Any]]:
    """Flower's functions that pull objects (:data:`PULL_FUNCTIONS`)."""
    module = importlib.import_module(INFLATABLE_UTILS)
    return [getattr(module, name) for name in PULL_FUNCTIONS]


def apply(first: float, longest: float = LONGEST_WAIT):
    """Make this process's Flower object pulls ask again after ``first`` s, then at most ``longest``.

    Made by :func:`fedx.flower.install` (:func:`retry_object_pulls_after`);
    returns what undoes it.
    """
    before = retry_object_pulls_after(first, longest)
    return lambda: restore_object_pulls(before)


def retry_object_pulls_after(first: float, longest: float = LONGEST_WAIT) -> dict[str, object]:
    """Make this process's Flower object pulls ask again after ``first`` s, then at most ``longest``.

    With ``first`` of Flower's 1 s or more, nothing changes; a ``longest``
    below ``first`` counts as ``first``.

    Returns
    -------
    dict
        The retry keywords before the call (:func:`restore_object_pulls` puts them back).

    Raises
    ------
    ValueError
        When ``first`` is not positive.
    RuntimeError
        When Flower's pull functions lack those keywords (Flower 1.36).
    """
    if not first > 0:
        raise ValueError(f"the first wait must be positive, got {first}")
    defaults = [function.__kwdefaults__ or {} for function in pull_functions()]
    if any(keyword not in d for d in defaults for keyword in RETRY_KEYWORDS):
        raise RuntimeError("this Flower's pull_objects lacks initial_backoff (flwr 1.36)")
    before = {keyword: defaults[0][keyword] for keyword in RETRY_KEYWORDS}
    if first < FLOWER_INITIAL_BACKOFF:
        for default in defaults:
            default.update(
                initial_backoff=first, backoff_cap=max(first, longest), max_tries_per_object=None
            )
    return before


def restore_object_pulls(keywords: dict[str, object]) -> None:
    """Put back the retry keywords :func:`retry_object_pulls_after` returned."""
    for function in pull_functions():
        (function.__kwdefaults__ or {}).update(keywords)
