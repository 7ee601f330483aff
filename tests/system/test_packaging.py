"""fedx as a package index serves it: ``fedx-flower``'s sdist and wheel, built and checked, and the
wheel (not the checkout, not editable) installed in fresh virtual environments.

``python -m build`` makes the sdist, then the wheel from the sdist (so the
sdist holds everything the wheel needs); ``twine check --strict`` checks both
as the index would (the README renders as the long description). The wheel
is then installed alone (the light install: the strategies, no torch, a tool
of the app extra says what to install) and with the app extra, whose app
runs a round of the default job from the installed package.
"""

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from fedx.extras import DISTRIBUTION
from fedx.flower import CHECKED_FLWR
from tests.support.helpers import REPO, flwr_run, skip_unless_importable, uv_pip_install
from tests.support.simulation import simulation_superlink

pytestmark = pytest.mark.cost(3)

# A package index: build's isolated environment (hatchling) and pip's installs.

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
#: The environment of a child process that must not see the checkout.
CLEAN = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(command: list, timeout: float, **options) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout, check=False,
        env=options.pop("env", CLEAN), **options,
    )  # fmt: skip
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel ``python -m build`` makes of the checkout."""
    skip_unless_importable("build")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, REPO], timeout=900, env=os.environ)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_the_sdist_and_the_wheel_are_fedx_flowers_and_pass_twines_check(built):
    skip_unless_importable("twine")
    sdist, wheel = built
    version = PROJECT["version"]
    assert (sdist.name, wheel.name) == (
        f"fedx_flower-{version}.tar.gz",
        f"fedx_flower-{version}-py3-none-any.whl",
    )
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], 300)
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.parser.Parser().parsestr(
            archive.read(f"fedx_flower-{version}.dist-info/METADATA").decode()
        )
    assert metadata["Name"] == DISTRIBUTION and metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    assert f"fedx_flower-{version}.dist-info/licenses/LICENSE" in names
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().startswith("# fedx\n")  # the README, whole
    assert metadata["Requires-Python"] == ">=3.11"
    assert "Programming Language :: Python :: 3.11" in metadata.get_all("Classifier")
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(urls), urls
    requirements = metadata.get_all("Requires-Dist")
    newest = CHECKED_FLWR[-1].rsplit(".", 1)[0]  # 1.42: the range ends below the next minor
    next_minor = f"1.{int(newest.split('.')[1]) + 1}"
    assert f"flwr<{next_minor},>=1.36" in requirements
    assert f"flwr[simulation]<{next_minor},>=1.41; extra == 'app'" in requirements
    # The import package, and nothing of the checkout besides.
    assert {"fedx/__init__.py", "fedx/flower/_installer.py", "fedx/strategies/__init__.py"} <= set(
        names
    )
    assert all(n.startswith(("fedx/", f"fedx_flower-{version}.dist-info/")) for n in names)
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "LICENSE", "fedx/__init__.py"} <= members
    assert not any(m.startswith((".venv/", ".hypothesis/", "outputs/", "data/")) for m in members)


def test_the_wheel_installs_light_and_with_the_app_extra_and_runs_the_app(
    built, tmp_path, monkeypatch
):
    monkeypatch.delenv("PYTHONPATH", raising=False)  # fedx from the environment, not the checkout
    _, wheel = built
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], 300)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    # Light: the wheel alone, from the index its dependencies (no torch), by pip as a user would.
    _run([python, "-m", "pip", "install", "--quiet", wheel], 1800)
    listed = _run([python, "-m", "pip", "list", "--format", "freeze"], 120).stdout.lower()
    assert f"{DISTRIBUTION}==" in listed and "torch==" not in listed
    located = _run(
        [python, "-c", "import fedx.strategies; print(fedx.strategies.__file__)"],
        120,
        cwd=tmp_path,
    )
    assert Path(located.stdout.strip()).is_relative_to(venv)  # not the checkout
    tool = subprocess.run(
        [bin_dir / "fedx-compare", "--help"], capture_output=True, text=True, timeout=120,
        check=False, env=CLEAN,
    )  # fmt: skip
    assert tool.returncode == 1 and f'pip install "{DISTRIBUTION}[app]"' in tool.stderr
    # With the app extra: the tools start, and the app runs from the installed package. The
    # extra's requirements come from the wheel's metadata; uv installs them (torch and its
    # CUDA libraries: gigabytes that pip would unzip again into every fresh environment;
    # uv hardlinks them from its cache).
    uv_pip_install(python, f"{DISTRIBUTION}[app] @ {wheel.as_uri()}", timeout=3600, env=CLEAN)
    listed = _run([python, "-m", "pip", "list", "--format", "freeze"], 120).stdout.lower()
    assert f"{DISTRIBUTION}==" in listed and "torch==" in listed
    assert _run([bin_dir / "fedx-compare", "--help"], 300).stdout.startswith("usage: fedx-compare")
    app = tmp_path / "app"  # the app's configuration alone: its code is the installed wheel's
    app.mkdir()
    shutil.copy2(REPO / "pyproject.toml", app / "pyproject.toml")
    with simulation_superlink(tmp_path / "federation", bin_dir=bin_dir, timeout=180) as env:
        output = flwr_run(
            env,
            app,
            f'num-server-rounds=1 output-dir="{tmp_path / "outputs"}"',
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=1",
            timeout=900,
            bin_dir=bin_dir,
        )
    assert re.search(r"\[ROUND 1/1\]", output) or "ROUND 1" in output, output[-4000:]
    assert list((tmp_path / "outputs").glob("*/metrics.json")), output[-4000:]
