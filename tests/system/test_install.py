"""fedx's light install in a fresh environment, with packages from the package index.

A user's Flower project that lists fedx among its dependencies installs it
next to its own ``flwr[simulation]`` with no torch and runs FedMR
(``examples/numpy-plugin``); Flower's own installation of a run's
dependencies (``uv sync``) installs the app extra for fedx's app. What the
light modules import, read from the code: tests/unit/test_install.py.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.flower import CHECKED_FLWR
from tests.support.helpers import REPO, flwr_run, uv_pip_install

pytestmark = pytest.mark.cost(2)

#: What the app extra brings and the light install must not (as in tests/unit/test_install.py).
HEAVY = ("torch", "torchvision", "matplotlib")
PLUGIN = REPO / "examples" / "numpy-plugin"


def _site_packages(venv: Path) -> Path:
    (path,) = venv.glob("lib/python3*/site-packages")
    return path


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


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
