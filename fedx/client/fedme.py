"""FedMe's client side: the round (deep mutual learning of two models, then the choice by
validation loss) and, before a client's first round, the choice of its architecture."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from torch import nn

from fedx.client.task import ClientTask
from fedx.data import dataset_info
from fedx.models import build_seeded_model, client_model_seed
from fedx.mutual import prefers_exchanged, train_mutual
from fedx.protocol import fedme as protocol
from fedx.protocol.common import CLIENT_ID, METRICS, NUM_EXAMPLES
from fedx.training import Batches, evaluate
from fedx.training import train as train_model


def train(task: ClientTask) -> Message:
    """Answer a FedMe training message: a round, or the choice of an architecture before one."""
    if protocol.CANDIDATE_ARCHITECTURES in task.round_config:
        return choose_architecture(task)
    return train_round(task)


def train_round(task: ClientTask) -> Message:
    """Train the personalized and the exchanged model together; keep the better on validation."""
    config, records = task.round_config, task.message.content.array_records
    splits = task.local_splits
    personalized = task.model(
        str(config[protocol.PERSONALIZED_ARCHITECTURE]), records[protocol.PERSONALIZED]
    )
    exchanged = task.model(
        str(config[protocol.EXCHANGED_ARCHITECTURE]), records[protocol.EXCHANGED]
    )
    train_losses = train_mutual(
        personalized,
        exchanged,
        task.train_loader(splits.train),
        epochs=task.training.local_epochs,
        mutual_learning=bool(config.get(protocol.MUTUAL_LEARNING, True)),
        device=task.device,
        **task.sgd(),
    )
    validation = task.test_loader(splits.validation)
    validation_losses = (
        evaluate(personalized, validation, task.device)[0],
        evaluate(exchanged, validation, task.device)[0],
    )
    chose_exchanged = bool(config.get(protocol.MODEL_TUNING, True)) and prefers_exchanged(
        *validation_losses
    )
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: len(splits.train),
            protocol.TRAIN_LOSS_PERSONALIZED: train_losses[0],
            protocol.TRAIN_LOSS_EXCHANGED: train_losses[1],
            protocol.VALIDATION_LOSS_PERSONALIZED: validation_losses[0],
            protocol.VALIDATION_LOSS_EXCHANGED: validation_losses[1],
            protocol.CHOSE_EXCHANGED: int(chose_exchanged),
        }
    )
    return task.reply(
        {
            protocol.PERSONALIZED: ArrayRecord(personalized.state_dict()),
            protocol.EXCHANGED: ArrayRecord(exchanged.state_dict()),
            METRICS: metrics,
        }
    )


@dataclass(frozen=True)
class CandidateResult:
    """How one candidate architecture did on the client's validation split."""

    architecture: str
    validation_accuracy: float
    validation_loss: float


# pylint: disable=too-many-arguments
def try_architectures(
    candidates: Sequence[str],
    build: Callable[[str], nn.Module],
    train_loader: Batches,
    validation_loader: Batches,
    *,
    epochs: int,
    seed: int,
    device: torch.device | None = None,
    **sgd: float,
) -> list[CandidateResult]:
    """Train a model of every candidate on the train split; test it on the validation split.

    This is the paper's "Local Data Only" training of each architecture
    (Matsuda et al., Sec. 5.1.3), for ``epochs`` epochs. Every candidate's
    batches come in the same order (``torch.manual_seed(seed)`` before each),
    so the candidates differ in architecture only.

    Parameters
    ----------
    candidates : Sequence[str]
        Architecture names, in the order the results come back.
    build : callable
        ``build(architecture)``: the untrained model the candidate starts from.
    train_loader, validation_loader : iterable of (torch.Tensor, torch.Tensor)
        The client's train and validation splits.
    epochs : int
        Local epochs per candidate.
    seed : int
        Seeds the shuffling of each candidate's training.
    device : torch.device, optional
        Where to train.
    **sgd : float
        ``learning_rate``, ``momentum``, ``weight_decay`` of
        :func:`fedx.training.train`.
    """
    results = []
    for architecture in candidates:
        model = build(architecture)
        torch.manual_seed(seed)
        train_model(model, train_loader, epochs=epochs, device=device, **sgd)
        loss, accuracy = evaluate(model, validation_loader, device)
        results.append(CandidateResult(architecture, accuracy, loss))
    return results


def best_architecture(results: Sequence[CandidateResult]) -> str:
    """The candidate with the best validation accuracy.

    Small validation splits make ties common: among equally accurate
    candidates the lower validation loss wins (a loss that is not finite
    counts as infinite), then the earlier candidate.
    """
    if not results:
        raise ValueError("best_architecture() needs at least one candidate")

    def rank(index: int) -> tuple[float, float, int]:
        result = results[index]
        loss = result.validation_loss if math.isfinite(result.validation_loss) else math.inf
        return (-result.validation_accuracy, loss, index)

    return results[min(range(len(results)), key=rank)].architecture


def choose_architecture(task: ClientTask) -> Message:
    """Before the first round: try every candidate architecture locally and report the best."""
    config = task.round_config
    candidates = [str(name) for name in config[protocol.CANDIDATE_ARCHITECTURES]]
    splits = task.local_splits
    info = dataset_info(task.config.dataset)
    # Each candidate starts from the first model the server would give this
    # client with that architecture.
    model_seed = client_model_seed(task.config.seed, int(config.get(CLIENT_ID, task.partition_id)))
    results = try_architectures(
        candidates,
        lambda name: build_seeded_model(name, info.input_shape, info.num_classes, model_seed),
        task.train_loader(splits.train),
        task.test_loader(splits.validation),
        epochs=int(config[protocol.CHOICE_EPOCHS]),
        seed=task.torch_seed,
        device=task.device,
        **task.sgd(),
    )
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: len(splits.train),
            protocol.VALIDATION_ACCURACY_CANDIDATES: [r.validation_accuracy for r in results],
            protocol.VALIDATION_LOSS_CANDIDATES: [r.validation_loss for r in results],
        }
    )
    choice = ConfigRecord({protocol.CHOSEN_ARCHITECTURE: best_architecture(results)})
    return task.reply({protocol.CHOICE: choice, METRICS: metrics})
