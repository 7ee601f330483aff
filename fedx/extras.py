"""fedx's console scripts, each stopped with one clear line when the ``app`` extra is missing.

fedx's distribution, ``fedx-flower`` (:data:`DISTRIBUTION`), without extras
gives the strategies, the ops and the registry (numpy, Flower,
scikit-learn): what a Flower project needs to use a fedx strategy, whatever
it trains with. The app (``flwr run .``), its simulation backend,
deployment (``fedx-deploy``, ``fedx-superexec``, ``fedx-supernode``,
``fedx-superlink``), ``fedx-compare`` and the plots need torch, torchvision,
Ray, matplotlib and Flower 1.41 or 1.42: the ``app`` extra of
``pyproject.toml``, ``pip install "fedx-flower[app]"``. The console scripts of ``pyproject.toml`` start
here, so that a light install answers them with what to install instead of
a traceback. What the extra holds is read from fedx's installed metadata:
``pyproject.toml`` is the one place that lists it. ``fedx-supernode`` and
``fedx-superlink`` are Flower's own processes with fedx's changes: of the
extra they need Flower 1.41 or 1.42 alone (the SuperNode image has no torch).
"""

import importlib
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, requires, version

#: fedx's distribution on a package index (its import package is ``fedx``; the index's
#: ``fedx`` is another project).
DISTRIBUTION = "fedx-flower"
#: The extra that the app, deployment, fedx-compare and the plots come with.
APP = "app"


def _gated_on(requirement, extra: str) -> bool:
    """Whether ``requirement`` (a ``packaging`` Requirement) applies with ``extra`` only."""
    marker = requirement.marker
    return (
        marker is not None
        and marker.evaluate({"extra": extra})
        and not marker.evaluate({"extra": ""})
    )


def missing_requirements(extra: str = APP, only: tuple[str, ...] | None = None) -> list[str]:
    """What of fedx's ``extra`` is not installed, or installed in a version it does not take.

    One entry per problem (``"torch (not installed)"``, ``"flwr 1.36.0 (needs
    <1.42,>=1.41)"``). The extra's own requirements only, not theirs: the
    deployment image has Flower without Ray (``flwr[simulation]``), which its
    tools do not use. Empty when everything is there, and when fedx itself is
    not installed (run from a source tree on ``PYTHONPATH``: no metadata to read).
    ``only`` names the requirements to check (all of the extra's by default).
    """
    from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel

    try:
        listed = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return []
    problems: list[str] = []
    for requirement in (Requirement(text) for text in listed):
        if not _gated_on(requirement, extra) or (only is not None and requirement.name not in only):
            continue
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            problems.append(f"{requirement.name} (not installed)")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{requirement.name} {installed} (needs {requirement.specifier})")
    return problems


def install_hint(extra: str = APP) -> str:
    """How to install fedx with ``extra``, from an index and from a clone."""
    return (
        f'pip install "{DISTRIBUTION}[{extra}]" (in a clone of fedx: pip install -e ".[{extra}]")'
    )


def _run(
    tool: str, module: str, extra: str = APP, only: tuple[str, ...] | None = None
) -> Callable[[], int | None]:
    """The entry point of ``tool``: check ``extra`` (or its ``only``), then run ``module``'s ``main``."""

    def entry_point() -> int | None:
        problems = missing_requirements(extra, only)
        if problems:
            print(
                f"{tool} needs fedx's {extra!r} extra, which is not installed "
                f"({'; '.join(problems)}): {install_hint(extra)}",
                file=sys.stderr,
            )
            return 1
        try:
            main = importlib.import_module(module).main
        except ModuleNotFoundError as err:  # fedx without metadata, from a source tree
            if (err.name or "").split(".")[0] == "fedx":
                raise
            print(
                f"{tool} needs fedx's {extra!r} extra (no module named {err.name!r}): "
                f"{install_hint(extra)}",
                file=sys.stderr,
            )
            return 1
        return main()

    entry_point.__name__ = tool.replace("-", "_")
    entry_point.__doc__ = (
        f"``{tool}``: :mod:`{module}`'s ``main``, once the {extra!r} extra is there."
    )
    return entry_point


fedx_deploy = _run("fedx-deploy", "fedx.deploy.cli")
fedx_compare = _run("fedx-compare", "fedx.compare.cli")
fedx_superexec = _run("fedx-superexec", "fedx.deploy.superexec")
fedx_supernode = _run("fedx-supernode", "fedx.deploy.supernode", only=("flwr",))
fedx_superlink = _run("fedx-superlink", "fedx.deploy.superlink", only=("flwr",))
