"""fedx.strategies on Flower 1.36, the last release whose Fleet API is gRPC.

The test builds (once; later runs and other checkouts reuse it) a virtual
environment with what ``fedx-flower`` installs without extras (the
``dependencies`` of ``pyproject.toml``), Flower pinned to ``flwr==1.36.*``:
no torch. It lives under ``$XDG_CACHE_HOME/fedx/tests/`` (else
``~/.cache/fedx/tests/``), outside the repository as pip's own cache is, and
is built again when that list changes; its processes import fedx from this
checkout through ``PYTHONPATH``. It then starts a 1.36
SuperLink (Fleet and Control API over gRPC) and three 1.36 SuperNodes on
free 127.0.0.1 ports and runs the numpy test app (tests/wire_app) with
FedMR, FedMut and FedCross from ``fedx.strategies``. Everything it starts is
stopped at the end. It needs PyPI the first time.
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.strategies import OLDEST_FLWR
from tests.support.deployment import REPO, WIRE_APP, run_app
from tests.support.helpers import skip_unless_package_index

pytestmark = pytest.mark.cost(2)

PIN = "flwr==" + ".".join(OLDEST_FLWR.split(".")[:2]) + ".*"
VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "fedx"
    / "tests"
    / f"venv-{PIN.replace('==', '-').rstrip('.*')}-py{sys.version_info.major}.{sys.version_info.minor}"
)
READY = VENV / "fedx-ready.txt"
#: The light install's requirements (``fedx-flower`` without extras), Flower pinned to 1.36.
REQUIREMENTS = [
    PIN if Requirement(text).name == "flwr" else text
    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
]
#: What the app extra brings and the light install must not.
HEAVY = ("torch", "torchvision", "matplotlib", "ray")
# fedx comes from this checkout, whichever checkout runs the test.
CHECKOUT_PATH = {"PYTHONPATH": str(REPO)}


def _run(command: list, timeout: float) -> None:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def _ready_text() -> str:
    return f"{' '.join(REQUIREMENTS)}; fedx from PYTHONPATH\n"


def _usable(venv: Path) -> bool:
    """Whether a built environment holds today's requirements and imports Flower and numpy."""
    python = venv / "bin" / "python"
    if not (READY.exists() and python.exists() and READY.read_text() == _ready_text()):
        return False
    probe = subprocess.run(
        [str(python), "-c", "import flwr, numpy"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


def compat_environment() -> Path:
    """The cached light install on Flower 1.36; (re)built first if missing or stale."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time
        if _usable(VENV):
            return VENV
        skip_unless_package_index()  # building it installs Flower 1.36 from the index
        shutil.rmtree(VENV, ignore_errors=True)
        python = VENV / "bin" / "python"
        _run([sys.executable, "-m", "venv", VENV], timeout=300)
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
        _run([*pip, *REQUIREMENTS], timeout=900)
        READY.write_text(_ready_text())
        return VENV


@pytest.fixture(scope="module")
def flower136(tmp_path_factory):
    """Three 1.36 SuperNodes connected to a 1.36 SuperLink over gRPC."""
    venv = compat_environment()
    spec = FederationSpec(
        num_supernodes=3,
        state_dir=tmp_path_factory.mktemp("flower136"),
        port=free_port(),  # 1.36's Runtime API (HTTP)
        supernode_ports=[free_port() for _ in range(3)],
        insecure=True,
        transport="grpc",
        fleet_port=free_port(),
        control_port=free_port(),
        bin_dir=venv / "bin",
        extra_environment=CHECKOUT_PATH,
    )
    with LocalFederation(spec) as federation:
        federation.start()
        for index in range(3):
            federation.node_id(index, timeout=180)
        yield federation


def test_the_environment_has_flower_136_and_no_torch(flower136):
    """The light install: what fedx's users import works, and the app extra is not there."""
    python = flower136.spec.bin_dir / "python"
    code = (
        "import sys, importlib.metadata as m, fedx.strategies, fedx.ops, fedx.registry, "
        "fedx.secure.client, fedx.protocol.fedme; "
        "print(m.version('flwr')); print(any(n == 'torch' or n.startswith('torch.') for n in sys.modules)); "
        "print(fedx.strategies.__file__)"
    )
    done = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **CHECKOUT_PATH},
    )
    flwr_version, torch_loaded, location = done.stdout.split()
    assert flwr_version.startswith(OLDEST_FLWR.rsplit(".", 1)[0] + ".")
    assert torch_loaded == "False"
    assert Path(location) == REPO / "fedx" / "strategies" / "__init__.py"
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = {package["name"].lower() for package in json.loads(installed.stdout)}
    assert {"flwr", "numpy", "scikit-learn"} <= names
    assert not names & set(HEAVY), "the light install must not have the app extra's packages"


def test_fedmr_fedmut_fedcross_run_on_grpc_supernodes(flower136, tmp_path):
    superlink_log = (flower136.spec.log_dir / "superlink.log").read_text(errors="replace")
    assert f"Starting Fleet API (gRPC-rere) on {flower136.spec.fleet_address}" in superlink_log
    output = run_app(
        flower136,
        WIRE_APP,
        f'strategies="fedmr,fedmut,fedcross" num-server-rounds=2 result-file="{tmp_path / "result.json"}"',
        timeout=420,
    )
    assert (tmp_path / "result.json").exists(), output[-4000:]
    summary = json.loads((tmp_path / "result.json").read_text())
    assert summary["flwr-version"].startswith("1.36.")
    assert list(summary["strategies"]) == ["fedmr", "fedmut", "fedcross"]
    for name, expected in [("fedmr", "FedMR"), ("fedmut", "FedMut"), ("fedcross", "FedCross")]:
        result = summary["strategies"][name]
        assert result["class"] == expected
        assert result["rounds"] == [1, 2]
        assert result["trained-slots"] == {"1": 3, "2": 3}, (name, output[-3000:])
        assert len(result["pool"]) == 3
        assert all(loss < 1.2 for loss in result["train-loss"].values())  # ln 3 = 1.10 at the start
    # Different methods, same seed and nodes: different pools.
    assert len({tuple(r["pool"]) for r in summary["strategies"].values()}) == 3
