"""What fedx promises on a GPU: saved models load anywhere, ``deterministic`` runs repeat.

Checked where no GPU is:

* What a run saves holds CPU tensors whatever the server's model sat on: a
  model on the ``meta`` device stands for one on a GPU (a file written from
  it would hold tensors no other machine can load).
* The run config's ``deterministic`` reaches the training code on every
  path a message takes: the ClientApp called in-process, in a simulation's
  Ray actor (this module), and in a real ClientApp process forked by the warm
  executor (tests/test_warm_executor.py); the ServerApp evaluates with it.

Checked on a GPU only (system tests, skipped where torch sees no CUDA; the
``checks`` step of ``benchmarks/gpu/run.sh``): two simulated runs of one seed
with ``deterministic = true`` write the same ``metrics.json`` (the seconds
aside) and the same ``model.pt``, bit for bit, and that ``model.pt``, written
by a ServerApp that evaluated on the GPU, loads with a plain ``torch.load`` in
a process that sees no GPU. What the setting costs is measured, not promised:
``benchmarks/gpu_round.py``'s ``device-det`` row against ``device``.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Result

from fedx.config import ConfigError, RunConfig
from fedx.models import build_model
from fedx.outputs import MODEL_FILE
from fedx.server import saving
from fedx.server_app import main
from fedx.simulation.actor import ClientAppActor
from tests.helpers import DEFAULTS, REPO
from tests.standin_grid import real_clients_grid

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")
NODE = 7


# ----------------------------------------------------------------------
# Saved models
# ----------------------------------------------------------------------


def test_model_pt_holds_cpu_tensors_whatever_the_servers_model_sits_on(tmp_path):
    torch.manual_seed(0)
    trained = build_model("cnn", (1, 8, 8), 10).state_dict()
    with torch.device("meta"):  # where the server evaluated: not this machine's memory
        elsewhere = build_model("cnn", (1, 8, 8), 10)
    result = Result()
    result.arrays = ArrayRecord(trained)
    path = saving.save_models(object(), elsewhere, result, tmp_path)
    assert path == tmp_path / MODEL_FILE
    loaded = torch.load(path)  # no map_location, tensors only (weights_only)
    assert list(loaded) == list(trained)
    for name, tensor in loaded.items():
        assert tensor.device == torch.device("cpu"), name
        assert torch.equal(tensor, trained[name]), name


def test_a_run_without_results_saves_the_model_it_started_from_on_the_cpu(tmp_path):
    model = build_model("cnn", (1, 8, 8), 10)
    path = saving.save_models(object(), model, Result(), tmp_path)
    loaded = torch.load(path)
    assert all(t.device.type == "cpu" for t in loaded.values())
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_personalized_models_hold_cpu_tensors(tmp_path):
    weights = {"fc.weight": np.ones((2, 3), np.float32), "fc.bias": np.zeros(2, np.float32)}

    class Keeps:  # a strategy that keeps a model per client (KeepsPersonalizedModels)
        def personalized_models(self):
            return {4: ("cnn-1", weights)}

    path = saving.save_models(Keeps(), None, Result(), tmp_path)
    loaded = torch.load(path)
    assert loaded[4]["architecture"] == "cnn-1"
    state = loaded[4]["state_dict"]
    assert all(t.device.type == "cpu" for t in state.values())
    assert torch.equal(state["fc.weight"], torch.ones(2, 3))
    weights["fc.bias"][0] = 5  # the file's tensors are copies, not views of the strategy's arrays
    assert torch.equal(state["fc.bias"], torch.zeros(2))


# ----------------------------------------------------------------------
# The run config's device and deterministic keys
# ----------------------------------------------------------------------


def test_device_and_deterministic_are_checked_run_config_keys():
    cfg = RunConfig.from_mapping({**DEFAULTS})
    assert (cfg.device, cfg.deterministic) == ("auto", False)
    cfg = RunConfig.from_mapping({**DEFAULTS, "device": "cpu", "deterministic": True})
    assert (cfg.device, cfg.deterministic) == ("cpu", True)
    with pytest.raises(ConfigError, match="device='gpu': must be one of auto, cpu, cuda"):
        RunConfig.from_mapping({**DEFAULTS, "device": "gpu"})
    with pytest.raises(ConfigError, match="deterministic=1: must be true or false"):
        RunConfig.from_mapping({**DEFAULTS, "deterministic": 1})


def train_message() -> Message:
    torch.manual_seed(0)
    record = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
    content = RecordDict({"arrays": record, "config": ConfigRecord({"server-round": 1})})
    return Message(content, dst_node_id=NODE, message_type="train")


def node_context(**config) -> Context:
    run_config = {**DEFAULTS, "local-epochs": 1, "device": "cpu", **config}
    return Context(1, NODE, {"partition-id": 1, "num-partitions": 10}, RecordDict(), run_config)


def reporting_client_app() -> ClientApp:
    """fedx's training handler, reporting the kernels and cuBLAS setting its training ran with."""
    app = ClientApp()

    @app.train()
    def train_and_report(msg: Message, context: Context) -> Message:
        # pylint: disable=import-outside-toplevel,reimported
        import os as process_os

        import torch as process_torch

        from fedx.client import handlers

        seen = {}
        real = handlers.train

        def spy(*args, **kwargs):
            seen["deterministic"] = process_torch.are_deterministic_algorithms_enabled()
            seen["cublas"] = process_os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8"
            seen["device"] = str(kwargs["device"])
            return real(*args, **kwargs)

        handlers.train = spy
        try:
            reply = handlers.train_model(msg, context)
        finally:
            handlers.train = real
        reply.content["report"] = MetricRecord(
            {
                "deterministic-in-training": int(seen["deterministic"]),
                "cublas-set": int(seen["cublas"]),
                "cpu": int(seen["device"] == "cpu"),
                "deterministic-after": int(process_torch.are_deterministic_algorithms_enabled()),
            }
        )
        return reply

    return app


def test_the_clientapp_trains_with_deterministic_kernels_when_the_run_says_so(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # restored after the test, as it was
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    app = reporting_client_app()
    for deterministic in (True, False, True):
        reply = app(message=train_message(), context=node_context(deterministic=deterministic))
        report = reply.content["report"]
        assert report["deterministic-in-training"] == int(deterministic)
        assert report["deterministic-after"] == 0  # the call's setting ends with the call
        assert report["cpu"] == 1
    assert report["cublas-set"] == 1


@pytest.fixture
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.system
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


def test_the_serverapp_evaluates_with_deterministic_kernels(tmp_path, monkeypatch):
    from fedx.server import evaluation  # pylint: disable=import-outside-toplevel

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")

    seen = []
    real = evaluation.evaluate

    def spy(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(), str(args[2])))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", spy)
    config = {
        **DEFAULTS,
        "strategy": "fedavg",
        "num-server-rounds": 1,
        "local-epochs": 1,
        "deterministic": True,
        "device": "cpu",
        "output-dir": str(tmp_path),
        "run-name": "run",
    }
    context = Context(1, 0, {}, RecordDict(), config)
    main(real_clients_grid([11, 12, 13, 14], config), context)
    assert seen == [(True, "cpu"), (True, "cpu")]  # rounds 0 and 1
    assert not torch.are_deterministic_algorithms_enabled()  # until the run ends
    assert (tmp_path / "run" / MODEL_FILE).exists()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


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


def comparable_metrics(path: Path) -> dict:
    """``metrics.json`` without what the wall clock decides, nor what the runs differ in by design."""
    metrics = json.loads(path.read_text())
    metrics.pop("timings", None)
    metrics["rounds"] = [
        {k: v for k, v in row.items() if not k.endswith("-seconds")} for row in metrics["rounds"]
    ]
    metrics["final"] = {
        k: v for k, v in (metrics.get("final") or {}).items() if not k.endswith("-seconds")
    }
    for key in ("output-dir", "run-name"):
        metrics["config"].pop(key, None)
    return metrics


def test_metrics_compare_without_the_wall_clock_to_the_last_bit(tmp_path):
    """What the GPU test compares: every value but the seconds, to the last bit."""

    def written(name, seconds, loss):
        row = {"round": 2, "accuracy": 0.5, "train-loss": loss, "round-seconds": seconds}
        metrics = {
            "config": {"seed": 0, "run-name": name, "output-dir": str(tmp_path / name)},
            "rounds": [{"round": 0, "accuracy": 0.1}, row],
            "final": dict(row),
            "stop-reason": None,
            "timings": {"total-seconds": 10 * seconds},
        }
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(metrics))
        return comparable_metrics(path)

    assert written("a", 1.0, 0.25) == written("b", 2.0, 0.25)
    assert written("a", 1.0, 0.25) != written("c", 1.0, 0.25000000000000006)  # the last bit


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


@pytest.mark.system
@needs_cuda
def test_two_deterministic_runs_on_a_gpu_write_the_same_metrics_and_model(gpu_runs):
    first, second = gpu_runs
    assert comparable_metrics(first / "metrics.json") == comparable_metrics(second / "metrics.json")
    one, other = torch.load(first / MODEL_FILE), torch.load(second / MODEL_FILE)
    assert list(one) == list(other)
    for name in one:
        assert torch.equal(one[name], other[name]), name


@pytest.mark.system
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
