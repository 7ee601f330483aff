"""Shared fixtures: small models made of real arrays, the app's defaults, a simulation SuperLink, a simulation's state."""

import fcntl
import os
from typing import Any

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from fedx.ops import Model

# The container modules' fixtures: the images, the projects' folder.
from tests.containers import container_workdir, images  # noqa: F401
from tests.helpers import DEFAULTS, PLAIN_FEDMR, make_model

# A test that starts a system without the `system` mark errors (tests/system_mark.py).
from tests.system_mark import pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401

# The modules that take longest (each a minute or more of process start-ups,
# installs and federated runs), longest first, by their time in a whole run
# (--durations). xdist hands out modules in collection order
# (`--no-loadscope-reorder` in pyproject.toml): these start first, and the many
# short modules fill in the other workers, so they end together. A slow module
# missing here starts last and runs on alone at the end.
SLOW_MODULES = (
    "test_containers.py",
    "test_benchmarks.py",
    "test_deploy_signals.py",
    "test_example_data_model.py",
    "test_ray_cluster.py",
    "test_deployment.py",
    "test_compare.py",
    "test_link_faults.py",
    "test_flower_mismatch.py",
    "test_packaging.py",
    "test_example_method.py",
    "test_compat_flwr136.py",
    "test_container_checks.py",
    "test_packed_restart.py",
    "test_install.py",
    "test_secure_e2e.py",
    "test_deployment_faults.py",
    "test_fedme_e2e.py",
    "test_app_e2e.py",
    "test_idle_polls.py",
    "test_stopped_runs.py",
    "test_group_training.py",
    "test_doc_commands.py",
    "test_docs.py",
    "test_plugin_app.py",
    "test_warm_executor.py",
)


def pytest_collection_modifyitems(items):
    """Slow modules first (see :data:`SLOW_MODULES`); the rest keep their order."""
    rank = {name: index for index, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def partition_cache(tmp_path_factory):
    """The tests' partition cache (fedx.data.cache): a folder of the session's, never the user's.

    Set in the environment, so the processes the tests start (flwr run, Ray
    workers, SuperNodes) share it.
    """
    from fedx.data.cache import CACHE_ENV  # pylint: disable=import-outside-toplevel

    folder = tmp_path_factory.mktemp("fedx-cache")
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if saved is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = saved


@pytest.fixture
def models() -> list[Model]:
    """Six different models of the same architecture."""
    rng = np.random.default_rng(123)
    return [make_model(rng) for _ in range(6)]


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test.

    The tests' models are tiny: with several threads on a small, busy machine
    (CI, or other test processes) the threads mostly wait for each other and
    run times swing by an order of magnitude. One thread is fast and steady.
    """
    import torch  # pylint: disable=import-outside-toplevel  (not every test needs torch)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def server_task_identity():
    """Messages are stamped with the run and node of the process, as in a ServerApp."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def simulation_state():
    """Flower's in-memory state with a run and three simulated nodes, as the engine sets it up.

    Yields the state, an ``InMemoryGrid`` on it, the node ids and their mapping.
    """
    # pylint: disable=import-outside-toplevel
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = factory.state()
    run = Run.create_empty(run_id=1)
    run.primary_task_id, run.federation_id = 2, NOOP_FEDERATION_ID
    state.run_ids[1] = RunRecord(run=run)
    state.task_store[2] = Task(task_id=2, run_id=1)
    nodes = vce_api._register_nodes(3, factory)  # pylint: disable=protected-access
    grid = InMemoryGrid(factory)
    grid.set_run(run)
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 2
    yield state, grid, list(nodes), nodes
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture
def initial() -> Model:
    """The model a run starts from."""
    return make_model(np.random.default_rng(0))


@pytest.fixture
def defaults() -> dict[str, Any]:
    """The app's run-config defaults (pyproject.toml), a copy to change."""
    return dict(DEFAULTS)


@pytest.fixture(scope="session")
def app(tmp_path_factory):
    """A copy of the fedx app for `flwr run` (tests.helpers.copy_app: packing it is cheap)."""
    from tests.helpers import copy_app  # pylint: disable=import-outside-toplevel

    return copy_app(tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="session")
def superlink(tmp_path_factory):
    """Environment for `flwr` talking to a simulation SuperLink of the tests' own."""
    from tests.simulation import simulation_superlink  # pylint: disable=import-outside-toplevel

    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


@pytest.fixture(scope="session")
def plain_fedmr_run(request, tmp_path_factory, worker_id):
    """FedMR on digits through `flwr run`: 4 nodes, 3 rounds, seed 3; the run's folder and output.

    Run once for the whole session: under pytest-xdist the first worker to ask
    runs it (on its own simulation SuperLink, the ``superlink`` fixture) and
    the others, waiting on a lock in the session's shared folder, read what it
    left there. Three modules compare with it, and each run is a simulation's
    start-up and 3 rounds of 4 clients.
    """
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the session's folder, above every worker's own
    outputs = shared / "plain-fedmr"
    printed = outputs / "flwr-run.txt"
    with open(shared / "plain-fedmr.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            from tests.simulation import run_app  # pylint: disable=import-outside-toplevel

            superlink = request.getfixturevalue("superlink")
            app = request.getfixturevalue("app")
            outputs.mkdir(exist_ok=True)
            # Deterministic kernels: tests/test_ray_cluster.py compares a cluster's run with this
            # one to the last bit, which on a GPU only these kernels promise.
            settings = (
                f"num-server-rounds={PLAIN_FEDMR['rounds']} seed={PLAIN_FEDMR['seed']}"
                " round-timeout=120.0 deterministic=true"
            )
            output = run_app(superlink, app, f'{settings} run-name="plain" output-dir="{outputs}"')
            printed.write_text(output)
    return outputs / "plain", printed.read_text()
