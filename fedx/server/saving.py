"""What a finished run saves besides its metrics: the global model or the clients' models."""

from collections.abc import Mapping
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common import log
from flwr.serverapp.strategy import Result

from fedx.arrays import to_numpy_dict
from fedx.outputs import MODEL_FILE, RunRecorder
from fedx.strategy_core.capabilities import KeepsPersonalizedModels

#: What a run whose strategy keeps one model per client saves instead of one
#: global model: every client's architecture and state dict, by client id.
PERSONALIZED_MODELS_FILE = "personalized-models.pt"


def save_models(
    strategy: object, model: torch.nn.Module | None, result: Result, directory: Path
) -> Path:
    """Save the global model (``model.pt``), or the clients' models; return the file.

    What is saved holds CPU tensors, made from the arrays the run ends with,
    wherever the server evaluated (its ``model`` may sit on a GPU): the file
    loads with ``torch.load(path)`` on any machine, no ``map_location``.
    """
    if isinstance(strategy, KeepsPersonalizedModels):
        personalized = {
            client_id: {"architecture": architecture, "state_dict": _cpu_state_dict(weights)}
            for client_id, (architecture, weights) in strategy.personalized_models().items()
        }
        path = directory / PERSONALIZED_MODELS_FILE
        torch.save(personalized, path)
        return path
    assert model is not None, "a run with a global model has a model to save it in"
    # No rounds' result (a run stopped before its first): the model it started from.
    arrays = result.arrays if len(result.arrays) > 0 else ArrayRecord(model.state_dict())
    path = directory / MODEL_FILE
    torch.save(_cpu_state_dict(to_numpy_dict(arrays)), path)
    return path


def _cpu_state_dict(weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A state dict of CPU tensors, each its own copy of the array."""
    return {name: torch.from_numpy(np.array(array)) for name, array in weights.items()}


def log_final(recorder: RunRecorder, directory: Path) -> None:
    """One line with the final accuracy (global and/or personalized)."""
    final = recorder.summary()["final"]
    if "personalized-accuracy" in final:
        log(
            INFO,
            "fedx: final personalized test accuracy %.4f ± %.4f over %d clients (round %s); "
            "global %s; outputs in %s",
            final["personalized-accuracy"],
            final["personalized-accuracy-std"],
            len(final.get("clients", {})),
            final.get("round"),
            f"{final['accuracy']:.4f}" if "accuracy" in final else "none (personalized models)",
            directory,
        )
        return
    log(
        INFO,
        "fedx: final global test accuracy %.4f (round %s); outputs in %s",
        final.get("accuracy", float("nan")),
        final.get("round"),
        directory,
    )
