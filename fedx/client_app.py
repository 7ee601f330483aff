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
client it is; its answer also says that the node reads fedx's packed model
form, and models that come packed reach the handlers as standard
``ArrayRecord`` s and go back packed (:mod:`fedx.client.packing`). The one
exception to statelessness is secure recombination: within a round, the
trained model waits in the node's ``context.state`` while the clients swap
layers (:mod:`fedx.secure.client`). A process that
answers many messages (a simulation worker) reuses its model skeletons and
its loaded data, which carry nothing from one message to the next
(:mod:`fedx.client.skeletons`).

This module itself imports neither torch nor the data and model code: the
train and evaluate handlers' work is in :mod:`fedx.client.handlers`, imported
with the first message that needs it (a ``query`` does not). Flower's
simulation loads this module and the ServerApp's under one import lock
(``flwr/supercore/object_ref.py``) before its engine starts Ray, so every
second spent importing here (or in :mod:`fedx.server_app`) would hold back
Ray's start; the engine never runs a handler. Processes kept warm for
messages import the handlers' module ahead: the simulation's Ray actors when
they start (:func:`fedx.simulation.install`), the warm executor's
interpreter (:mod:`fedx.deploy.superexec`).
"""

import importlib
from types import ModuleType

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedx import simulation
from fedx.client.node import node_partition
from fedx.client.packing import packed_models
from fedx.protocol.common import CLIENT_ID, METRICS
from fedx.secure.client import register_secure_handlers

#: The train and evaluate handlers' work (torch, the data, the models).
HANDLERS_MODULE = "fedx.client.handlers"
#: What answers a client group's training messages in a simulation actor (``client-group-size``).
GROUP_HANDLER = "fedx.client.groups:train_messages"

# Inside Flower's simulation engine, ClientApps run on fedx's Ray backend: its
# actor pool follows the nodes of a Ray cluster (fedx/simulation/). Its
# actors import the handlers' module when they start, not in round 1.
if simulation.in_simulation_engine():
    simulation.install(actor_preload=(HANDLERS_MODULE,), group_handler=GROUP_HANDLER)

# Models may come packed, one array per model (fedx.client.packing); the
# handlers read them as standard ArrayRecords.
app = ClientApp(mods=[packed_models])
# Secure recombination: the exchange's send, return and upload steps.
register_secure_handlers(app)


def _handlers() -> ModuleType:
    """:data:`HANDLERS_MODULE`, imported on the first call (see the module's docstring)."""
    return importlib.import_module(HANDLERS_MODULE)


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
    return _handlers().train_model(msg, context)


@app.evaluate()
def evaluate_model(msg: Message, context: Context) -> Message:
    """Evaluate the received model: on this node's own test split when the method is personalized."""
    return _handlers().evaluate_model(msg, context)
