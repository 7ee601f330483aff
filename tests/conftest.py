"""Shared fixtures: small models made of real arrays."""

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from fedx.ops import Model


def make_model(rng: np.random.Generator, scale: float = 1.0) -> Model:
    """A small CNN-shaped state dict: conv, BatchNorm (with an int counter), linear."""
    return {
        "conv1.weight": (scale * rng.normal(size=(4, 1, 3, 3))).astype(np.float32),
        "conv1.bias": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.weight": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.bias": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.running_mean": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.running_var": np.abs(scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.num_batches_tracked": np.array(int(rng.integers(0, 100)), dtype=np.int64),
        "fc1.weight": (scale * rng.normal(size=(8, 16))).astype(np.float32),
        "fc1.bias": (scale * rng.normal(size=(8,))).astype(np.float32),
        "fc2.weight": (scale * rng.normal(size=(3, 8))).astype(np.float32),
        "fc2.bias": (scale * rng.normal(size=(3,))).astype(np.float32),
    }


@pytest.fixture
def models() -> list[Model]:
    """Six different models of the same architecture."""
    rng = np.random.default_rng(123)
    return [make_model(rng) for _ in range(6)]


@pytest.fixture
def server_task_identity():
    """Messages are stamped with the run and node of the process, as in a ServerApp."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def initial() -> Model:
    """The model a run starts from."""
    return make_model(np.random.default_rng(0))


# The tests that go through `flwr run` share one simulation SuperLink and one
# plain FedMR run: each Flower simulation costs a Ray start-up.
PLAIN_FEDMR = {"rounds": 3, "seed": 3}


@pytest.fixture(scope="session")
def superlink(tmp_path_factory):
    """Environment for `flwr` talking to a simulation SuperLink of the tests' own."""
    from tests.simulation import simulation_superlink  # pylint: disable=import-outside-toplevel

    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


@pytest.fixture(scope="session")
def plain_fedmr_run(superlink, tmp_path_factory):
    """FedMR on digits through `flwr run`: 4 nodes, 3 rounds, seed 3; the run's folder and output."""
    from tests.simulation import flwr_run  # pylint: disable=import-outside-toplevel

    outputs = tmp_path_factory.mktemp("plain-fedmr")
    run = flwr_run(
        superlink,
        f'num-server-rounds={PLAIN_FEDMR["rounds"]} seed={PLAIN_FEDMR["seed"]} '
        f'round-timeout=120.0 run-name="plain" output-dir="{outputs}"',
    )
    return outputs / "plain", run.stdout + run.stderr
