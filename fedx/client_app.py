"""fedx ClientApp: train or evaluate whatever model arrives, on this node's data.

It is stateless: the model arrives in the message, the training
hyperparameters in the message's ConfigRecord (falling back to the run config
when a ServerApp does not send them), and the dataset, model and method come
from the run config, read once per message into a
:class:`~fedx.client.task.ClientTask`. A node finds its partition from
``partition-id``/``num-partitions`` in its node config (set by the simulation
engine, or by ``flower-supernode --node-config`` in a deployment).

A training message holds one model (:mod:`fedx.protocol.common`), unless the
method answers its training messages itself (its declaration's
``client_train``, with two models per message). Personalized methods use the personalized
data layout: the node's share is split into its own train, validation and
test data, and evaluation fine-tunes and tests the model on them
(:mod:`fedx.protocol.personalized`). A ``query`` message asks the node which
client it is. The one exception to statelessness is secure recombination:
within a round, the trained model waits in the node's ``context.state``
while the clients swap layers (:mod:`fedx.secure.client`). A process that
answers many messages (a simulation worker) reuses its model skeletons and
its loaded data, which carry nothing from one message to the next
(:mod:`fedx.client.skeletons`).
"""

import functools
import importlib
import sys
from collections.abc import Callable

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedx.client.task import ClientTask, node_partition
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
from fedx.secure.client import is_secure_round, register_secure_handlers, secure_train_reply
from fedx.training import evaluate, train

# Inside Flower's simulation engine, ClientApps run on fedx's Ray backend: its
# actor pool follows the nodes of a Ray cluster (fedx/ray_backend.py).
if "flwr.server.superlink.fleet.vce.vce_api" in sys.modules:
    from fedx.ray_backend import install as install_ray_backend

    install_ray_backend()

app = ClientApp()
# Secure recombination: the exchange's send, return and upload steps.
register_secure_handlers(app)


@functools.cache
def _handler(path: str) -> Callable[[ClientTask], Message]:
    """The function a method's ``client_train`` names (``"module:function"``)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Tell the server which client this node is: its ``partition-id``."""
    partition_id, _ = node_partition(context)
    return Message(
        content=RecordDict({METRICS: MetricRecord({CLIENT_ID: partition_id})}), reply_to=msg
    )


@app.train()
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


@app.evaluate()
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
