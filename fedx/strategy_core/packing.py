"""Models packed for the nodes that read them: the server's side of fedx's packed form.

A model travels packed (:mod:`fedx.arrays`: one ``Array`` per model, so a
message is a handful of Flower objects, and requests, whatever the model's
number of arrays) only to a node that said it reads that form, and only
from a strategy that reads it back:

* :class:`PackingGrid` wraps the ServerApp's Grid and listens to every
  reply that passes through it. A node whose latest reply says it reads
  :data:`fedx.arrays.PACKED_VERSION` (fedx's ClientApp, through
  :func:`fedx.client.packing.packed_models`, says so in every reply:
  :func:`fedx.strategy_core.client_identity.reads_packed`) is sent every model
  packed; every other node (anyone else's ClientApp, Flower's quickstarts,
  a node that was never asked or never replied) gets the standard
  ``ArrayRecord`` s the strategy built, as without the wrapper. A reply
  without that word, and an error in reply to a packed message (a ClientApp
  that cannot read it; the SuperLink's word that the node is lost), turn the
  node back to standard records. A registered SuperNode keeps its node id
  when it restarts: restarted with a ClientApp that does not read the packed
  form, it fails the packed message it was sent, if any, and is sent
  standard records from then on.
* Replies pass through unchanged: a node replies packed to what it got
  packed, so the strategy must read both forms. Every fedx strategy does
  (it reads models with :func:`fedx.arrays.to_numpy_dict`, and says so:
  :func:`~fedx.strategy_core.capabilities.reads_packed_models`); fedx's
  ServerApp wraps the Grid only for those.

fedx's ServerApp asks every node at the start of a run, and a strategy
that asks the nodes it meets later (through the same grid) is heard too; a
user's ServerApp wraps its Grid and asks
(:func:`~fedx.strategy_core.client_identity.query_client_ids`) likewise.
"""

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, Message
from flwr.serverapp import Grid

from fedx.arrays import pack_models, packs_models
from fedx.strategy_core.client_identity import reads_packed


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
        #: The nodes whose latest reply said they read the packed form.
        self.packed_nodes: set[int] = set()
        #: Messages holding models sent packed, and sent standard (to the other nodes).
        self.sent_packed = 0
        self.sent_standard = 0
        # The last message sent to each node, and whether its models went packed.
        self._last_sent: dict[int, tuple[Message, bool]] = {}

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
            node = message.metadata.dst_node_id
            if not message.has_content() or not message.content.array_records:
                self._last_sent[node] = (message, False)
                continue
            if node in self.packed_nodes:
                message.content = pack_models(message.content, packed)
                self.sent_packed += 1
            else:
                self.sent_standard += 1
            self._last_sent[node] = (message, packs_models(message.content))

    def listen(self, replies: Iterable[Message]) -> None:
        """Learn from each reply whether its node reads the packed form (see the module's notes)."""
        replies = list(replies)
        if not replies:
            return
        # The Grid gives each message its id as it pushes it.
        answered = {
            message.metadata.message_id: (node, packed)
            for node, (message, packed) in self._last_sent.items()
            if message.metadata.message_id
        }
        for reply in replies:
            # A reply the SuperLink writes for a lost node comes from the SuperLink; a
            # grid that gives messages no ids (an in-process one): the node's last message.
            source = reply.metadata.src_node_id
            node, packed = answered.get(
                reply.metadata.reply_to_message_id,
                (source, source in self._last_sent and self._last_sent[source][1]),
            )
            if reply.has_error():
                if packed:
                    self.packed_nodes.discard(node)
            elif reads_packed(reply):
                self.packed_nodes.add(node)
            else:
                self.packed_nodes.discard(node)
