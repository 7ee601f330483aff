"""The two tiers as folders, and the order in which pytest-xdist hands modules out.

* A test under tests/system is marked ``system`` here, at collection: the
  folder is the only place that says so, and ``pytest -m "not system"`` (the
  quick tier) is exactly tests/unit. tests/support/system_mark.py still
  watches every test outside tests/system at run time: one that starts a
  system errors, naming the command.
* Modules start costliest first. A module that takes a minute or more says
  so itself, ``pytestmark = pytest.mark.cost(minutes)``: a rough figure on
  CI's 2 cores, which need only be right against the other modules'. xdist
  (``--dist loadfile --no-loadscope-reorder``) hands modules out in
  collection order, so the long ones start first and the many short ones fill
  in the other workers, and they end together instead of one long module
  running alone at the end. Between modules of the same cost the system
  tests go first (they mostly wait on processes), then the collection order.

tests/conftest.py imports the hooks.
"""

from collections.abc import Iterable
from pathlib import Path

import pytest

#: The folder whose tests are the system tier.
SYSTEM = Path(__file__).resolve().parents[1] / "system"


def in_system_tier(path: Path) -> bool:
    """Whether the test module at ``path`` belongs to the system tier (lies under tests/system)."""
    return Path(path).resolve().is_relative_to(SYSTEM)


def module_cost(items: Iterable[pytest.Item]) -> float:
    """The minutes a module's ``cost`` mark declares (0 without one); ``items`` are its tests."""
    costs = [
        float(mark.args[0]) if mark.args else float(mark.kwargs["minutes"])
        for item in items
        for mark in [item.get_closest_marker("cost")]
        if mark is not None
    ]
    return max(costs, default=0.0)


def schedule(items: list[pytest.Item]) -> None:
    """Order ``items`` in place: by module, costliest first, then system before unit.

    A module's tests stay together and in their order; modules of one cost
    keep the collection order among them.
    """
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    order = sorted(
        modules,
        key=lambda path: (-module_cost(modules[path]), not in_system_tier(path)),
    )
    items[:] = [item for path in order for item in modules[path]]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the system tier and order the modules.

    First among this hook's implementations: pytest's own, which deselects by
    ``-m``, must see the marks.
    """
    for item in items:
        if in_system_tier(item.path):
            item.add_marker(pytest.mark.system)
    schedule(items)
