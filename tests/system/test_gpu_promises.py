"""The run config's ``deterministic`` reaches the training code in a simulation's Ray actor.

fedx's ClientApp actor on a Ray started here answers two runs' messages in
turn, each with the kernels its run asks for. The other paths a message takes,
and the saved models' CPU tensors: tests/unit/test_gpu_promises.py.

On a GPU only (skipped where torch sees no CUDA; the ``checks`` step of
``benchmarks/gpu/run.sh``): two simulated runs of one seed with
``deterministic = true`` write the same ``metrics.json`` (the seconds aside)
and the same ``model.pt``, bit for bit, and that ``model.pt``, written by a
ServerApp that evaluated on the GPU, loads with a plain ``torch.load`` in a
process that sees no GPU. What the setting costs is measured, not promised:
``benchmarks/gpu_round.py``'s ``device-det`` row against ``device``.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from fedx.outputs import MODEL_FILE
from fedx.simulation.actor import ClientAppActor
from tests.support.gpu_metrics import comparable_metrics
from tests.support.helpers import REPO
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


# ----------------------------------------------------------------------
# On a GPU: two simulated runs of one seed (the system's own run, not a stand-in)
# ----------------------------------------------------------------------

#: What :func:`gpu_runs` runs: FedMR on CIFAR-10's ResNet-20 (batch norm and convolutions,
#: whose cuDNN kernels differ from run to run unless told not to), 4 nodes sharing the card.
GPU_SETTING = REPO / "configs" / "cifar10-resnet20-iid.toml"
GPU_METHOD = "fedmr"
GPU_NODES, GPU_ROUNDS = 4, 2
#: Loads a model file in a process that sees no GPU; prints what it holds.
LOAD_ON_CPU = """
import json, sys, torch
state = torch.load(sys.argv[1])
print(json.dumps({"gpu-visible": torch.cuda.is_available(),
                  "devices": sorted({t.device.type for t in state.values()})}))
"""
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory) -> list[Path]:
    """Two ``deterministic = true`` runs of seed 0 through fedx-compare, on fake CIFAR-10 files."""
    from fedx_bench import fake_cifar, gpu  # pylint: disable=import-outside-toplevel

    work = tmp_path_factory.mktemp("gpu-runs")
    root = work / "data"
    fake_cifar.write(root, "cifar10", train=2000, test=500)
    resources = argparse.Namespace(client_cpus=1.0, client_gpus=1 / GPU_NODES, timeout=600.0)
    overrides = {
        "num-server-rounds": GPU_ROUNDS,
        "eval-every": 1,
        "data-root": str(root),
        "local-epochs": 1,
        "min-available-nodes": GPU_NODES,
        "min-train-nodes": GPU_NODES,
        "fraction-train": 1.0,
        "first-stage-rounds": 0,
        "deterministic": True,
    }
    folders = []
    for label in ("first", "second"):
        out = work / label
        comparison = gpu.run_compare(
            GPU_SETTING, [GPU_METHOD], out, resources, root=root, num_supernodes=GPU_NODES,
            overrides=overrides,
        )  # fmt: skip
        assert comparison.runs[GPU_METHOD].finished, comparison.output_tail
        folders.append(out / "runs" / GPU_SETTING.stem / GPU_METHOD / "seed-0")
    return folders


@needs_cuda
def test_two_deterministic_runs_on_a_gpu_write_the_same_metrics_and_model(gpu_runs):
    first, second = gpu_runs
    assert comparable_metrics(first / "metrics.json") == comparable_metrics(second / "metrics.json")
    one, other = torch.load(first / MODEL_FILE), torch.load(second / MODEL_FILE)
    assert list(one) == list(other)
    for name in one:
        assert torch.equal(one[name], other[name]), name


@needs_cuda
def test_a_model_written_after_evaluating_on_a_gpu_loads_where_no_gpu_is(gpu_runs):
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ON_CPU, str(gpu_runs[0] / MODEL_FILE)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"gpu-visible": False, "devices": ["cpu"]}
