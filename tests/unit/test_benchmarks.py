"""The benchmark scripts' quick modes run and report well-formed, plausible figures.

The scripts are reports, not tests: these tests only check that each one
runs and that what it measures hangs together (positive times and sizes,
ratios taken against the baseline of the same run), not how fast anything is.
"""

import math
import os
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.support.ray_packing import pack_and_unpack

from fedx_bench import (
    fast_setup,
    gpu,
    gpu_round,
    hostile_replies,
    idle_federation,
    pack_ray,
    round_bytes,
    server_ops,
)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_server_ops_shapes_are_the_real_models():
    """The numpy-only shapes are exactly the state dicts of fedx's cnn and vgg16 on CIFAR."""
    from fedx.models import build_model  # pylint: disable=import-outside-toplevel

    for architecture in ("cnn", "vgg16"):
        model = build_model(architecture, (3, 32, 32), 10)
        expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
        assert server_ops.shapes_for(architecture) == expected


def test_server_ops_quick(capsys):
    """K=10 CNN: every op timed, its ratio taken against the floor of the same case."""
    (case,) = server_ops.main(["--quick"])
    assert (case.architecture, case.count, case.refused) == ("cnn", 10, None)
    assert case.params == 2_156_490
    assert case.floor_seconds > 0
    labels = [op.label for op in case.ops]
    assert any("cross_aggregate" in label for label in labels)
    assert any("fedme_aggregate" in label for label in labels)
    for op in case.ops:
        assert op.seconds is not None and op.seconds > 0, op.label
        assert math.isclose(op.ratio, op.seconds / case.floor_seconds), op.label
        assert op.verdict in ("PASS", "MISS", "")
    pool_bytes = case.count * case.params * 4
    assert pool_bytes < case.peak_rss < pool_bytes + 2 * 2**30
    out = capsys.readouterr().out
    assert "floor (in-place sum of K models)" in out and "peak RSS" in out


def test_server_ops_refuses_a_case_that_does_not_fit(capsys):
    """K=100 VGG-16 (6.1 GB pool) is refused up front under a 1 GiB limit, nothing allocated."""
    (case,) = server_ops.main(["--models", "100", "--arch", "vgg16", "--max-memory-gib", "1"])
    assert case.refused is not None and case.floor_seconds is None and not case.ops
    assert "refused: needs about 11.5 GiB" in capsys.readouterr().out


def test_hostile_replies_quick(capsys):
    """Every case read once, its figures taken against the valid reply of its form, same run."""
    readings = hostile_replies.main(["--quick", "--repeats", "1"])
    forms = {r.form for r in readings}
    assert forms == {"packed", "standard"}
    for reading in readings:
        assert reading.seconds > 0 and reading.peak_bytes >= 0, reading
        valid = reading.case == "valid" or "byte order" in reading.case
        assert (reading.outcome == "read") == valid, reading
    out = capsys.readouterr().out
    assert "x valid" in out and "refused: " in out


def test_round_bytes_quick(server_task_identity, capsys):
    """Serialized bytes per round: one model per client, two for FedMe, more when secure."""
    strategies = ["fedavg", "fedmr", "fedme", "fedmr-secure"]
    results = round_bytes.main(["--quick", "--strategies", *strategies])["cnn"]
    by_name = {traffic.strategy: traffic for traffic in results}
    assert list(by_name) == strategies
    assert all(traffic.error is None for traffic in results), [t.error for t in results]
    model_bytes = 2_156_490 * 4
    k = 3
    fedavg = by_name["fedavg"]
    # A message is its arrays plus a little metadata and config.
    assert k * model_bytes < fedavg.down < k * model_bytes * 1.01
    assert k * model_bytes < fedavg.up < k * model_bytes * 1.01
    assert fedavg.messages == k
    # The ServerApp pushes FedAvg's one model once; FedMR's K different models each.
    assert model_bytes < fedavg.pushed < 1.01 * model_bytes
    assert by_name["fedmr"].pushed > (k - 0.5) * model_bytes
    assert by_name["fedmr"].down / fedavg.down == pytest.approx(1.0, abs=0.01)
    assert by_name["fedme"].down / fedavg.down == pytest.approx(2.0, abs=0.01)
    assert by_name["fedme"].up / fedavg.up == pytest.approx(2.0, abs=0.01)
    assert by_name["fedme"].query > 0
    secure = by_name["fedmr-secure"]
    assert secure.down > fedavg.down and secure.up > fedavg.up
    assert secure.messages > k  # the relay's exchanges come on top of the training messages
    out = capsys.readouterr().out
    assert "down/FedAvg" in out and "fedmr-secure" in out


def test_fast_setup_runs_the_readme_command_with_nothing_exported(tmp_path, monkeypatch):
    """What fast_setup.py runs is fedx-deploy's fast setup, its threads left to fedx-deploy."""
    from tests.support.deployment import deploy_up_faked  # pylint: disable=import-outside-toplevel

    assert fast_setup.FAST_SETUP[:2] == ["fedx-deploy", "up"]
    code, started = deploy_up_faked(monkeypatch, tmp_path, " ".join(fast_setup.FAST_SETUP[2:]))
    spec = started["spec"]
    assert code == 0 and started["command"][2] == "."  # flwr run . (the app's folder)
    assert (spec.num_supernodes, spec.executor, spec.poll_interval) == (3, "warm", 0.1)
    assert spec.superlink_database == "memory" and spec.superlink == "fedx" and spec.tls is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = fast_setup.command_environment(tmp_path)
    assert "OMP_NUM_THREADS" not in env and "FEDX_CLIENTAPP_THREADS" not in env
    assert env["PYTHONPATH"].split(":") == [str(tmp_path), "/elsewhere"]
    base = fast_setup.free_ports(4)
    assert 20000 <= base < 60000
    # The command comes from the README: one line, or a clear error.
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nfedx-deploy up --insecure --run .\n```\n")
    assert fast_setup.readme_command(readme) == ["fedx-deploy", "up", "--insecure", "--run", "."]
    readme.write_text("fedx-deploy up --insecure\nfedx-deploy up --supernodes 2\n")
    with pytest.raises(RuntimeError, match="found 2"):
        fast_setup.readme_command(readme)


def test_gpu_round_quick(capsys):
    """The plain loops of the round on tiny CIFAR-shaped data: every variant times its rounds."""
    rows = gpu_round.main(["--quick"])
    assert [row.variant for row in rows] == ["loader", "device", "device-det", "group"]
    for row in rows:
        assert row.error is None, row.error
        assert len(row.round_seconds) == 2 and min(row.round_seconds) > 0
        assert row.per_round == row.round_seconds[1]
        assert row.reading.samples == 0 or row.reading.busy is not None  # n/a without a GPU
    out = capsys.readouterr().out
    assert "x target" in out and "target 0.6 s a round" in out
    assert f"{rows[0].per_round / gpu_round.TARGET_SECONDS:.2f}" in out


def test_gpu_monitor_summarises_the_samples_of_a_stretch():
    # A stand-in for nvidia-smi: its samples come a tenth of a second apart.
    lines = ["50, 1000", "100, 3000", "0, 2000", "not a sample"]
    script = (
        f"import time\nfor line in {lines!r}:\n    print(line, flush=True)\n    time.sleep(0.1)"
    )
    with gpu.GpuMonitor((sys.executable, "-c", script)) as monitor:
        deadline = time.monotonic() + 30
        while len(monitor.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [(u, m) for _, u, m in monitor.samples] == [(0.5, 1000.0), (1.0, 3000.0), (0.0, 2000.0)]
    whole = monitor.reading()
    assert whole.samples == 3 and whole.busy == pytest.approx(0.5) and whole.peak_mib == 3000
    last = monitor.reading(start=monitor.samples[2][0])
    assert (last.samples, last.busy, last.peak_mib) == (1, 0.0, 2000.0)
    assert gpu.Reading().text() == "busy n/a"
    with gpu.GpuMonitor(("no-such-nvidia-smi",)) as absent:
        assert not absent.available
    assert absent.reading().samples == 0


def test_idle_federation_measures_each_kind_of_process_of_the_readme_setup_without_its_run():
    import subprocess  # pylint: disable=import-outside-toplevel

    import psutil  # pylint: disable=import-outside-toplevel

    command = idle_federation.idle_command()
    assert command[:2] == ["fedx-deploy", "up"] and "--run" not in command
    assert command == [w for w in idle_federation.fast_setup.FAST_SETUP if w not in ("--run", ".")]
    # A stand-in SuperNode that works for a moment within the window (and still runs at its
    # end, as a SuperNode does), below a stand-in fedx-deploy that sleeps.
    busy = (
        "import time\ntime.sleep(0.8)\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\ntime.sleep(30)\n"
    )
    program = (  # the child's name, not its parent's command line, says "fedx-supernode"
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], 'fedx-' + 'supernode'])\n"
        "time.sleep(30)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", program, busy, "fedx-deploy"])
    try:
        time.sleep(0.5)  # the child has started
        window = idle_federation.measure(psutil.Process(root.pid), 0.0, 1.5, time.monotonic())
    finally:
        for process in idle_federation.tree(psutil.Process(root.pid))[
            ::-1
        ]:  # the child, then the root
            process.kill()
        root.wait()
    assert window.counts == {"fedx-deploy": 1, "SuperNodes": 1}
    assert 0.05 < window.share["SuperNodes"] <= 1.0  # its 0.3 CPU s, within the 1.5 s
    assert window.share["fedx-deploy"] < 0.05 and window.total == sum(window.share.values())


def test_fast_setup_prints_each_exchange_step_side_by_side(capsys):
    before, after = Path("/tmp/fedx-before"), Path("/tmp/fedx-after")

    def timing(per_round):
        return fast_setup.Timing(first=per_round, later=[per_round], total=2 * per_round)

    repeats = [
        fast_setup.Repeat(
            timing(1.0),
            commands={before: timing(4.0), after: timing(2.0)},
            steps={
                before: {"child: ClientApp handler": [1.0, 3.0], "the exchange": [3.5]},
                after: {"child: ClientApp handler": [1.0], "the exchange": [1.5]},
            },
        )
    ]
    fast_setup.print_steps([before, after], repeats)
    lines = capsys.readouterr().out.splitlines()
    handler = next(line for line in lines if line.startswith("child: ClientApp handler"))
    assert handler.split()[-2:] == ["2.000", "1.000"]  # the medians, before then after
    outside = next(line for line in lines if line.startswith("the round outside its exchange"))
    assert outside.split()[-2:] == ["0.500", "0.500"]  # 4.0 - 3.5 and 2.0 - 1.5


# ----------------------------------------------------------------------
# benchmarks/gpu/prepare.sh's Ray: packed with every file's mode
# ----------------------------------------------------------------------


def test_the_packed_ray_keeps_every_file_mode(tmp_path):
    """A wheel's recorded modes survive prepare.sh's packing: Ray's own processes stay executable."""
    files = {
        **{binary: 0o755 for binary in pack_ray.BINARIES},
        "ray/__init__.py": 0o644,
        "ray/_private/services.py": 0o600,
        "ray/rllib/__init__.py": 0o644,  # stripped
        "ray-2.55.1.dist-info/RECORD": 0o644,
    }
    wheel = tmp_path / "ray-2.55.1-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, mode in files.items():
            entry = zipfile.ZipInfo(name)
            entry.external_attr = (stat.S_IFREG | mode) << 16  # as wheels record them
            archive.writestr(entry, f"contents of {name}\n")
    site = pack_and_unpack(wheel, tmp_path)
    for name, mode in files.items():
        path = site / name
        if name.startswith("ray/rllib"):
            assert not path.exists(), name
            continue
        assert stat.S_IMODE(path.stat().st_mode) == mode, name
        assert path.read_text() == f"contents of {name}\n"
    for binary in pack_ray.BINARIES:
        assert os.access(site / binary, os.X_OK), binary
    # What prepare.sh did before: extract without the modes, and no binary is executable.
    plain = tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(plain)], check=True)
    assert not any(os.access(plain / binary, os.X_OK) for binary in pack_ray.BINARIES)
