"""The fedx app end to end: `flwr run` against a SuperLink in simulation mode.

The test starts its own SuperLink on free 127.0.0.1 ports with a private
FLWR_HOME, so it neither uses nor disturbs a SuperLink the user may have
running, and stops it (and the simulation processes it spawned) at the end.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"SuperLink did not open port {port} within {timeout}s")


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    """A simulation SuperLink of our own; yields the environment `flwr` needs."""
    home = tmp_path_factory.mktemp("flwr-home")
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    log = open(home / "superlink.log", "w")  # pylint: disable=consider-using-with
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        [
            str(BIN / "flower-superlink"), "--insecure", "--simulation",
            "--isolation", "subprocess",
            "--control-api-address", f"127.0.0.1:{free_port()}",
            "--host", "127.0.0.1", "--port", str(port),
            "--database", str(home / "state.db"),
        ],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: we stop its children too
    )
    try:
        wait_for_port(port, 60)
        yield env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()


def flwr_run(env: dict, run_config: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flwr"), "run", str(REPO), "--stream",
         "--federation-config", FEDERATION, "--run-config", run_config],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_fedmr_on_digits_writes_metrics_curve_and_model(superlink, tmp_path):
    run = flwr_run(
        superlink,
        f'num-server-rounds=3 run-name="e2e" output-dir="{tmp_path}"',
    )
    output = run.stdout + run.stderr
    directory = tmp_path / "e2e"
    assert (directory / "metrics.json").exists(), output[-3000:]
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics["config"]["strategy"] == "fedmr"
    assert metrics["config"]["num-server-rounds"] == 3
    rounds = {row["round"]: row for row in metrics["rounds"]}
    assert sorted(rounds) == [0, 1, 2, 3]
    assert all(0.0 <= rounds[r]["accuracy"] <= 1.0 for r in rounds)
    assert all(rounds[r]["round-seconds"] > 0 for r in (1, 2, 3))
    assert all(rounds[r]["trained-slots"] == 4 for r in (1, 2, 3))
    # Three rounds of five local epochs on digits learn a lot from a random start.
    assert rounds[3]["accuracy"] > rounds[0]["accuracy"] + 0.2
    assert metrics["final"]["round"] == 3
    assert (directory / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (directory / "model.pt").stat().st_size > 100_000
    assert "10 different pool models" not in output  # 4 nodes, so K=4
    assert "4 nodes get 4 different pool models" in output


@pytest.mark.parametrize("strategy", ["fedmut", "fedcross"])
def test_fedmut_and_fedcross_run_through_flwr_run(superlink, tmp_path, strategy):
    run = flwr_run(
        superlink,
        f'strategy="{strategy}" num-server-rounds=2 '
        f'run-name="{strategy}" output-dir="{tmp_path}"',
    )
    metrics_file = tmp_path / strategy / "metrics.json"
    assert metrics_file.exists(), (run.stdout + run.stderr)[-3000:]
    metrics = json.loads(metrics_file.read_text())
    assert metrics["config"]["strategy"] == strategy
    rounds = {row["round"]: row for row in metrics["rounds"]}
    assert sorted(rounds) == [0, 1, 2]
    assert all(rounds[r]["trained-slots"] == 4 for r in (1, 2))
    assert rounds[2]["accuracy"] > rounds[0]["accuracy"] + 0.1


def test_bad_run_config_stops_the_run_with_one_clear_line(superlink, tmp_path):
    run = flwr_run(superlink, f'strategy="fedfoo" output-dir="{tmp_path}"', timeout=120)
    output = run.stdout + run.stderr
    assert "invalid run config strategy='fedfoo': must be one of fedavg, fedprox, fedmr, fedindep, fedmut, fedcross, fedme, fedavg-ft" in output
    assert not any(tmp_path.iterdir()), "no outputs for a run that never started"
