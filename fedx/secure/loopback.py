"""An in-process Grid whose nodes run ClientApp handlers, for tests and benchmarks.

:class:`LoopbackGrid` plays Flower's Grid for a strategy (node ids and a
synchronous ``send_and_receive``) and delivers every message to a handler
with the node's own :class:`~flwr.app.Context`, whose ``state`` persists
across messages as on a real SuperNode. Message contents go through Flower's
protobuf serialization both ways (:mod:`fedx.flower.wire`), so whatever does
not survive the wire does not survive here either. A ``lose`` hook drops
chosen requests or replies, which is how the tests make clients drop out
mid-exchange.

Messages are created with Flower's task identity; outside a ServerApp set
``flwr.supercore.task_identity.TaskIdentity.run_id``, ``node_id`` and
``task_id`` first (the tests' ``server_task_identity`` fixture does).
"""

import copy
import random
from collections.abc import Callable, Iterable
from typing import Literal

from flwr.app import Context, Message, RecordDict

from fedx.flower.wire import over_the_wire
from fedx.secure.client import HANDLERS, make_handlers

Handler = Callable[[Message, Context], Message]
#: What happens to a message: delivered, lost before the client saw it
#: ("request"), or handled by the client but its reply lost ("reply").
Loss = Literal["request", "reply"] | None
LoseHook = Callable[[Message], Loss]


class LoopbackGrid:
    """Just enough of Flower's Grid, with nodes that run handlers in-process.

    Parameters
    ----------
    node_ids : list[int]
        The connected nodes.
    train : Handler
        The ``"train"`` handler of the nodes' ClientApp (the secure
        recombination handlers are added automatically).
    lose : LoseHook, optional
        Called with every request; return ``"request"`` to lose it,
        ``"reply"`` to lose the node's reply, ``None`` to deliver both.
    run_id : int
        The run id every node's Context carries.
    rng : random.Random, optional
        Seeded randomness for every client's choices, so that a test is
        reproducible; by default each client uses the OS's CSPRNG.
    """

    def __init__(
        self,
        node_ids: list[int],
        train: Handler,
        *,
        lose: LoseHook | None = None,
        run_id: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        self.node_ids = list(node_ids)
        secure = HANDLERS if rng is None else make_handlers(lambda: rng)
        self.handlers: dict[str, Handler] = {
            "train": train,
            **{f"train.{action}": handler for action, handler in secure.items()},
        }
        self.lose = lose
        self.contexts = {
            node: Context(
                run_id=run_id, node_id=node, node_config={}, state=RecordDict(), run_config={}
            )
            for node in self.node_ids
        }
        #: Every batch of requests and of replies, in order: what the server saw.
        self.requests: list[list[Message]] = []
        self.replies: list[list[Message]] = []
        #: Replies the ``lose`` hook kept from the server.
        self.lost_replies: list[Message] = []
        #: Serialized content bytes of each exchange: (message type, requests, replies).
        self.wire_bytes: list[tuple[str, int, int]] = []

    def get_node_ids(self) -> Iterable[int]:
        """The connected nodes."""
        return list(self.node_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Deliver every message and return the replies that were not lost."""
        del timeout  # nothing here is slow; a lost reply simply never comes
        messages = list(messages)
        self.requests.append(messages)
        replies = []
        sent_bytes = received_bytes = 0
        for message in messages:
            loss = self.lose(message) if self.lose else None
            if loss == "request":
                continue
            delivered = copy.copy(message)
            delivered.content, size = over_the_wire(message.content)
            sent_bytes += size
            node = message.metadata.dst_node_id
            reply = self.handlers[message.metadata.message_type](delivered, self.contexts[node])
            if loss == "reply":
                self.lost_replies.append(reply)
                continue
            if not reply.has_error():
                reply.content, size = over_the_wire(reply.content)
                received_bytes += size
            replies.append(reply)
        self.replies.append(replies)
        kind = messages[0].metadata.message_type if messages else ""
        self.wire_bytes.append((kind, sent_bytes, received_bytes))
        return replies
