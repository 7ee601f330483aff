"""A Flower SuperLink in simulation mode for end-to-end tests, and `flwr run` against it.

The SuperLink runs on free 127.0.0.1 ports with a private FLWR_HOME, so the
tests neither use nor disturb a SuperLink the user may have running; the
session fixture in conftest.py stops it (and the simulation processes it
spawned) at the end.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def simulation_superlink(home: Path):
    """A simulation SuperLink of our own; yields the environment `flwr` needs."""
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
