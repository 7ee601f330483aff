"""Models packed for the nodes that read them: the server's side of fedx's packed form.

A model travels packed (:mod:`fedx.arrays`: one ``Array`` per model, so a
message is a handful of Flower objects, and requests, whatever the model's
number of arrays) only to a node that said it reads that form, and only
from a strategy that reads it back:

* :class:`PackingGrid` wraps the ServerApp's Grid and listens to the
  replies of the identity query (:mod:`fedx.strategies.client_identity`)
  that pass through it. A node whose reply has ``reads-packed`` equal to
  :data:`fedx.arrays.PACKED_VERSION` (fedx's ClientApp, through
  :func:`fedx.client.packing.packed_models`) is sent every model packed from
  then on; every other node (anyone else's ClientApp, Flower's quickstarts,
  a node that was never asked) gets the standard ``ArrayRecord`` s the
  strategy built, as without the wrapper.
* Replies pass through unchanged: a node replies packed to what it got
  packed, so the strategy must read both forms. Every fedx strategy does
  (it reads models with :func:`fedx.arrays.to_numpy_dict`, and says so:
  :func:`~fedx.strategies.capabilities.reads_packed_models`); fedx's
  ServerApp wraps the Grid only for those.

fedx's ServerApp asks every node at the start of a run, and a strategy
that asks the nodes it meets later (through the same grid) is heard too; a
user's ServerApp wraps its Grid and asks
(:func:`~fedx.strategies.client_identity.query_client_ids`) likewise.
"""

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MessageType
from flwr.serverapp import Grid

from fedx.arrays import pack_models
from fedx.strategies.client_identity import reads_packed


class PackingGrid:
    """The wrapped Grid, sending models packed to the nodes that read them.

    The messages a strategy hands it keep their identity (the Grid sets
    their ids when it pushes them): only their content is replaced by one
    with the models packed, so nothing the strategy keeps of a message
    changes but the form of its models. Everything but pushing, pulling and
    exchanging messages is the wrapped grid's, and so are those where the
    wrapped grid has none (an in-process test grid has only
    ``send_and_receive``).
    """

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        #: The nodes that said they read the packed form.
        self.packed_nodes: set[int] = set()
        #: Messages holding models sent packed, and sent standard (to the other nodes).
        self.sent_packed = 0
        self.sent_standard = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._grid, name)  # AttributeError where the wrapped grid has none
        if name == "push_messages":
            return self._packing(attribute)
        if name == "pull_messages":
            return self._listening(attribute)
        if name == "send_and_receive":
            return self._packing(self._listening(attribute))
        return attribute

    def _packing(self, send: Callable[..., Any]) -> Callable[..., Any]:
        def sending(messages: Iterable[Message], *args: Any, **kwargs: Any) -> Any:
            messages = list(messages)
            self.pack(messages)
            return send(messages, *args, **kwargs)

        return sending

    def _listening(self, receive: Callable[..., Iterable[Message]]) -> Callable[..., list[Message]]:
        def receiving(*args: Any, **kwargs: Any) -> list[Message]:
            replies = list(receive(*args, **kwargs))
            self.listen(replies)
            return replies

        return receiving

    def pack(self, messages: list[Message]) -> None:
        """Pack the models of the messages to nodes that read the packed form, in place."""
        packed: dict[int, ArrayRecord] = {}  # records several messages share are packed once
        for message in messages:
            if not message.has_content() or not message.content.array_records:
                continue
            if message.metadata.dst_node_id in self.packed_nodes:
                message.content = pack_models(message.content, packed)
                self.sent_packed += 1
            else:
                self.sent_standard += 1

    def listen(self, replies: Iterable[Message]) -> None:
        """Learn from the replies to the identity query which nodes read the packed form."""
        for reply in replies:
            if reply.metadata.message_type != MessageType.QUERY:
                continue
            if reads_packed(reply):
                self.packed_nodes.add(reply.metadata.src_node_id)
            else:
                self.packed_nodes.discard(reply.metadata.src_node_id)
