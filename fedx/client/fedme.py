"""FedMe's client round: deep mutual learning of two models, then the choice by validation loss."""

from flwr.app import ArrayRecord, Message, MetricRecord

from fedx.client.task import ClientTask
from fedx.mutual import prefers_exchanged, train_mutual
from fedx.protocol.common import METRICS, NUM_EXAMPLES
from fedx.protocol.fedme import (
    CHOSE_EXCHANGED,
    EXCHANGED,
    EXCHANGED_ARCHITECTURE,
    MODEL_TUNING,
    MUTUAL_LEARNING,
    PERSONALIZED,
    PERSONALIZED_ARCHITECTURE,
    TRAIN_LOSS_EXCHANGED,
    TRAIN_LOSS_PERSONALIZED,
    VALIDATION_LOSS_EXCHANGED,
    VALIDATION_LOSS_PERSONALIZED,
)
from fedx.training import evaluate


def train(task: ClientTask) -> Message:
    """Train the personalized and the exchanged model together; keep the better on validation."""
    config, records = task.round_config, task.message.content.array_records
    splits = task.local_splits
    personalized = task.model(str(config[PERSONALIZED_ARCHITECTURE]), records[PERSONALIZED])
    exchanged = task.model(str(config[EXCHANGED_ARCHITECTURE]), records[EXCHANGED])
    train_losses = train_mutual(
        personalized,
        exchanged,
        task.train_loader(splits.train),
        epochs=task.training.local_epochs,
        mutual_learning=bool(config.get(MUTUAL_LEARNING, True)),
        device=task.device,
        **task.sgd(),
    )
    validation = task.test_loader(splits.validation)
    validation_losses = (
        evaluate(personalized, validation, task.device)[0],
        evaluate(exchanged, validation, task.device)[0],
    )
    chose_exchanged = bool(config.get(MODEL_TUNING, True)) and prefers_exchanged(*validation_losses)
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: len(splits.train),
            TRAIN_LOSS_PERSONALIZED: train_losses[0],
            TRAIN_LOSS_EXCHANGED: train_losses[1],
            VALIDATION_LOSS_PERSONALIZED: validation_losses[0],
            VALIDATION_LOSS_EXCHANGED: validation_losses[1],
            CHOSE_EXCHANGED: int(chose_exchanged),
        }
    )
    return task.reply(
        {
            PERSONALIZED: ArrayRecord(personalized.state_dict()),
            EXCHANGED: ArrayRecord(exchanged.state_dict()),
            METRICS: metrics,
        }
    )
