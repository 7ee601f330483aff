"""The check behind the two test tiers: a test that starts a system is a system test.

``pytest -m "not system"`` (tests/unit) is the inner loop; it is only worth
running if nothing that starts processes of a federation, Ray, containers,
network namespaces, a browser or a package index slips into it. The
``system`` mark comes from the folder (tests/support/tiers.py: every test
under tests/system), and putting a test in the wrong folder is easy, so
tests/conftest.py watches every test that is not marked:
``subprocess.Popen`` reports each process it (or a fixture it uses) starts, and
:func:`system_start` says whether that command starts a system. If one
does, the test errors at teardown, naming the command. Processes started
by those processes are not seen, so the command that matters is the first
one: ``flwr run`` for a simulation, ``flower-superlink`` for a deployment,
``podman`` for containers; ``ray.init`` in the test's own process shows as
Ray's ``gcs_server``.
"""

import functools
import os
import shlex
import subprocess
from collections.abc import Sequence

import pytest

#: Programs that start (or are) a system whatever their arguments, apart from
#: ``--help`` and ``--version``.
SYSTEM_PROGRAMS = frozenset(
    {
        # A federation's processes, Flower's and fedx's.
        "flower-superlink",
        "flower-supernode",
        "flower-superexec",
        "flwr-serverapp",
        "flwr-clientapp",
        "flwr-simulation",
        "fedx-superlink",
        "fedx-supernode",
        "fedx-superexec",
        "fedx-compare",  # a simulation SuperLink and its runs
        # Ray: `ray start`, and what ray.init starts first.
        "ray",
        "gcs_server",
        "raylet",
        # Containers, network namespaces and the links between them.
        "podman",
        "podman-compose",
        "docker",
        "debootstrap",
        "ip",
        "tc",
        # A browser.
        "chromium",
        "chromedriver",
        # A package index.
        "uv",
    }
)
#: Python scripts of the repository that start one (they run in a child process).
SYSTEM_SCRIPTS = frozenset({"check_site.py"})  # docs/check_site.py drives chromium
#: ``python -m MODULE``: the program it is.
MODULE_PROGRAMS = {
    "pip": "pip",
    "ray": "ray",
    "fedx.compare": "fedx-compare",
    "fedx.compare.cli": "fedx-compare",
    "fedx.deploy.cli": "fedx-deploy",
    "fedx.deploy.superlink": "fedx-superlink",
    "fedx.deploy.supernode": "fedx-supernode",
    "fedx.deploy.superexec": "fedx-superexec",
}
#: `flwr` subcommands that talk to a SuperLink (or start a local one): everything but these.
FLWR_OFFLINE = frozenset({"new", "build", "--help", "-h", "--version", "-V"})
INFORMATION = frozenset({"--help", "-h", "--version", "-V"})


def _words(args) -> list[str]:
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        try:
            return shlex.split(text)
        except ValueError:
            return text.split()
    return [os.fsdecode(word) for word in args]


def system_start(args: str | bytes | os.PathLike | Sequence) -> str | None:
    """The command line if the command ``args`` starts a system, else None."""
    words = _words(args)
    if not words:
        return None
    program = os.path.basename(words[0])
    rest = words[1:]
    if program.startswith("python"):
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] in MODULE_PROGRAMS:
            program, rest = MODULE_PROGRAMS[rest[1]], rest[2:]
        elif rest and os.path.basename(rest[0]) in SYSTEM_SCRIPTS:
            # Asked for its --help only, the script starts nothing.
            return None if INFORMATION & set(rest[1:]) else " ".join(words)
        else:
            return None
    if INFORMATION & set(rest):
        return None
    starts = (
        program in SYSTEM_PROGRAMS
        or (program == "flwr" and bool(rest) and rest[0] not in FLWR_OFFLINE)
        or (program == "fedx-deploy" and "up" in rest)
        # pip reaches a package index unless told not to (a local folder's install does not).
        or (program.startswith("pip") and "install" in rest and "--no-index" not in rest)
    )
    return " ".join(words) if starts else None


class SystemStarts:
    """The systems started while :attr:`watching`: ``subprocess.Popen`` reports each command here.

    Installed once per process (:func:`install`), by wrapping
    ``subprocess.Popen.__init__`` (asyncio's subprocesses and Ray's
    daemons start through it too); it costs nothing but at a process start.
    """

    def __init__(self) -> None:
        self.watching = False
        self.started: list[str] = []

    def saw(self, args) -> None:
        """Note the command ``args`` if it starts a system while watching."""
        if not self.watching:
            return
        try:
            found = system_start(args)
        except (TypeError, ValueError):  # a command this check cannot read: not ours to judge
            return
        if found is not None:
            self.started.append(found[:300])

    def watch(self) -> None:
        self.started = []
        self.watching = True

    def stop(self) -> list[str]:
        """What was started since :meth:`watch`; watching ends."""
        started, self.started, self.watching = self.started, [], False
        return started


_INSTALLED: SystemStarts | None = None


def install() -> SystemStarts:
    """The process's :class:`SystemStarts`; ``subprocess.Popen`` reports to it from the first call."""
    global _INSTALLED  # pylint: disable=global-statement
    if _INSTALLED is None:
        starts = SystemStarts()
        original = subprocess.Popen.__init__

        @functools.wraps(original)
        def reporting_init(self, args, *more, **options):
            starts.saw(args)
            original(self, args, *more, **options)

        subprocess.Popen.__init__ = reporting_init
        _INSTALLED = starts
    return _INSTALLED


# ----------------------------------------------------------------------
# The hooks (tests/conftest.py imports them)
# ----------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch a test that is not marked ``system`` from its fixtures' start."""
    if item.get_closest_marker("system") is None:
        install().watch()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After its teardown, a test not marked ``system`` that started one errors, naming it."""
    result = yield
    started = install().stop()
    if started and item.get_closest_marker("system") is None:
        listed = "\n  ".join(dict.fromkeys(started))
        pytest.fail(
            f"{item.nodeid} started a system but is not marked `system`:\n  {listed}\n"
            "Move it to tests/system, whose tests are marked `system`, so that "
            '`pytest -m "not system"` stays the quick tier (docs/development.md).',
            pytrace=False,
        )
    return result
