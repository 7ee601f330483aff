"""What a finished run saves besides its metrics: the global model or the clients' models."""

from logging import INFO
from pathlib import Path

import torch
from flwr.common import log
from flwr.serverapp.strategy import Result

from fedx.outputs import MODEL_FILE, RunRecorder
from fedx.strategies.capabilities import KeepsPersonalizedModels

#: What a run whose strategy keeps one model per client saves instead of one
#: global model: every client's architecture and state dict, by client id.
PERSONALIZED_MODELS_FILE = "personalized-models.pt"


def save_models(
    strategy: object, model: torch.nn.Module | None, result: Result, directory: Path
) -> Path:
    """Save the global model (``model.pt``), or the clients' models; return the file."""
    if isinstance(strategy, KeepsPersonalizedModels):
        personalized = {
            client_id: {
                "architecture": architecture,
                "state_dict": {k: torch.from_numpy(v.copy()) for k, v in weights.items()},
            }
            for client_id, (architecture, weights) in strategy.personalized_models().items()
        }
        path = directory / PERSONALIZED_MODELS_FILE
        torch.save(personalized, path)
        return path
    assert model is not None, "a run with a global model has a model to save it in"
    if len(result.arrays) > 0:
        model.load_state_dict(result.arrays.to_torch_state_dict())
    path = directory / MODEL_FILE
    torch.save(model.state_dict(), path)
    return path


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
