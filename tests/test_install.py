"""fedx's distribution, ``fedx-flower``, without extras: the strategies, the ops and the registry, nothing that needs torch.

The light install's dependencies are ``[project].dependencies`` of
``pyproject.toml``; the app, deployment, ``fedx-compare`` and the plots come
with the ``app`` extra. Here: the third-party imports of the modules a
Flower project uses (read from the code, lazy imports included) are exactly
those dependencies; the console scripts of the extra answer a light install
with the extra to install; and, as a package-index test, a user's Flower
project that lists fedx among its dependencies installs it next to its own
``flwr[simulation]`` with no torch and runs FedMR (``examples/numpy-plugin``);
and Flower's own installation of a run's dependencies (``uv sync``) still
installs the app extra for fedx's app.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import fedx.deploy.supernode
import fedx.extras
from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.flower import CHECKED_FLWR
from tests.helpers import REPO, flwr_run, modules_imported_by, uv_pip_install

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
PLUGIN = REPO / "examples" / "numpy-plugin"


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


def _site_packages(venv: Path) -> Path:
    (path,) = venv.glob("lib/python3*/site-packages")
    return path


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.system
def test_a_flower_project_that_lists_fedx_gets_no_torch_keeps_its_flower_and_runs_fedmr(
    tmp_path, monkeypatch
):
    """A fresh environment on the newest Flower fedx was checked with, then ``pip install`` of the
    user's project and this checkout (no extras): the project's Flower stays."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # fedx from the environment, not the checkout
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    flower = CHECKED_FLWR[-1]
    # The user's environment as it stands, prepared by uv (Ray's wheels hardlinked from uv's
    # cache): what is under test is the pip install of the project below, not this one.
    uv_pip_install(python, f"flwr[simulation]=={flower}", timeout=1200, env=env)
    # The user's project lists fedx-flower among its dependencies; pip takes it from the
    # checkout (--no-compile: byte-compiling what it installs is not under test).
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-compile", str(PLUGIN), str(REPO)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    packages = {
        package["name"].lower(): package["version"] for package in json.loads(listed.stdout)
    }
    names = set(packages)
    assert {"fedx-flower", "flwr", "ray", "scikit-learn", "numpy-plugin"} <= names
    assert packages["flwr"] == flower  # kept: fedx allows the project's Flower
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    print(f"environment: {_size(_site_packages(venv)) / 2**20:.0f} MiB of site-packages")

    # A tool of the app extra says what to install instead of a traceback.
    tool = subprocess.run(
        [venv / "bin" / "fedx-compare", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert tool.returncode == 1 and "torch (not installed)" in tool.stderr, tool.stderr
    assert 'pip install "fedx-flower[app]"' in tool.stderr

    located = subprocess.run(
        [python, "-c", "import fedx.strategies; print(fedx.strategies.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
        cwd=tmp_path,
    )
    assert Path(located.stdout.strip()).is_relative_to(venv)

    # The user's app, in Flower's simulation, on the light environment's Flower and fedx.
    spec = FederationSpec(
        0, tmp_path / "federation", port=free_port(), insecure=True, simulation=True,
        bin_dir=venv / "bin",
    )  # fmt: skip
    with LocalFederation(spec) as federation:
        federation.start_superlink(timeout=120)
        output = flwr_run(
            spec.environment(),
            PLUGIN,
            "num-server-rounds=2",
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=1",
            timeout=600,
            bin_dir=spec.bin_dir,
        )
    evaluation = re.search(r"Final federated evaluation: (\{.*\})", output)
    assert evaluation, output[-4000:]
    assert "2:" in evaluation.group(1), output[-4000:]


@pytest.mark.system
def test_flowers_runtime_install_of_the_app_brings_the_app_extra(tmp_path):
    """A SuperLink that installs a run's dependencies runs ``uv sync --no-install-project``
    in the app's folder (flwr/supercore/superexec/dependency_installer.py): that reads no
    extras, so pyproject.toml's default uv group must bring the app extra (a dry run here)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "fedx", tmp_path / "fedx", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "uv", "sync", "--python", sys.executable, "--no-install-project",
         "--no-install-package", "flwr", "--inexact", "--dry-run"],
        capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "runtime-env")},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    planned = set(re.findall(r"^ \+ ([\w.-]+)==", output, re.M))
    assert {"torch", "torchvision", "matplotlib", "scikit-learn", "ray"} <= planned, output[-3000:]
    assert "fedx" not in planned and "flwr" not in planned
