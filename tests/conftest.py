"""Fixtures of both tiers: models of real arrays, the app's defaults, a simulation, the docs site."""

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from fedx.ops import Model

# The container modules' fixtures: the images, the projects' folder.
from tests.support.containers import container_workdir, images  # noqa: F401
from tests.support.docs_site import build_site
from tests.support.helpers import DEFAULTS, PLAIN_FEDMR, make_model, skip_unless_importable

# The tiers: tests/system marks its tests `system` and modules start costliest first
# (tests/support/tiers.py); a test outside tests/system that starts a system errors
# (tests/support/system_mark.py).
from tests.support.system_mark import pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401
from tests.support.tiers import pytest_collection_modifyitems  # noqa: F401


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
    """A copy of the fedx app for `flwr run` (tests.support.helpers.copy_app: packing it is cheap)."""
    from tests.support.helpers import copy_app  # pylint: disable=import-outside-toplevel

    return copy_app(tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="session")
def superlink(tmp_path_factory):
    """Environment for `flwr` talking to a simulation SuperLink of the tests' own."""
    from tests.support.simulation import simulation_superlink  # pylint: disable=import-outside-toplevel

    with simulation_superlink(tmp_path_factory.mktemp("flwr-home")) as env:
        yield env


def session_folder(tmp_path_factory, worker_id: str) -> Path:
    """The session's temporary folder, shared by its xdist workers (each has its own below it)."""
    shared = tmp_path_factory.getbasetemp()
    return shared if worker_id == "master" else shared.parent


@pytest.fixture(scope="session")
def site(tmp_path_factory, worker_id) -> Path:
    """The documentation site, built from scratch once a session; its HTML folder.

    The unit tier checks what the build holds, the system tier reads it in a
    browser: the first worker to ask builds it (tests/support/docs_site.py,
    about 15 s of CPU) while the others wait on a lock, then read it.
    """
    skip_unless_importable("sphinx")
    shared = session_folder(tmp_path_factory, worker_id)
    out = shared / "docs-site"
    built = shared / "docs-site.built"  # written once the build passed
    with open(shared / "docs-site.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            shutil.rmtree(out, ignore_errors=True)  # a failed build's leftovers
            build_site(out)
            built.touch()
    return out / "html"


@pytest.fixture(scope="session")
def plain_fedmr_run(request, tmp_path_factory, worker_id):
    """FedMR on digits through `flwr run`: 4 nodes, 3 rounds, seed 3; the run's folder and output.

    Run once for the whole session: under pytest-xdist the first worker to ask
    runs it (on its own simulation SuperLink, the ``superlink`` fixture) and
    the others, waiting on a lock in the session's shared folder, read what it
    left there. Three modules compare with it, and each run is a simulation's
    start-up and 3 rounds of 4 clients.
    """
    shared = session_folder(tmp_path_factory, worker_id)
    outputs = shared / "plain-fedmr"
    printed = outputs / "flwr-run.txt"
    with open(shared / "plain-fedmr.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            from tests.support.simulation import run_app  # pylint: disable=import-outside-toplevel

            superlink = request.getfixturevalue("superlink")
            app = request.getfixturevalue("app")
            outputs.mkdir(exist_ok=True)
            # Deterministic kernels: tests/system/test_ray_cluster.py compares a cluster's run with this
            # one to the last bit, which on a GPU only these kernels promise.
            settings = (
                f"num-server-rounds={PLAIN_FEDMR['rounds']} seed={PLAIN_FEDMR['seed']}"
                " round-timeout=120.0 deterministic=true"
            )
            output = run_app(superlink, app, f'{settings} run-name="plain" output-dir="{outputs}"')
            printed.write_text(output)
    return outputs / "plain", printed.read_text()
