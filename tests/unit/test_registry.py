"""The method registry: where methods come from, what is derived from them, what the app may name."""

import importlib
import pkgutil
import re
import subprocess
import sys

import pytest

from fedx import reference, registry
from fedx.checks import Integer
from fedx.config import APP_KEYS, _method_keys  # pylint: disable=protected-access
from fedx.registry import Key, Method, UnknownMethod, builtin_methods
from fedx.strategies import FedMR
from tests.support.helpers import REPO

PAPERS_AND_BASELINES = {
    "fedavg",
    "fedprox",
    "fedavg-ft",
    "fedcross",
    "fedindep",
    "fedme",
    "fedmr",
    "fedmut",
}


def test_fedx_methods_are_declared_in_the_modules_of_their_strategies():
    methods = builtin_methods()
    names = [m.name for m in methods]
    assert PAPERS_AND_BASELINES <= set(names) and len(set(names)) == len(names)
    for method in methods:
        for key in method.keys:
            assert key.argument or method.components, f"{method.name}: {key.name} feeds nothing"
            assert key.name not in {k.name for k in APP_KEYS}
        if method.strategy.__module__.startswith("fedx."):
            assert method.strategy.__module__.startswith("fedx.strategies.")
    # A key several methods use is one declaration.
    shared = [k for m in methods for k in m.keys if k.name == "pool-mean"]
    assert len(shared) >= 4 and all(k is shared[0] for k in shared)  # fedx's four pool methods


def test_the_methods_folder_holds_methods_only():
    """A module of fedx.strategies is a method; what the methods share is fedx.strategy_core."""
    import fedx.strategies  # pylint: disable=import-outside-toplevel
    import fedx.strategy_core  # pylint: disable=import-outside-toplevel

    def declared(package) -> dict[str, list[Method]]:
        return {
            info.name: [
                value
                for value in vars(
                    importlib.import_module(f"{package.__name__}.{info.name}")
                ).values()
                if isinstance(value, Method)
            ]
            for info in pkgutil.iter_modules(package.__path__)
        }

    methods = declared(fedx.strategies)
    assert [name for name, found in methods.items() if not found] == []
    assert {m.name for found in methods.values() for m in found} == {
        m.name for m in builtin_methods()
    }
    assert {name: found for name, found in declared(fedx.strategy_core).items() if found} == {}


def test_two_declarations_of_one_key_are_refused():
    one = Method("a", FedMR, "a", keys=(Key("x-rounds", 1, Integer(0), "x", argument="x"),))
    other = Method("b", FedMR, "b", keys=(Key("x-rounds", 2, Integer(0), "x", argument="x"),))
    with pytest.raises(ValueError, match="two declarations of run-config key 'x-rounds'"):
        _method_keys((one, other))
    app = Method("c", FedMR, "c", keys=(Key("seed", 1, Integer(0), "x", argument="seed"),))
    with pytest.raises(ValueError, match="declares the app's key 'seed'"):
        _method_keys((app,))


def test_a_broken_plugin_names_itself_and_stops_no_other_method(tmp_path, monkeypatch, caplog):
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedx.methods]\nbroken = no_such_module:METHOD\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh = registry._Registry()  # pylint: disable=protected-access
    assert fresh.get("fedmr").strategy is FedMR
    assert "broken" not in fresh.names()
    assert "cannot load method 'broken' (no_such_module:METHOD): ModuleNotFoundError" in caplog.text
    with pytest.raises(
        UnknownMethod, match="method 'broken' cannot be loaded: ModuleNotFoundError"
    ):
        fresh.get("broken")
    with pytest.raises(UnknownMethod, match="no method 'fedfoo'; known methods: fedavg, fedprox"):
        fresh.get("fedfoo")


def test_the_run_config_reference_is_up_to_date(tmp_path):
    """pyproject.toml's defaults and docs/run-config.md's tables are the code's."""
    assert reference.main(["--check"]) == 0, "run python -m fedx.reference"
    # The check can fail: a default that differs from the declaration is found,
    # in either file.
    (tmp_path / "docs").mkdir()
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        (REPO / "pyproject.toml").read_text().replace("fedmut-alpha = 4.0", "fedmut-alpha = 2.0")
    )
    page = tmp_path / "docs" / "run-config.md"
    page.write_text((REPO / "docs" / "run-config.md").read_text())
    fresh = {
        path.name for path, text in reference.updated(tmp_path).items() if path.read_text() != text
    }
    assert fresh == {"pyproject.toml"}
    page.write_text(
        page.read_text().replace("| `fedmut-alpha` | `4.0` |", "| `fedmut-alpha` | `1.0` |")
    )
    stale = {
        path.name for path, text in reference.updated(tmp_path).items() if path.read_text() != text
    }
    assert stale == {"pyproject.toml", "run-config.md"}
    page.write_text(page.read_text().replace(reference.PAGE_END, ""))
    with pytest.raises(ValueError, match="lacks the lines"):
        reference.updated(tmp_path)


def test_the_documentation_tables_hold_every_key_with_its_default():
    """The tables of docs/run-config.md (tests/unit/test_docs.py builds the page)."""
    tables = reference.markdown_reference()
    assert tables in (REPO / "docs" / "run-config.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| `"): line for line in tables.splitlines() if "| `" in line
    }
    keys = [*APP_KEYS, *(key for method in builtin_methods() for key in method.keys)]
    assert {key.name for key in keys} == set(rows)
    assert "| `fedmut-beta0` | `0.3` | a number in [0, 1] |" in rows["fedmut-beta0"]
    for method in builtin_methods():  # a heading each, whose anchor is #<method>
        assert f"\n## `{method.name}`\n" in tables
    # A placeholder such as fixed:<name> is text, not an HTML tag.
    assert "fixed:\\<name>" in rows["fedme-initial-architecture"]


# What may name a method: its own modules (strategy, protocol, client side),
# the maths it uses (fedx.ops) and the package's re-exports. The app derives
# everything else from the declarations.
OWN_FILES = {
    "fedcross": {"strategies/fedcross.py"},
    "fedmut": {"strategies/fedmut.py"},
    "fedme": {
        "strategies/fedme/__init__.py",
        "strategies/fedme/strategy.py",
        "strategies/fedme/clients.py",
        "strategies/fedme/registration.py",
        "strategies/fedme/clustering.py",
        "protocol/fedme.py",
        "client/fedme.py",
        "mutual.py",
    },
}


@pytest.mark.parametrize("method", sorted(OWN_FILES))
def test_only_a_methods_own_modules_name_it(method):
    pattern = re.compile(rf"\b{method}\b", re.IGNORECASE)
    package = REPO / "fedx"
    naming = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if pattern.search(path.read_text()) and path.relative_to(package).parts[0] != "ops"
    }
    assert OWN_FILES[method] <= naming  # the check can see a name
    assert naming - OWN_FILES[method] == {"strategies/__init__.py"}


def test_the_config_and_registry_import_without_torch_or_datasets():
    code = (
        "import sys, fedx.checks, fedx.registry, fedx.config, fedx.protocol.common, "
        "fedx.protocol.personalized, fedx.protocol.fedme; "
        "heavy = {m.split('.')[0] for m in sys.modules} & {'torch', 'torchvision', 'sklearn', 'datasets'}; "
        "assert not heavy, heavy"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_entry_points_are_read_once_until_a_package_is_installed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    reads = []
    original = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda **kw: reads.append(kw) or original(**kw))
    fresh = registry._Registry()  # pylint: disable=protected-access
    assert "later" not in fresh.names()
    fresh.names()
    fresh.get("fedmr")
    assert len(reads) == 1, "nothing was installed in between: the entry points are read once"

    # A plug-in installed while the process runs (a warm executor lives for days).
    (tmp_path / "later_method.py").write_text(
        "from fedx.registry import Method\n"
        "from fedx.strategies import FedMR\n"
        "METHOD = Method('later', FedMR, 'a later plug-in')\n"
    )
    info = tmp_path / "later_method-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: later-method\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedx.methods]\nlater = later_method:METHOD\n")
    assert fresh.get("later").name == "later"
    assert "later" in fresh.names()
    assert len(reads) == 2
