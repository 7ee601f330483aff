"""FedMR with secure recombination against in-process numpy clients.

The clients run fedx's real protocol handlers (fedx.secure.client) behind a
LoopbackGrid, whose message contents go through Flower's serialization; a
hook loses chosen requests or replies to make clients drop out.
"""

import logging
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fedx.ops import Model
from fedx.secure.exchange import ExchangeState
from fedx.secure.loopback import LoopbackGrid
from fedx.secure.wire import RECORD, RETURN_TYPE, SEND_TYPE, UPLOAD_TYPE
from fedx.strategies import FedMR, to_arrayrecord, to_model
from tests.support.secure_standins import (
    NumpyClients,
    assert_same_layers,
    secure_fedmr,
    secure_round,
    uploads_of,
)
from tests.support.standin_grid import NODE_IDS, StandInGrid, run_round

pytestmark = pytest.mark.usefixtures("server_task_identity")

X = NODE_IDS[1]  # the client that drops out in the drop-out tests


def refusals(grid: LoopbackGrid) -> set[int]:
    """Nodes that declined to upload because the exchange left their model unchanged."""
    refused = {r.metadata.src_node_id for r in grid.replies[-1] if r.has_error()}
    assert all(
        "does not upload its own model" in r.error.reason for r in grid.replies[-1] if r.has_error()
    )
    return refused


def holdings(grid: LoopbackGrid) -> dict[int, Model]:
    """What every client holds after the round: its upload, else its committed model."""
    held = {
        m.metadata.src_node_id: to_model(m.content["arrays"])
        for m in grid.lost_replies
        if m.metadata.message_type == UPLOAD_TYPE and not m.has_error()
    }
    for node, context in grid.contexts.items():
        if node not in held and "fedx-secure.model" in context.state:
            held[node] = ExchangeState.load(context.state).model
    held.update(uploads_of(grid))
    return held


def owners(model: Model, trained: dict[int, Model]) -> set[int]:
    return {
        node
        for n, a in model.items()
        if a.dtype.kind == "f"
        for node, t in trained.items()
        if np.array_equal(t[n], a)
    }


def request_type(message: Message) -> str:
    return message.metadata.message_type


# ----------------------------------------------------------------------
# The exchange
# ----------------------------------------------------------------------


def test_clients_upload_recombined_models_and_every_layer_survives_once(initial):
    clients = NumpyClients()
    grid = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(0))
    strategy = secure_fedmr()
    global_arrays, metrics = secure_round(strategy, grid, initial)

    uploads = uploads_of(grid)
    trained = clients.trained
    assert sorted(uploads) == sorted(NODE_IDS) and metrics["trained-slots"] == len(NODE_IDS)
    assert_same_layers(list(uploads.values()), list(trained.values()))
    for node, model in uploads.items():
        assert any(not np.array_equal(model[n], trained[node][n]) for n in model), node
        assert len(owners(model, trained)) >= 2
    # train, then send + return per repetition, then upload: 2 + 2 r_s exchanges.
    assert [request_type(batch[0]) for batch in grid.requests] == [
        "train",
        *[SEND_TYPE, RETURN_TYPE] * 3,
        UPLOAD_TYPE,
    ]
    assert metrics["secure-exchanges"] == 7 and metrics["secure-aborted"] == 0
    assert metrics["secure-layer-bytes"] > 0
    # Exchanging keeps each layer's sum, so the global model is still the
    # trained models' mean, and server-side recombination still follows.
    expected = np.mean([t["fc1.weight"] for t in trained.values()], axis=0)
    np.testing.assert_allclose(to_model(global_arrays)["fc1.weight"], expected, rtol=1e-5)
    assert_same_layers(strategy.pool, list(trained.values()))
    assert any(
        all(not np.array_equal(p["fc1.weight"], u["fc1.weight"]) for u in uploads.values())
        or len(owners(p, trained)) > 1
        for p in strategy.pool
    )


@pytest.mark.parametrize("grouping", ["tensor", "module"])
def test_layers_are_conserved_whatever_the_clients_draw(initial, grouping):
    for seed in range(4):
        clients = NumpyClients()
        grid = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(seed))
        secure_round(secure_fedmr(grouping=grouping, secure_max_layers=6), grid, initial)
        uploads = uploads_of(grid)
        assert len(uploads) == len(NODE_IDS)
        assert_same_layers(list(uploads.values()), list(clients.trained.values()))


def test_the_relay_only_ever_holds_ciphertext(initial):
    clients = NumpyClients()
    grid = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(1))
    secure_round(secure_fedmr(), grid, initial)
    trained_bytes = [
        a.tobytes() for t in clients.trained.values() for a in t.values() if a.nbytes >= 16
    ]

    # Everything the server handled before the uploads: the training replies
    # and every request and reply of the exchange.
    seen = [m for batch in grid.replies[:-1] for m in batch]
    seen += [m for batch in grid.requests[1:] for m in batch]
    assert len(seen) > 20
    payloads = []
    for message in seen:
        assert not message.content.array_records, "no arrays cross the relay before the upload"
        assert list(message.content.config_records) == [RECORD]
        for value in message.content.config_records[RECORD].values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, bytes):
                    payloads.append(item)
    train_replies = grid.replies[0]
    assert all(len(r.content.config_records[RECORD]["public-key"]) == 32 for r in train_replies)
    assert sum(len(p) > 32 for p in payloads) > 20
    for payload in payloads:
        assert not any(layer in payload for layer in trained_bytes)


def test_the_server_side_never_loads_decryption_code():
    script = (
        "import sys, fedx.strategies, fedx.secure.relay;"
        "loaded = [m for m in sys.modules if m.startswith('fedx.secure')];"
        "print(sorted(loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "fedx.secure.relay" in out
    for client_only in ("crypto", "exchange", "client", "codec"):
        assert f"fedx.secure.{client_only}'" not in out


# ----------------------------------------------------------------------
# Drop-outs
# ----------------------------------------------------------------------


def _protocol_field(message: Message, key: str):
    return message.content.config_records[RECORD].get(key)


def lose_at(stage: str, repeat: int, what: str, attempt: int = 0):
    """A lose hook: node X's request or reply at one stage of one repetition."""

    def hook(message: Message):
        if message.metadata.dst_node_id != X or request_type(message) != stage:
            return None
        if stage != UPLOAD_TYPE and _protocol_field(message, "repeat") != repeat:
            return None
        if stage == RETURN_TYPE and _protocol_field(message, "attempt") != attempt:
            return None
        return what

    return hook


DROPS = {
    "before sealing": lose_at(SEND_TYPE, 1, "request"),
    "after sealing": lose_at(SEND_TYPE, 1, "reply"),
    "before answering": lose_at(RETURN_TYPE, 1, "request"),
    "after answering": lose_at(RETURN_TYPE, 1, "reply"),
    "at the commit of repetition 1": lose_at(SEND_TYPE, 2, "reply"),
    "in repetition 2": lose_at(RETURN_TYPE, 2, "reply"),
    "in the last repetition": lose_at(RETURN_TYPE, 3, "request"),
    "at the upload": lose_at(UPLOAD_TYPE, 0, "reply"),
}


@pytest.mark.parametrize("when", list(DROPS))
def test_a_drop_out_loses_and_duplicates_no_layer(initial, caplog, when):
    clients = NumpyClients()
    grid = LoopbackGrid(NODE_IDS, clients.train, lose=DROPS[when], rng=random.Random(2))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = secure_round(secure_fedmr(), grid, initial)

    uploads = uploads_of(grid)
    assert X not in uploads
    # Everyone else uploads, but for a client the exchange happened to leave
    # unchanged (it declines rather than hand over its own trained model).
    assert sorted(uploads) == sorted(n for n in NODE_IDS if n != X and n not in refusals(grid))
    assert metrics["trained-slots"] == len(NODE_IDS) - 1 - len(refusals(grid))
    # Counting what the dropped client holds (its last committed model), every
    # trained layer is in exactly one place.
    held = holdings(grid)
    assert sorted(held) == sorted(NODE_IDS)
    assert_same_layers(list(held.values()), list(clients.trained.values()))
    assert f"node {X} dropped out of secure recombination" in caplog.text
    if when not in ("at the upload", "at the commit of repetition 1"):
        # Its exchanges of that repetition were aborted and logged.
        assert (
            f"node {X} dropped out; its" in caplog.text and "keep their own layers" in caplog.text
        )
        assert metrics["secure-aborted"] > 0
    if when == "after answering":
        # The clients holding X's layers answered again without them.
        redo = [
            m
            for batch in grid.requests
            for m in batch
            if request_type(m) == RETURN_TYPE and _protocol_field(m, "attempt") == 1
        ]
        assert redo and all(m.metadata.dst_node_id != X for m in redo)


def test_drop_outs_during_a_redo_cascade_safely(initial, caplog):
    lost = []

    def hook(message: Message):
        first = lose_at(RETURN_TYPE, 1, "reply")(message)
        if first:
            return first
        if (
            request_type(message) == RETURN_TYPE
            and _protocol_field(message, "attempt") == 1
            and not lost
        ):
            lost.append(
                message.metadata.dst_node_id
            )  # a receiver of X's layers drops during its redo
            return "reply"
        return None

    clients = NumpyClients()
    grid = LoopbackGrid(NODE_IDS, clients.train, lose=hook, rng=random.Random(3))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = secure_round(secure_fedmr(), grid, initial)
    assert len(lost) == 1
    assert metrics["trained-slots"] == len(NODE_IDS) - 2 - len(refusals(grid))
    assert (
        f"node {lost[0]} dropped out of secure recombination at the return of repetition 1 (attempt 1)"
        in caplog.text
    )
    held = holdings(grid)
    assert_same_layers(list(held.values()), list(clients.trained.values()))


def test_a_lost_upload_request_leaves_no_duplicate_among_uploads(initial):
    clients = NumpyClients()
    grid = LoopbackGrid(
        NODE_IDS, clients.train, lose=lose_at(UPLOAD_TYPE, 0, "request"), rng=random.Random(4)
    )
    secure_round(secure_fedmr(), grid, initial)
    uploads = uploads_of(grid)
    assert len(uploads) == len(NODE_IDS) - 1
    # X never committed its last repetition; what it held is lost with it,
    # but the uploads hold every layer at most once.
    trained = list(clients.trained.values())
    for name in (
        n for n, a in initial.items() if a.dtype.kind == "f"
    ):  # int counters are all equal
        counts = Counter(m[name].tobytes() for m in uploads.values())
        assert max(counts.values()) == 1
        assert set(counts) <= {t[name].tobytes() for t in trained}


# ----------------------------------------------------------------------
# Clients that cannot take part
# ----------------------------------------------------------------------


def test_training_errors_and_clients_without_the_protocol_are_reported(initial, caplog):
    clients = NumpyClients()
    clients.failing = {NODE_IDS[0]}
    clients.plain = {NODE_IDS[2]}
    grid = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(5))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, metrics = secure_round(secure_fedmr(), grid, initial)
    assert f"dropped the reply of node {NODE_IDS[0]} (slot" in caplog.text
    assert "the node reported an error: out of memory" in caplog.text
    assert f"node {NODE_IDS[2]} replied to training without a public key" in caplog.text
    assert metrics["trained-slots"] == len(NODE_IDS) - 2
    assert all(
        m.metadata.dst_node_id not in (NODE_IDS[0], NODE_IDS[2])
        for batch in grid.requests[1:]
        for m in batch
    )


def test_a_lone_client_uploads_nothing(initial, caplog):
    clients = NumpyClients()
    clients.failing = set(NODE_IDS[1:])
    grid = LoopbackGrid(NODE_IDS, clients.train)
    strategy = secure_fedmr()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, metrics = secure_round(strategy, grid, initial)
    assert arrays is None and metrics is None
    assert "needs at least two clients, 1 trained" in caplog.text
    assert len(grid.requests) == 1  # no exchange, no upload
    assert all(m is strategy.pool[0] for m in strategy.pool)


def test_a_client_whose_exchanges_all_failed_does_not_upload_its_own_model(initial, caplog):
    nodes = NODE_IDS[:3]
    others = set(nodes) - {X}

    def hook(message: Message):
        if request_type(message) == SEND_TYPE and message.metadata.dst_node_id in others:
            return "reply"
        return None

    clients = NumpyClients()
    grid = LoopbackGrid(nodes, clients.train, lose=hook, rng=random.Random(6))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = secure_round(secure_fedmr(secure_repeats=1), grid, initial)
    assert arrays is None
    assert f"dropped the reply of node {X} (slot" in caplog.text
    assert (
        "the node reported an error: secure recombination: "
        "no layer of this node's trained model was exchanged"
    ) in caplog.text
    assert not uploads_of(grid)


def test_a_message_for_another_round_gets_an_error_reply(initial):
    clients = NumpyClients()
    grid = LoopbackGrid(NODE_IDS[:2], clients.train, rng=random.Random(7))
    strategy = secure_fedmr()
    grid.send_and_receive(
        list(strategy.configure_train(1, to_arrayrecord(initial), ConfigRecord(), grid))
    )
    stale = Message(
        RecordDict(
            {RECORD: ConfigRecord({"round": 2, "repeat": 1, "peer-ids": [], "peer-keys": []})}
        ),
        dst_node_id=NODE_IDS[0],
        message_type=SEND_TYPE,
    )
    (reply,) = grid.send_and_receive([stale])
    assert reply.has_error()
    assert "message for round 2, but this node trained for round 1" in reply.error.reason


# ----------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------


def test_first_stage_averages_plainly_under_secure_recombination(initial):
    clients = NumpyClients(examples={node: 5 + 40 * i for i, node in enumerate(NODE_IDS)})
    grid = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(8))
    strategy = secure_fedmr(first_stage_rounds=1)
    secure_round(strategy, grid, initial)
    expected = np.mean([t["fc1.weight"] for t in clients.trained.values()], axis=0)
    for model in strategy.pool:
        np.testing.assert_allclose(model["fc1.weight"], expected, rtol=1e-5)


def test_without_secure_recombination_fedmr_is_unchanged(initial):
    grid = StandInGrid(NODE_IDS)
    messages, _, (_, metrics) = run_round(FedMR(seed=0, min_available_nodes=1), grid, 1, initial)
    assert len(grid.sent) == 1
    assert not any(key.startswith("secure") for key in messages[0].content["config"])
    assert not any(key.startswith("secure") for key in metrics)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"secure_repeats": 0}, r"^secure_repeats must be an integer >= 1, got 0$"),
        ({"secure_min_layers": 0}, r"^secure_min_layers must be an integer >= 1, got 0$"),
        (
            {"secure_min_layers": 3, "secure_max_layers": 2},
            r"^secure_max_layers must be an integer >= 3, got 2$",
        ),
        ({"grouping": "layer"}, r"^grouping must be one of tensor, module, got 'layer'$"),
    ],
)
def test_invalid_secure_options_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedMR(secure_recombination=True, **kwargs)
