"""A Flower SuperLink in simulation mode for end-to-end tests, and `flwr run` of the app against it.

The SuperLink runs on free 127.0.0.1 ports with a private FLWR_HOME, so the
tests neither use nor disturb a SuperLink the user may have running; the
session fixture in conftest.py stops it (and the simulation processes it
spawned) at the end.
"""

from contextlib import contextmanager
from pathlib import Path

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from tests.support.helpers import flwr_run

FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"


@contextmanager
def simulation_superlink(
    home: Path, *, bin_dir: Path | None = None, timeout: float = 60, **environment: str
):
    """A simulation SuperLink of our own (``environment`` added to its processes'); yields ``flwr``'s environment.

    ``bin_dir``: the environment whose Flower and fedx it runs (default: this one's).
    """
    spec = FederationSpec(
        0, home, port=free_port(), insecure=True, simulation=True, extra_environment=environment,
        **({"bin_dir": bin_dir} if bin_dir else {}),
    )  # fmt: skip
    with LocalFederation(spec) as federation:
        federation.start_superlink(timeout=timeout)
        yield spec.environment()


def run_app(env: dict, app: Path, run_config: str, timeout: float = 300) -> str:
    """``flwr run`` of the fedx app in ``app`` (the ``app`` fixture) in simulation
    (:data:`FEDERATION`); everything it printed."""
    return flwr_run(env, app, run_config, "--federation-config", FEDERATION, timeout=timeout)
