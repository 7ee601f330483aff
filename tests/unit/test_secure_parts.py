"""The pieces of secure recombination: layer format, encryption, random choices, state."""

import random
from collections import Counter

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from flwr.app import MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from fedx.ops import layer_groups
from fedx.secure import crypto
from fedx.secure.codec import decode_layer, encode_layer
from fedx.secure.exchange import (
    OWN,
    ExchangeState,
    ProtocolError,
    choose_sends,
    plan_returns,
    rebuild,
    run_private_key,
)
from fedx.secure.wire import Envelope

# ----------------------------------------------------------------------
# Layer format
# ----------------------------------------------------------------------


def test_layer_round_trips_with_names_shapes_dtypes_and_0d_arrays(models):
    model = models[0]
    bn = {n: a for n, a in model.items() if n.startswith("bn1.")}
    index, decoded = decode_layer(encode_layer(4, bn))
    assert index == 4
    assert list(decoded) == list(bn)
    for name, array in bn.items():
        assert decoded[name].shape == array.shape and decoded[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded[name], array)
    assert decoded["bn1.num_batches_tracked"].shape == ()
    # Decoded arrays are fresh and writable, not views of the message bytes.
    decoded["bn1.weight"][0] = 123.0
    assert bn["bn1.weight"][0] != 123.0


@pytest.mark.parametrize(
    "mangle, reason",
    [
        (lambda data: data[:-1], "ends early"),
        (lambda data: data + b"\0", "trailing"),
        (lambda data: data[:2], "shorter"),
        (lambda data: data.replace(b"<f4", b"|O8", 1), "not numeric"),
        (lambda data: data[:4] + b"[" + data[5:], "header"),
    ],
)
def test_malformed_layers_are_rejected(models, mangle, reason):
    data = encode_layer(0, {"fc1.weight": models[0]["fc1.weight"]})
    with pytest.raises(ValueError, match=reason):
        decode_layer(mangle(data))


# ----------------------------------------------------------------------
# Encryption
# ----------------------------------------------------------------------

ROUTE = {
    "server_round": 3,
    "repeat": 2,
    "stage": "send",
    "attempt": 0,
    "sender": 2**64 - 1,
    "receiver": 12,
    "layer": 5,
}


def test_both_ends_derive_the_same_key_and_others_cannot_open():
    alice, bob, eve = (crypto.new_private_key() for _ in range(3))
    key = crypto.pair_key(alice, crypto.public_key(bob))
    assert key == crypto.pair_key(bob, crypto.public_key(alice))
    assert len(key) == 32
    data = crypto.associated_data(**ROUTE)
    payload = crypto.seal(key, b"layer bytes", data)
    assert len(payload) == len(b"layer bytes") + crypto.NONCE_BYTES + crypto.TAG_BYTES
    assert crypto.open_sealed(key, payload, data) == b"layer bytes"
    # Eve, a third client, derives a different key with either of them.
    for other in (alice, bob):
        with pytest.raises(InvalidTag):
            crypto.open_sealed(crypto.pair_key(eve, crypto.public_key(other)), payload, data)


@pytest.mark.parametrize("field", sorted(ROUTE))
def test_a_ciphertext_only_opens_where_it_was_sealed_for(field):
    key = crypto.pair_key(crypto.new_private_key(), crypto.public_key(crypto.new_private_key()))
    payload = crypto.seal(key, b"x" * 64, crypto.associated_data(**ROUTE))
    moved = dict(ROUTE, **{field: "return" if field == "stage" else ROUTE[field] + 1})
    with pytest.raises(InvalidTag):
        crypto.open_sealed(key, payload, crypto.associated_data(**moved))


def test_tampered_ciphertext_and_invalid_public_keys_fail():
    key = crypto.pair_key(crypto.new_private_key(), crypto.public_key(crypto.new_private_key()))
    data = crypto.associated_data(**ROUTE)
    payload = bytearray(crypto.seal(key, b"x" * 64, data))
    payload[20] ^= 1
    with pytest.raises(InvalidTag):
        crypto.open_sealed(key, bytes(payload), data)
    with pytest.raises(ValueError):
        crypto.open_sealed(key, b"short", data)
    # The all-zero point is of low order: key agreement with it must fail.
    with pytest.raises(ValueError):
        crypto.pair_key(crypto.new_private_key(), bytes(32))


def test_a_private_key_per_run_kept_across_messages():
    state = RecordDict()
    first = run_private_key(state, run_id=7)
    assert run_private_key(state, run_id=7) == first
    assert run_private_key(state, run_id=8) != first


# ----------------------------------------------------------------------
# The client's random choices
# ----------------------------------------------------------------------


def test_choose_sends_picks_n_distinct_layers_in_bounds_for_peers():
    rng = random.Random(0)
    peers = [2**64 - 1, 5, 12]
    counts = Counter()
    for _ in range(300):
        sends = choose_sends(11, peers, 2, 4, rng)
        counts[len(sends)] += 1
        assert set(sends.values()) <= set(peers)
        assert all(0 <= layer < 11 for layer in sends)
    assert set(counts) == {2, 3, 4}  # n is drawn from [n_l, n_u], both ends included
    assert len(choose_sends(3, peers, 2, 9, rng)) == 3  # capped at len(w)
    assert choose_sends(11, [], 1, 4, rng) == {}  # nobody to send to


def test_returns_are_distinct_pooled_layers_of_the_same_index():
    rng = random.Random(1)
    for _ in range(500):
        num_layers = 4
        sent = rng.sample(range(num_layers), rng.randint(0, 2))
        received = [rng.randrange(num_layers) for _ in range(rng.randint(0, 6))]
        sources = plan_returns(num_layers, sent, received, rng)
        assert len(sources) == len(received)
        for k, source in enumerate(sources):
            if source == OWN:  # the own layer only where it was kept
                assert received[k] not in sent
            else:
                assert received[source] == received[k]
        # Every pooled layer goes back at most once.
        assert len({(received[k], s) for k, s in enumerate(sources)}) == len(sources)
        # An index the client sent away is emptied: all its received layers go back.
        for layer in sent:
            items = {k for k, index in enumerate(received) if index == layer}
            assert {sources[k] for k in items} == items


def test_a_sender_gets_its_own_layer_back_as_often_as_the_other_one():
    # Pool of two (the receiver's own layer and the sender's): a coin flip,
    # as in Algorithm 2, so the relay cannot tell where each layer went.
    rng = random.Random(3)
    back = sum(plan_returns(1, [], [0], rng) == [0] for _ in range(2000))
    assert 900 < back < 1100
    # A lone received layer of an index the client sent away must go back.
    assert plan_returns(2, [1], [1], rng) == [0]


def _cohort_step(models, groups, rng):
    """One repetition among numpy clients with the pure functions: sends, answers, commits."""
    nodes = list(range(len(models)))
    sends = {i: choose_sends(len(groups), [p for p in nodes if p != i], 1, 3, rng) for i in nodes}
    inbox = {
        i: [(s, layer) for s in nodes for layer, r in sends[s].items() if r == i] for i in nodes
    }
    sources = {
        i: plan_returns(len(groups), list(sends[i]), [layer for _, layer in inbox[i]], rng)
        for i in nodes
    }

    def layer_of(i, layer):
        return {n: models[i][n] for n in groups[layer]}

    returned = {i: {} for i in nodes}
    for i in nodes:
        for k, (sender, layer) in enumerate(inbox[i]):
            source = sources[i][k]
            returned[sender][layer] = (
                layer_of(i, layer) if source == OWN else layer_of(inbox[i][source][0], layer)
            )
    return [
        rebuild(
            models[i],
            groups,
            sends[i],
            [(layer, layer_of(s, layer)) for s, layer in inbox[i]],
            sources[i],
            returned[i],
            set(),
        )
        for i in nodes
    ]


@pytest.mark.parametrize("grouping", ["tensor", "module"])
def test_a_repetition_keeps_every_layer_exactly_once(models, grouping):
    groups = layer_groups(list(models[0]), grouping)
    rng = random.Random(2)
    current = models
    for _ in range(5):
        current = _cohort_step(current, groups, rng)
        for name in models[0]:
            assert sorted(m[name].tobytes() for m in current) == sorted(
                m[name].tobytes() for m in models
            )
        for model in current:  # module grouping moves a module's tensors together
            for names in groups:
                owners = [
                    {k for k, t in enumerate(models) if np.array_equal(t[n], model[n])}
                    for n in names
                ]
                assert set.intersection(*owners)
    assert any(
        not np.array_equal(c["fc1.weight"], m["fc1.weight"])
        for c, m in zip(current, models, strict=True)
    )


def test_rebuild_insists_on_a_return_or_an_abort_for_every_sent_layer(models):
    groups = layer_groups(list(models[0]))
    sent = {3: 99}
    with pytest.raises(ProtocolError, match="either its return or an abort"):
        rebuild(models[0], groups, sent, [], [], {}, set())
    with pytest.raises(ProtocolError, match="either its return or an abort"):
        rebuild(models[0], groups, sent, [], [], {3: {"bn1.bias": models[1]["bn1.bias"]}}, {3})
    with pytest.raises(ProtocolError, match="not sent"):
        rebuild(models[0], groups, sent, [], [], {}, {3, 4})
    kept = rebuild(models[0], groups, sent, [], [], {}, {3})
    assert all(np.array_equal(kept[n], models[0][n]) for n in models[0])


# ----------------------------------------------------------------------
# The state a node keeps between messages
# ----------------------------------------------------------------------


def test_exchange_state_survives_serialization(models):
    state = RecordDict()
    key = run_private_key(state, run_id=1)
    exchange = ExchangeState(
        node_id=2**64 - 1,
        private_key=key,
        server_round=4,
        grouping="module",
        min_layers=1,
        max_layers=3,
        model=models[0],
        metrics=MetricRecord({"num-examples": 17}),
        committed=1,
        repeat=2,
        peers={5: b"k" * 32},
        sent={2: 5},
        received=[(5, 1, {"bn1.weight": models[1]["bn1.weight"]})],
        sources=[OWN],
    )
    exchange.trained_digests = exchange.layer_digests()
    exchange.save(state)
    loaded = ExchangeState.load(recorddict_from_proto(recorddict_to_proto(state)))
    for field in (
        "node_id",
        "private_key",
        "server_round",
        "grouping",
        "min_layers",
        "max_layers",
        "committed",
        "repeat",
        "peers",
        "sent",
        "sources",
        "trained_digests",
    ):
        assert getattr(loaded, field) == getattr(exchange, field), field
    assert loaded.metrics["num-examples"] == 17
    assert [(s, i) for s, i, _ in loaded.received] == [(5, 1)]
    np.testing.assert_array_equal(loaded.received[0][2]["bn1.weight"], models[1]["bn1.weight"])
    assert all(
        np.array_equal(loaded.model[n], models[0][n])
        and loaded.model[n].dtype == models[0][n].dtype
        for n in models[0]
    )
    assert loaded.holds_trained_model()
    loaded.model = dict(loaded.model, **{"fc2.bias": models[1]["fc2.bias"]})
    assert not loaded.holds_trained_model()


def test_a_node_refuses_layers_sealed_for_someone_else(models):
    keys = [crypto.new_private_key() for _ in range(3)]
    nodes = [10, 11, 12]

    def state_of(i):
        return ExchangeState(
            node_id=nodes[i],
            private_key=keys[i],
            server_round=1,
            grouping="tensor",
            min_layers=1,
            max_layers=1,
            model=models[i],
            metrics=MetricRecord({"num-examples": 1}),
            peers={
                n: crypto.public_key(k) for n, k in zip(nodes, keys, strict=True) if n != nodes[i]
            },
            committed=0,
            repeat=1,
        )

    sender, receiver, bystander = state_of(0), state_of(1), state_of(2)
    sealed = sender._seal(11, "send", 0, 2, {"bn1.weight": models[0]["bn1.weight"]})
    assert receiver.answer(1, 0, [sealed], random.Random(0))  # the right receiver opens it
    redirected = Envelope(sealed.sender, 12, sealed.layer, sealed.attempt, sealed.payload)
    with pytest.raises(ProtocolError, match="failed authentication"):
        bystander.answer(1, 0, [redirected], random.Random(0))
    relabelled = Envelope(sealed.sender, 11, 3, sealed.attempt, sealed.payload)
    with pytest.raises(ProtocolError, match="failed authentication"):
        state_of(1).answer(1, 0, [relabelled], random.Random(0))
    with pytest.raises(ProtocolError, match="twice"):
        state_of(1).answer(1, 0, [sealed, sealed], random.Random(0))
