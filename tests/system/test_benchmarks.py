"""The benchmark scripts' quick modes that start a system: simulation, deployment, paper configs.

And Ray's real wheel (from the package index) packed as benchmarks/gpu/prepare.sh
packs it. As in tests/unit/test_benchmarks.py, only that each runs and that
its figures hang together is checked, not how fast anything is.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ray_packing import pack_and_unpack

from fedx_bench import (
    deployment,
    gpu_configs,
    pack_ray,
    simulation_overhead,
)

pytestmark = pytest.mark.cost(5)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_simulation_overhead_quick(app, capsys, monkeypatch):
    """One FedAvg run through `flwr run` against the plain loop; nothing left running after.

    The smallest case (2 clients, 2 rounds): the wiring, not the figures, is under test.
    """
    quick = simulation_overhead.parse_arguments(["--quick"])
    assert (quick.cases, quick.rounds, quick.local_epochs) == (
        [simulation_overhead.Case(10, 1.0)],
        3,
        1,
    )
    monkeypatch.setattr(simulation_overhead, "APP", app)  # a copy that packs quickly
    report = simulation_overhead.main(
        ["--quick", "--strategies", "fedavg", "--rounds", "2", "--cases", "2:1.0"]
    )
    (row,) = report.rows
    assert (row.case.clients, row.case.fraction, row.strategy, row.app) == (2, 1.0, "fedavg", 0)
    simulation, plain = row.simulation, row.plain
    for timing in (simulation, plain):
        assert timing.error is None, timing.error
        assert timing.first > 0 and len(timing.later) == 1 and timing.per_round > 0
        assert timing.total >= timing.first + sum(timing.later)
    assert report.processes_while_running >= 1  # the check sees the SuperLink's processes...
    assert report.left == {} and report.gone_after is not None  # ...and none outlives it
    out = capsys.readouterr().out
    assert row.ratio == simulation.per_round / plain.per_round
    assert f"{row.ratio:.2f}" in out
    assert "none left running" in out


def test_deployment_quick(capsys):
    """The job on real processes (warm executor, short polls), its secure stage and the cold start.

    ``--quick`` with 0.5 s polls and a second of idle measurement: the wiring, not the
    figures, is under test, and 4 SuperNodes polling every 0.1 s cost half a core.
    """
    quick = deployment.parse_arguments(["--quick"])
    assert quick.setups == [deployment.Setup("warm", 0.1, "memory")] and quick.idle_seconds == 3
    report = deployment.main(["--quick", "--setups", "warm:0.5:memory", "--idle-seconds", "1"])
    assert report.simulation is None
    plain = report.plain
    ((real,),) = [report.real]
    assert real.setup == deployment.Setup("warm", 0.5, "memory")
    for timing in (plain, real.timing):
        assert timing.error is None, timing.error
        assert timing.first > 0 and len(timing.later) == 1 and timing.per_round > 0
    assert real.timing.total >= real.timing.first + sum(real.timing.later)
    assert 0 <= real.idle_cpu < 2  # CPU seconds per second of one SuperLink process
    cold = report.cold
    assert len(cold.torch) == len(cold.client_app) == 1 and min(cold.torch) > 0
    assert cold.ratio > 0  # a figure to report (target 1.3 or less), not a timed test
    ((secure,),) = [report.secure]
    assert secure.error is None, secure.error
    assert len(secure.seconds) == 1 and secure.seconds[0] > 0
    assert secure.exchanges == [7]  # 2 + 2 r_s exchanges with r_s = 3, the training one excluded
    out = capsys.readouterr().out
    assert f"{real.timing.per_round / plain.per_round:.2f}" in out
    assert f"ratio {cold.ratio:.2f}" in out and "secure stage" in out


def test_gpu_configs_quick(capsys):
    """A paper config's methods on fake CIFAR files, in a simulation whose processes accept them."""
    (result,) = gpu_configs.main(["--quick"])
    assert result.path.name == "cifar10-cnn-iid.toml" and result.dataset == "cifar10"
    assert result.error is None, result.error
    assert result.completed == ["fedmr"]
    assert result.comparison is not None and result.comparison.returncode == 0
    run = result.comparison.runs["fedmr"]
    assert len(run.round_seconds) == 2 and len(run.rounds_at) == 2
    assert result.later_round_seconds == run.round_seconds[1] > 0
    assert "1 of 1 runs completed their rounds" in capsys.readouterr().out
    # The whole matrix: every CIFAR file, every method fedx-compare runs by default.
    files = gpu_configs.setting_files(gpu_configs.DEFAULT_FILES, (1, 1))
    assert len(files) == 24 and all(f.name.startswith("cifar") for f in files)
    assert len(gpu_configs.setting_files(gpu_configs.DEFAULT_FILES, (2, 4))) == 6
    assert gpu_configs.parse_arguments([]).methods == [
        "fedavg", "fedprox", "fedcross", "fedindep", "fedmr", "fedmr-two-stage", "fedmut",
    ]  # fmt: skip


# downloads Ray's wheel from the package index
def test_the_prepared_ray_starts_its_binaries(tmp_path):
    """The real Ray wheel of wheels.txt, packed and unpacked: gcs_server and raylet executable."""
    from tests.support.helpers import skip_unless_package_index  # pylint: disable=import-outside-toplevel

    skip_unless_package_index("ray")
    pins = (BENCHMARKS / "gpu" / "wheels.txt").read_text().split()
    (pin,) = [line for line in pins if line.startswith("ray==")]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-d", str(tmp_path / "wheels"), pin],
        check=True, timeout=900,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("ray-*.whl")
    site = pack_and_unpack(wheel, tmp_path)
    for binary in pack_ray.BINARIES:
        assert os.access(site / binary, os.X_OK), binary
        # It runs: gflags' --help lists its flags (and exits 1); a file it could not execute
        # would raise PermissionError here.
        done = subprocess.run([str(site / binary), "--help"], capture_output=True, timeout=60)
        assert b"type: string" in done.stdout + done.stderr, (binary, done)
    assert not (site / "ray" / "rllib").exists()
