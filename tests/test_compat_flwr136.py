"""fedx.strategies on Flower 1.36, the last release whose Fleet API is gRPC.

The test builds (once; later runs and other checkouts reuse it) a virtual
environment with ``flwr==1.36.*`` and numpy only, no torch, under
``$XDG_CACHE_HOME/fedx/tests/`` (else ``~/.cache/fedx/tests/``), outside the
repository as pip's own cache is; its processes import fedx from this
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
from pathlib import Path

import pytest

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.strategies import OLDEST_FLWR
from tests.deployment import REPO, WIRE_APP, run_app
from tests.helpers import skip_unless_package_index

PIN = "flwr==" + ".".join(OLDEST_FLWR.split(".")[:2]) + ".*"
VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "fedx"
    / "tests"
    / f"venv-{PIN.replace('==', '-').rstrip('.*')}-py{sys.version_info.major}.{sys.version_info.minor}"
)
READY = VENV / "fedx-ready.txt"
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


def _usable(venv: Path) -> bool:
    """Whether a built environment imports Flower and numpy."""
    python = venv / "bin" / "python"
    if not (READY.exists() and python.exists()):
        return False
    probe = subprocess.run(
        [str(python), "-c", "import flwr, numpy"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


def compat_environment() -> Path:
    """The cached Flower 1.36 environment; (re)built first if missing or stale."""
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
        _run([*pip, PIN, "numpy"], timeout=900)
        READY.write_text(f"{PIN} + numpy; fedx from PYTHONPATH\n")
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
    python = flower136.spec.bin_dir / "python"
    code = (
        "import sys, importlib.metadata as m, fedx.strategies; "
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
    missing = subprocess.run(
        [str(python), "-c", "import torch"], capture_output=True, timeout=120, check=False
    )
    assert missing.returncode != 0, "the compatibility environment must not have torch"


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
