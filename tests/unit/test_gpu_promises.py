"""What fedx promises on a GPU, checked where no GPU is: saved models and deterministic kernels.

* What a run saves holds CPU tensors whatever the server's model sat on: a
  model on the ``meta`` device stands for one on a GPU (a file written from
  it would hold tensors no other machine can load).
* The run config's ``deterministic`` reaches the training code on every
  path a message takes: the ClientApp called in-process, in a simulation's
  Ray actor (this module), and in a real ClientApp process forked by the warm
  executor (tests/unit/test_warm_executor.py); the ServerApp evaluates with it.
"""

import json
import os

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from flwr.serverapp.strategy import Result

from fedx.config import ConfigError, RunConfig
from fedx.models import build_model
from fedx.outputs import MODEL_FILE
from fedx.server import saving
from fedx.server_app import main
from tests.support.gpu_metrics import comparable_metrics
from tests.support.helpers import DEFAULTS
from tests.support.kernel_report import node_context, reporting_client_app, train_message
from tests.support.standin_grid import real_clients_grid

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")


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
