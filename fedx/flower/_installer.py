"""The one installer of fedx's changes to Flower: checked, all or none, in one order.

A process that changes Flower (:data:`PROCESSES`) makes its changes with one
call of :func:`install`. Before it changes anything, the installer compares
the Flower code each change relies on (the change module's ``FLOWER_CODE``)
with the code this process runs: the fingerprint of each piece's source, as
it is now (a function another package put in Flower's place counts as
changed Flower code), must be the one recorded for a Flower release the
change was checked against (:data:`fedx.flower.CHECKED_FLWR`). If every change
matches, they are made in :data:`ORDER`, each by its module's ``apply``; if
one does not, none is made, Flower's own code runs, and one WARNING names the
change, the Flower code that differs and the releases it was checked
against (or, where a program cannot do without the change, it refuses to
start with that text: ``refuse=True``).

Nothing here imports a module of Flower's until :func:`install` or
:func:`fingerprint` runs.
"""

import hashlib
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import WARNING
from types import ModuleType
from typing import Any

#: The Flower releases every change was checked against, oldest first.
CHECKED_FLWR = ("1.41.0", "1.42.0")

#: Every change, in the one order in which a process makes its changes. The
#: SuperNode's stopped runs come before its waits, whose idle clock wraps the
#: stopped-runs push (it restarts once per message received, replied to or
#: dropped).
ORDER = (
    "clientapp_actor",
    "linkstate_stores",
    "ray_backend",
    "engine_threads",
    "message_feeder",
    "stopped_runs",
    "supernode_waits",
    "object_pulls",
    "objects_in_flight",
    "superexec_executor",
    "clientapp_task",
    "task_input",
    "task_heartbeat",
    "superlink_middleware",
)

#: Each kind of process fedx changes Flower in, and the changes it may make there.
PROCESSES: dict[str, tuple[str, ...]] = {
    # flwr-simulation (or Flower's run_simulation in process): fedx's engine parts.
    "simulation": (
        "clientapp_actor",
        "linkstate_stores",
        "ray_backend",
        "engine_threads",
        "message_feeder",
    ),
    # flwr-serverapp running fedx's ServerApp in a deployment.
    "serverapp": ("object_pulls", "objects_in_flight"),
    "fedx-supernode": ("stopped_runs", "supernode_waits", "object_pulls", "objects_in_flight"),
    "fedx-superexec": ("superexec_executor",),
    # A ClientApp task forked by fedx-superexec's warm executor.
    "clientapp-task": ("object_pulls", "clientapp_task", "task_input", "task_heartbeat"),
    "fedx-superlink": ("superlink_middleware",),
}

#: ``apply``'s keyword arguments for a change, or a function that returns them once the
#: check has passed (what it imports may depend on the Flower code checked).
Arguments = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
#: What undoes a change (``apply`` returns it).
Undo = Callable[[], None]


class FlowerCodeMismatch(RuntimeError):
    """Flower's code is not what a change was checked against (``install(..., refuse=True)``)."""


@dataclass(frozen=True)
class Installation:
    """What :func:`install` did in this process.

    Attributes
    ----------
    process : str
        The kind of process (a key of :data:`PROCESSES`).
    made : tuple of str
        The changes made, in the order made; empty when none was.
    flower : str
        The installed Flower release (``flwr``'s version).
    mismatch : str
        Why none was made (the warning's text); empty when they all were.
    """

    process: str
    made: tuple[str, ...]
    flower: str
    mismatch: str = ""

    def __bool__(self) -> bool:
        return not self.mismatch


#: Every replacement made through :func:`replace` in this process:
#: ``(owner, attribute, replacement, what was there before)``.
_REPLACED: list[tuple[Any, str, Any, Any]] = []
#: The warnings logged in this process (each is logged once).
_WARNED: set[str] = set()
#: Fingerprints computed in this process: ``{name: (the object, its fingerprint)}``, valid
#: while the name still names that object.
_FINGERPRINTS: dict[str, tuple[Any, str]] = {}


def flower_version() -> str:
    """The installed Flower release."""
    try:
        return importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def replace(owner: ModuleType | type, attribute: str, replacement: Any) -> Undo:
    """Set ``owner.attribute`` to ``replacement``, remembering what was there.

    Returns what puts it back (if it is still ``replacement``). What fedx put
    in place does not hide Flower's code from :func:`fingerprint`: it sees
    through every replacement made here to the code beneath.
    """
    before = getattr(owner, attribute)
    if before is replacement:
        return lambda: None
    setattr(owner, attribute, replacement)
    _REPLACED.append((owner, attribute, replacement, before))

    def undo() -> None:
        if getattr(owner, attribute, None) is replacement:
            setattr(owner, attribute, before)

    return undo


def flowers_own(owner: ModuleType | type, attribute: str) -> Any:
    """``owner.attribute`` as it was before fedx's :func:`replace` put anything there."""
    value = getattr(owner, attribute)
    while True:
        for replaced_owner, name, replacement, before in reversed(_REPLACED):
            if replaced_owner is owner and name == attribute and replacement is value:
                value = before
                break
        else:
            return value


def flower_object(name: str) -> Any:
    """The object ``"module:qualified.name"`` names, as Flower has it (beneath fedx's replacements).

    Raises
    ------
    ImportError, AttributeError
        When the module or the name is not there.
    """
    module_name, _, qualname = name.partition(":")
    owner: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        owner = flowers_own(owner, part) if isinstance(owner, ModuleType | type) else None
        if owner is None:
            raise AttributeError(f"{name} is not there")
    return owner


def fingerprint(name: str) -> str | None:
    """The first 16 hex digits of the SHA-256 of the source of ``"module:qualified.name"`` now.

    ``None`` when it is not there; ``"unreadable"`` when its source cannot be read.
    """
    try:
        code = flower_object(name)
    except (ImportError, AttributeError):
        return None
    known = _FINGERPRINTS.get(name)
    if known is not None and known[0] is code:
        return known[1]
    try:
        source = inspect.getsource(code)
    except (OSError, TypeError):
        return "unreadable"
    _FINGERPRINTS[name] = (code, hashlib.sha256(source.encode()).hexdigest()[:16])
    return _FINGERPRINTS[name][1]


def change_module(change: str) -> ModuleType:
    """The module of ``change`` (``fedx.flower.<change>``)."""
    return importlib.import_module(f"fedx.flower.{change}")


def checked_releases(change: str, fingerprints: dict[str, str | None] | None = None) -> list[str]:
    """The checked Flower releases whose code is, piece for piece, the code ``change`` relies on now.

    ``fingerprints`` caches :func:`fingerprint` across calls.
    """
    now = {} if fingerprints is None else fingerprints
    flower_code: Mapping[str, Mapping[str, str | None]] = change_module(change).FLOWER_CODE
    for name in flower_code:
        if name not in now:
            now[name] = fingerprint(name)
    return [
        release
        for release in CHECKED_FLWR
        if all(recorded.get(release, "?") == now[name] for name, recorded in flower_code.items())
    ]


def differs(change: str, fingerprints: dict[str, str | None] | None = None) -> list[str]:
    """The Flower code ``change`` relies on that differs from what it was checked against.

    Empty when this process's code is one checked release's, piece for piece.
    Otherwise the pieces that differ from the installed release's recorded
    code (if fedx checked that release), or from every checked release's
    (if it did not); every piece, when each is some release's but not all
    the same release's.
    """
    now = {} if fingerprints is None else fingerprints
    if checked_releases(change, now):
        return []
    installed = flower_version()
    releases = [installed] if installed in CHECKED_FLWR else list(CHECKED_FLWR)
    flower_code = change_module(change).FLOWER_CODE
    return [
        name
        for name, recorded in flower_code.items()
        if all(recorded.get(release, "?") != now[name] for release in releases)
    ] or list(flower_code)


def prime(process: str) -> None:
    """Import and fingerprint the Flower code of ``process``'s changes ahead of :func:`install`.

    A process that forks others (the warm executor's interpreter, for
    ``clientapp-task``) pays it once; its children find it done.
    """
    fingerprints: dict[str, str | None] = {}
    for change in PROCESSES[process]:
        checked_releases(change, fingerprints)


def _mismatch_text(process: str, changes: tuple[str, ...], differing: dict[str, list[str]]) -> str:
    checked = ", ".join(CHECKED_FLWR)
    what = "; ".join(
        f"{change} relies on {', '.join(names)}" for change, names in differing.items()
    )
    return (
        f"fedx: Flower's code is not the code fedx's changes to it were checked against "
        f"(flwr {checked}; installed: flwr {flower_version()}): {what}. None of this "
        f"process's changes ({', '.join(changes)}; {process}) is made: Flower's own code runs"
    )


def install(
    process: str, changes: Mapping[str, Arguments], *, refuse: bool = False
) -> Installation:
    """Make ``changes`` in this process (a ``process`` of :data:`PROCESSES`): all or none.

    Parameters
    ----------
    process : str
        The kind of process: a key of :data:`PROCESSES`.
    changes : mapping
        The changes to make, each with the keyword arguments of its module's
        ``apply`` (or a function returning them, called once the check has
        passed); they are made in :data:`ORDER`, whatever the mapping's order.
    refuse : bool
        On a mismatch, raise :class:`FlowerCodeMismatch` instead of logging
        a warning (for a program that cannot run without its changes).

    Returns
    -------
    Installation
        What was made; false when nothing was (the warning says why).

    Raises
    ------
    ValueError
        When ``process`` is not known or a change is not one of its changes.
    FlowerCodeMismatch
        With ``refuse``, when Flower's code is not what a change was checked against.
    """
    allowed = PROCESSES.get(process)
    if allowed is None:
        raise ValueError(f"unknown process {process!r}; known: {', '.join(PROCESSES)}")
    if unknown := sorted(set(changes) - set(allowed)):
        raise ValueError(f"{process} makes no change {', '.join(unknown)}; it makes {allowed}")
    ordered = tuple(change for change in ORDER if change in changes)
    fingerprints: dict[str, str | None] = {}
    differing = {change: names for change in ordered if (names := differs(change, fingerprints))}
    if differing:
        text = _mismatch_text(process, ordered, differing)
        if refuse:
            raise FlowerCodeMismatch(text)
        if text not in _WARNED:
            _WARNED.add(text)
            from flwr.common import log  # pylint: disable=import-outside-toplevel

            log(WARNING, "%s", text)
        return Installation(process, (), flower_version(), text)
    undos: list[Undo] = []
    try:
        for change in ordered:
            apply = getattr(change_module(change), "apply", None)
            if apply is None:  # a part others use, checked with them
                continue
            arguments = changes[change]
            undo = apply(**(arguments() if callable(arguments) else arguments))
            undos.append(undo)
    except BaseException:
        for undo in reversed(undos):
            undo()
        raise
    return Installation(process, ordered, flower_version())
