"""A Flower SuperLink in simulation mode for end-to-end tests, and `flwr run` against it.

The SuperLink runs on free 127.0.0.1 ports with a private FLWR_HOME, so the
tests neither use nor disturb a SuperLink the user may have running; the
session fixture in conftest.py stops it (and the simulation processes it
spawned) at the end.
"""

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from fedx.deploy.local import FederationSpec, LocalFederation, free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"


@contextmanager
def simulation_superlink(home: Path):
    """A simulation SuperLink of our own; yields the environment `flwr` needs."""
    spec = FederationSpec(0, home, port=free_port(), insecure=True, simulation=True)
    with LocalFederation(spec) as federation:
        federation.start_superlink(timeout=60)
        yield spec.environment()


def flwr_run(env: dict, run_config: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flwr"), "run", str(REPO), "--stream",
         "--federation-config", FEDERATION, "--run-config", run_config],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
