"""Identifying nodes by client id and listing them in that order."""

import logging

import pytest
from flwr.app import Error, Message, MetricRecord, RecordDict

from fedx.strategy_core.client_identity import ClientOrderedGrid, query_client_ids
from tests.support.standin_grid import StandInGrid

pytestmark = pytest.mark.usefixtures("server_task_identity")

# node id -> what its ClientApp answers to a query
ANSWERS = {2**64 - 1: 2, 7: 0, 2**63 + 1: None, 99: 1, 5: "no handler"}


def answer(message: Message) -> Message | None:
    reply = ANSWERS[message.metadata.dst_node_id]
    if reply == "no handler":
        return Message(Error(code=0, reason="no query handler"), reply_to=message)
    if reply is None:
        return None  # never answers
    return Message(RecordDict({"metrics": MetricRecord({"client-id": reply})}), reply_to=message)


def test_query_collects_valid_ids_and_logs_the_rest(caplog):
    grid = StandInGrid(list(ANSWERS), answer)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        identified = query_client_ids(grid, list(ANSWERS), timeout=1.0)
    assert identified == {2**64 - 1: 2, 7: 0, 99: 1}
    assert "Node 5 did not say which client it is" in caplog.text
    assert all(m.metadata.message_type == "query" for m in grid.sent[0])


def test_ordered_grid_lists_identified_nodes_by_client_id_then_the_rest():
    grid = StandInGrid(list(ANSWERS), answer)
    ordered = ClientOrderedGrid(grid, {2**64 - 1: 2, 7: 0, 99: 1})
    assert ordered.get_node_ids() == [7, 99, 2**64 - 1, 5, 2**63 + 1]
    assert ordered.send_and_receive([]) == []  # everything else is the wrapped grid's
