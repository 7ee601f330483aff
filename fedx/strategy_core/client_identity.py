"""Which client a node is: asked with a Flower ``query`` message.

Flower gives simulated SuperNodes random node ids in every run (and real
SuperNodes new ids when they restart), so the node id cannot identify a
client across runs. fedx's ClientApp answers a ``query`` message with its
``partition-id`` as the ``client-id`` metric; a ClientApp without a query
handler answers with an error, and the node simply stays unidentified.
"""

from collections.abc import Iterable
from logging import WARNING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fedx.arrays import PACKED_VERSION, packs_models
from fedx.messaging import send_and_collect
from fedx.protocol.common import CLIENT_ID, CONFIG, READS_PACKED, SERVER_ROUND, WIRE


def query_client_ids(
    grid: Grid, node_ids: Iterable[int], timeout: float, server_round: int = 0
) -> dict[int, int]:
    """Ask nodes which client they are.

    Returns
    -------
    dict[int, int]
        ``{node_id: client_id}`` for the nodes that answered with a valid id;
        the others are logged and left out.
    """
    query = [
        Message(
            content=RecordDict({CONFIG: ConfigRecord({SERVER_ROUND: server_round})}),
            message_type=MessageType.QUERY,
            dst_node_id=node_id,
        )
        for node_id in node_ids
    ]
    identified: dict[int, int] = {}
    for reply in send_and_collect(grid, query, timeout):
        node_id = reply.metadata.src_node_id
        client_id = reported_client_id(reply)
        if isinstance(client_id, str):
            log(WARNING, "Node %s did not say which client it is: %s", node_id, client_id)
            continue
        identified[node_id] = client_id
    return identified


def reported_client_id(reply: Message) -> int | str:
    """The ``client-id`` a node reported in reply to the query, or why there is none."""
    if reply.has_error():
        return f"the node reported an error: {reply.error.reason}"
    for record in reply.content.metric_records.values():
        value = record.get(CLIENT_ID)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return f"no non-negative integer '{CLIENT_ID}' metric in the reply"


def reads_packed(reply: Message) -> bool:
    """Whether a node's reply says it reads the packed form this server writes.

    fedx's ClientApp (:mod:`fedx.client.packing`) says so in every reply: by
    a packed model in it, in a ``reads-packed`` entry of its
    :data:`~fedx.protocol.common.WIRE` ConfigRecord, or, answering the
    identity query, of its metrics. An error says nothing of the kind.
    """
    if reply.has_error():
        return False
    content = reply.content
    if packs_models(content):
        return True
    records = [*content.metric_records.values()]
    wire = content.config_records.get(WIRE)
    if wire is not None:
        records.append(wire)
    return any(
        type(record.get(READS_PACKED)) is int and record.get(READS_PACKED) == PACKED_VERSION
        for record in records
    )


class ClientOrderedGrid:
    """A Grid that lists its nodes by client id, so sampling repeats across runs.

    Strategies sample nodes by position in ``get_node_ids()``; with random node
    ids that order changes from run to run. This view lists identified nodes
    by client id first, then the others by node id. Everything else is the
    wrapped grid's.
    """

    def __init__(self, grid: Grid, client_ids: dict[int, int]) -> None:
        self._grid = grid
        self.client_ids = client_ids

    def get_node_ids(self) -> list[int]:
        """Connected node ids, ordered by (client id, node id)."""
        unknown = float("inf")
        return sorted(self._grid.get_node_ids(), key=lambda n: (self.client_ids.get(n, unknown), n))

    def __getattr__(self, name: str):
        return getattr(self._grid, name)
