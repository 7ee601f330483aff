"""fedx's distribution, ``fedx-flower``, without extras: the strategies, the ops and the registry, nothing that needs torch.

The light install's dependencies are ``[project].dependencies`` of
``pyproject.toml``; the app, deployment, ``fedx-compare`` and the plots come
with the ``app`` extra. Here: the third-party imports of the modules a
Flower project uses (read from the code, lazy imports included) are exactly
those dependencies; the console scripts of the extra answer a light install
with the extra to install. With the package index, in fresh environments:
tests/system/test_install.py.
"""

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import fedx.deploy.supernode
import fedx.extras
from tests.support.helpers import REPO, modules_imported_by

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
#: What a Flower project imports of fedx without the app extra, and the console scripts' entry.
LIGHT_MODULES = (
    "fedx.strategies",
    "fedx.ops",
    "fedx.registry",
    "fedx.messaging",
    "fedx.secure.client",
    "fedx.client.packing",
    "fedx.protocol",
    "fedx.extras",
)
#: What the app extra brings and the light install must not.
HEAVY = ("torch", "torchvision", "matplotlib")


def _name(requirement: str) -> str:
    return Requirement(requirement).name.lower().replace("_", "-")


def _source(module: str) -> Path | None:
    path = REPO.joinpath(*module.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def _imports(module: str) -> set[str]:
    """Every module ``module``'s source imports, anywhere in it (function bodies too)."""
    source = _source(module)
    assert source is not None, module
    package = module if source.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            # `from fedx.ops import model` imports the submodule fedx.ops.model.
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def light_closure() -> tuple[set[str], set[str]]:
    """fedx's modules that :data:`LIGHT_MODULES` reach, and the third-party top-level names they import."""
    seen: set[str] = set()
    third_party: set[str] = set()
    pending = list(LIGHT_MODULES)
    while pending:
        module = pending.pop()
        if module in seen or _source(module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        pending += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run too
        for name in _imports(module):
            top = name.split(".")[0]
            if top == "fedx":
                pending.append(name)
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return seen, third_party


def test_the_light_modules_import_exactly_the_light_dependencies():
    modules, third_party = light_closure()
    assert {"fedx.strategies.fedme", "fedx.ops.parallel", "fedx.secure.crypto"} <= modules
    distributions = packages_distributions()
    imported = {
        name.lower().replace("_", "-") for top in third_party for name in distributions[top]
    }
    declared = {_name(text) for text in PROJECT["dependencies"]}
    assert not imported & set(HEAVY) and "ray" not in imported
    # Nothing imported that the light install lacks, nothing declared that nobody imports.
    assert imported == declared, (sorted(imported), sorted(declared))


def test_what_a_flower_project_imports_of_fedx_changes_nothing_of_flowers():
    """Only fedx's own processes change Flower's internals (fedx.flower, through its installer):
    nothing a Flower project imports of fedx, lazy imports included, reaches it."""
    modules, _ = light_closure()
    assert "fedx.messaging" in modules
    assert not [m for m in modules if m.startswith("fedx.flower")], sorted(modules)
    assert modules_imported_by(LIGHT_MODULES, "fedx.flower") == []


def test_the_app_extra_holds_what_the_light_install_leaves_out():
    app = {_name(text) for text in PROJECT["optional-dependencies"]["app"]}
    assert set(HEAVY) | {"flwr", "psutil"} <= app
    assert "fedx-flower[app]" in PROJECT["optional-dependencies"]["dev"]
    # The console scripts all start at fedx.extras, which checks the extra first.
    for tool, target in PROJECT["scripts"].items():
        module, function = target.split(":")
        assert module == "fedx.extras" and callable(getattr(fedx.extras, function)), tool


def test_a_console_script_names_the_missing_extra(monkeypatch, capsys):
    monkeypatch.setattr(
        fedx.extras,
        "requires",
        lambda name: (
            ['torch>=2.5; extra == "app"', 'flwr[simulation]<1.43,>=1.41; extra == "app"', "numpy"]
            if name == "fedx-flower"
            else []
        ),
    )
    monkeypatch.setattr(
        fedx.extras,
        "version",
        lambda name: (
            {"flwr": "1.36.0", "numpy": "2.0.0"}.get(name)
            or (_ for _ in ()).throw(fedx.extras.PackageNotFoundError(name))
        ),
    )
    assert fedx.extras.fedx_compare() == 1
    message = capsys.readouterr().err
    assert message.startswith("fedx-compare needs fedx's 'app' extra")
    assert "torch (not installed)" in message and "flwr 1.36.0 (needs <1.43,>=1.41)" in message
    assert 'pip install "fedx-flower[app]"' in message and "numpy" not in message


def test_flowers_processes_with_fedxs_changes_need_only_flower_of_the_extra(monkeypatch, capsys):
    """The SuperNode image has Flower and fedx without torch: fedx-supernode must start."""
    monkeypatch.setattr(
        fedx.extras,
        "requires",
        lambda name: ['torch>=2.5; extra == "app"', 'flwr[simulation]<1.43,>=1.41; extra == "app"'],
    )
    installed = {"flwr": "1.41.0"}
    monkeypatch.setattr(
        fedx.extras,
        "version",
        lambda name: (
            installed.get(name) or (_ for _ in ()).throw(fedx.extras.PackageNotFoundError(name))
        ),
    )
    # fedx-supernode's command line ends with os._exit (no finalization): here, a SystemExit.
    monkeypatch.setattr(fedx.deploy.supernode, "_exit_now", lambda code: sys.exit(code))
    for tool in ("fedx-supernode", "fedx-superlink"):
        monkeypatch.setattr(sys, "argv", [tool, "--help"])
        with pytest.raises(SystemExit) as stopped:
            getattr(fedx.extras, tool.replace("-", "_"))()
        assert stopped.value.code == 0, tool
        assert capsys.readouterr().out.startswith(f"usage: {tool}")
    # ...but not on a Flower they do not take, and the other tools still need all of it.
    installed["flwr"] = "1.36.0"
    assert fedx.extras.fedx_supernode() == 1
    assert "flwr 1.36.0 (needs <1.43,>=1.41)" in capsys.readouterr().err
    installed["flwr"] = "1.41.0"
    assert fedx.extras.fedx_superexec() == 1
    assert "torch (not installed)" in capsys.readouterr().err


def test_a_console_script_runs_its_tool_when_the_extra_is_there(monkeypatch, capsys):
    assert fedx.extras.missing_requirements() == []
    monkeypatch.setattr(sys, "argv", ["fedx-compare", "--help"])
    with pytest.raises(SystemExit) as stopped:
        fedx.extras.fedx_compare()
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("usage: fedx-compare")
