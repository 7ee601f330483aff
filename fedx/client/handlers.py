"""The work of the fedx ClientApp's train and evaluate handlers (:mod:`fedx.client_app`).

:mod:`fedx.client_app` imports this module (and with it torch, the data
and the models) when its first training or evaluation message arrives, or
ahead of it where a process is kept warm for messages: a simulation's Ray
actors when they start, the warm executor's interpreter.
"""

import functools
from collections.abc import Callable

from flwr.app import ArrayRecord, Context, Message, MetricRecord

from fedx.client.task import ClientTask
from fedx.method import resolve
from fedx.protocol.common import (
    ARRAYS,
    CLIENT_ID,
    EVAL_ACCURACY,
    EVAL_LOSS,
    METRICS,
    NUM_EXAMPLES,
    PROXIMAL_MU,
    TRAIN_LOSS,
)
from fedx.protocol.personalized import ARCHITECTURE, FINETUNE_EPOCHS
from fedx.secure.client import is_secure_round, secure_train_reply
from fedx.training import evaluate, train


@functools.cache
def _handler(path: str) -> Callable[[ClientTask], Message]:
    """The function a method's ``client_train`` names (``"module:function"``)."""
    return resolve(path)


def train_model(msg: Message, context: Context) -> Message:
    """Train the received model on this node's data and send it back (or the method's own round)."""
    with ClientTask(msg, context) as task:
        task.seed_torch()
        client_train = task.config.method.client_train
        if client_train is not None:
            return _handler(client_train)(task)
        dataset = task.training_data()
        model = task.model(task.config.model, msg.content.array_records[ARRAYS])
        train_loss = train(
            model,
            task.train_loader(dataset),
            epochs=task.training.local_epochs,
            proximal_mu=float(task.round_config.get(PROXIMAL_MU, 0.0)),
            device=task.device,
            **task.sgd(),
        )
        arrays = ArrayRecord(model.state_dict())
        metrics = MetricRecord({NUM_EXAMPLES: len(dataset), TRAIN_LOSS: train_loss})
        if is_secure_round(msg):
            # The model stays on this node until it has swapped layers with others.
            return secure_train_reply(msg, context, arrays, metrics)
        return task.reply({ARRAYS: arrays, METRICS: metrics})


def evaluate_model(msg: Message, context: Context) -> Message:
    """Evaluate the received model: on this node's own test split when the method is personalized.

    Personalized: the model, fine-tuned first for ``finetune-epochs`` epochs on
    the node's train split, is tested on the node's test split. Otherwise the
    model is tested on this node's IID share of the held-out test split.
    """
    with ClientTask(msg, context) as task:
        if task.config.personalized:
            return _evaluate_personalized(task)
        local_test = task.test_share()
        model = task.model(task.config.model, msg.content.array_records[ARRAYS])
        loss, accuracy = evaluate(model, task.test_loader(local_test), task.device)
        metrics = MetricRecord(
            {NUM_EXAMPLES: len(local_test), EVAL_LOSS: loss, EVAL_ACCURACY: accuracy}
        )
        return task.reply({METRICS: metrics})


def _evaluate_personalized(task: ClientTask) -> Message:
    """Fine-tune the message's one model on this node's train split, test it on its test split."""
    task.seed_torch()
    (record,) = task.message.content.array_records.values()
    architecture = str(task.round_config.get(ARCHITECTURE, task.config.model))
    model = task.model(architecture, record)
    splits = task.local_splits
    epochs = int(task.round_config.get(FINETUNE_EPOCHS, 0))
    if epochs > 0:
        train(
            model, task.train_loader(splits.train), epochs=epochs, device=task.device, **task.sgd()
        )
    loss, accuracy = evaluate(model, task.test_loader(splits.test), task.device)
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: len(splits.test),
            EVAL_LOSS: loss,
            EVAL_ACCURACY: accuracy,
            CLIENT_ID: task.partition_id,
        }
    )
    return task.reply({METRICS: metrics})
