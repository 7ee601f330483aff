"""The run config's ``deterministic`` reaches the training code in a simulation's Ray actor.

fedx's ClientApp actor on a Ray started here answers two runs' messages in
turn, each with the kernels its run asks for. The other paths a message takes,
and the saved models' CPU tensors: tests/unit/test_gpu_promises.py.
"""

import pytest
import ray

from fedx.simulation.actor import ClientAppActor
from tests.support.kernel_report import NODE, node_context, reporting_client_app, train_message

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")


@pytest.fixture
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def test_a_simulations_actor_trains_with_the_kernels_each_run_asks_for(local_ray):
    """fedx's ClientApp actor, one process answering two runs' messages in turn."""
    actor = ClientAppActor.options(num_cpus=1).remote()
    app = reporting_client_app()
    try:
        for deterministic in (True, False):
            _, reply, _ = ray.get(
                actor.run.remote(
                    lambda: app,
                    train_message(),
                    str(NODE),
                    node_context(deterministic=deterministic),
                ),
                timeout=300,
            )
            assert not reply.has_error(), reply.error
            report = reply.content["report"]
            assert report["deterministic-in-training"] == int(deterministic)
            assert report["cublas-set"] == 1  # set by the first run, before any GPU work
            assert report["deterministic-after"] == 0
    finally:
        ray.kill(actor)
