"""The ClientApp's side of fedx's packed model form (:mod:`fedx.arrays`): one Flower mod.

``ClientApp(mods=[packed_models])`` makes a ClientApp speak the packed form,
as fedx's does:

* its reply to a ``query`` says that it reads it (the ``reads-packed``
  metric, :data:`fedx.arrays.PACKED_VERSION`), and so does every other
  reply: one with a packed model by being packed, the others in a
  ConfigRecord of their own (:data:`fedx.protocol.common.WIRE`). The
  server follows each node's latest reply
  (:class:`fedx.strategy_core.packing.PackingGrid`), so a node that restarts
  with a ClientApp that speaks another form is sent what it reads;
* a message whose models came packed reaches the handlers with those models
  as standard ``ArrayRecord`` s, so every handler, a method's own included,
  reads them as it reads any model;
* the reply to such a message goes back with its models packed. A reply to
  a message that came standard stays standard: the server may be one that
  reads nothing else.

A packed model that cannot be read fails the message (Flower then replies
with an error, which the server logs and drops). Flower only, with numpy
through :mod:`fedx.arrays`: no torch.
"""

from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord

from fedx.arrays import PACKED_VERSION, pack_models, packs_models, unpack_models
from fedx.protocol.common import METRICS, READS_PACKED, WIRE


def packed_models(
    message: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """Read packed models, reply packed to them, and say so to a query (see the module's notes)."""
    if message.metadata.message_type == MessageType.QUERY:
        reply = call_next(message, context)
        if reply.has_content():
            _say_it_reads_packed(reply)
        return reply
    packed = message.has_content() and packs_models(message.content)
    if packed:
        message.content = unpack_models(message.content)
    reply = call_next(message, context)
    if reply.has_content():
        if packed:
            reply.content = pack_models(reply.content)
        if not packs_models(reply.content):  # a packed model says it by itself
            reply.content[WIRE] = ConfigRecord({READS_PACKED: PACKED_VERSION})
    return reply


def _say_it_reads_packed(reply: Message) -> None:
    """Add ``reads-packed`` to the reply's ``metrics`` record (a new one where it has none)."""
    metrics = reply.content.metric_records.get(METRICS)
    if metrics is not None:
        metrics[READS_PACKED] = PACKED_VERSION
    elif METRICS not in reply.content:
        reply.content[METRICS] = MetricRecord({READS_PACKED: PACKED_VERSION})
