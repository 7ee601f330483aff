"""FedMe and FedAvgFT against a stand-in grid of numpy clients."""

import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedx.ops import fedme_aggregate
from fedx.strategies import FedAvgFT, FedMe, to_model
from tests.support.fedme_standins import (
    CLIENT_OF,
    WIDTHS,
    NumpyClients,
    Predictor,
    initial_model,
    make_fedme,
    train_round,
)
from tests.support.standin_grid import NODE_IDS, StandInGrid

pytestmark = pytest.mark.usefixtures("server_task_identity")


def by_client(messages: list[Message]) -> dict[int, Message]:
    return {int(m.content["config"]["client-id"]): m for m in messages}


def test_clients_register_once_and_get_round_robin_architectures():
    grid = StandInGrid(NODE_IDS, NumpyClients())
    strategy = make_fedme()
    messages, _, _ = train_round(strategy, grid, 1)
    queries = grid.sent[0]
    assert [m.metadata.message_type for m in queries] == ["query"] * 5
    assert sorted(m.metadata.dst_node_id for m in queries) == sorted(NODE_IDS)
    # Architectures follow the client id, not the node order, from the seeded offset.
    offset = strategy.architecture_offset
    assert {cid: c.architecture for cid, c in strategy.clients.items()} == {
        cid: ("narrow", "wide")[(cid + offset) % 2] for cid in range(5)
    }
    assert {c.node_id for c in strategy.clients.values()} == set(NODE_IDS)  # u64 ids intact
    # Round 2 sends no queries: the nodes are known.
    train_round(strategy, grid, 2)
    assert all(m.metadata.message_type == "train" for m in grid.sent[-1])
    assert len(grid.sent) == 3  # the queries and two rounds of training
    assert make_fedme().architecture_offset == offset  # same seed, same assignment


def test_each_message_carries_the_personalized_and_an_exchanged_model():
    grid = StandInGrid(NODE_IDS, NumpyClients())
    strategy = make_fedme()
    messages, _, _ = train_round(strategy, grid, 1)
    assert len(messages) == 5 and len({m.metadata.dst_node_id for m in messages}) == 5
    for cid, message in by_client(messages).items():
        config = message.content["config"]
        assert set(message.content.array_records) == {"personalized", "exchanged"}
        assert CLIENT_OF[message.metadata.dst_node_id] == cid
        partner = int(config["exchanged-from"])
        assert partner != cid
        personalized = to_model(message.content["personalized"])
        exchanged = to_model(message.content["exchanged"])
        # Round 1: each client's own initial model and its partner's.
        assert np.all(personalized["out.bias"] == cid) and np.all(exchanged["out.bias"] == partner)
        assert config["personalized-architecture"] == strategy.architecture_for(cid)
        assert config["exchanged-architecture"] == strategy.architecture_for(partner)
        assert exchanged["hidden.weight"].shape[0] == WIDTHS[str(config["exchanged-architecture"])]
        assert config["lr"] == 0.1 and config["server-round"] == 1
        assert config["model-tuning"] is True and config["mutual-learning"] is True


def test_models_are_aggregated_by_eq_8_and_clients_adopt_their_choice():
    clients = NumpyClients(choose_exchanged={0, 3})
    grid = StandInGrid(NODE_IDS, clients)
    strategy = make_fedme()
    messages, replies, (arrays, metrics) = train_round(strategy, grid, 1)
    assert arrays is None  # FedMe has no global model
    sent = by_client(messages)
    partner = {cid: int(m.content["config"]["exchanged-from"]) for cid, m in sent.items()}
    trained = {CLIENT_OF[r.metadata.src_node_id]: r for r in replies}
    expected = fedme_aggregate(
        [to_model(trained[c].content["personalized"]) for c in range(5)],
        [to_model(trained[c].content["exchanged"]) for c in range(5)],
        [partner[c] for c in range(5)],
    )
    architectures = {cid: strategy.architecture_for(cid) for cid in range(5)}
    for cid in range(5):
        source = partner[cid] if cid in (0, 3) else cid
        state = strategy.clients[cid]
        assert state.architecture == architectures[source]
        for name, value in expected[source].items():
            np.testing.assert_array_equal(state.model[name], value)
    # Hand check of one value: model j's bias was j, trained +1 by j, +2 by each holder.
    holders = [c for c in range(5) if partner[c] == 1]
    assert strategy.clients[1].model["out.bias"][0] == pytest.approx(
        (1 + 1 + sum(1 + 2 for _ in holders)) / (len(holders) + 1)
    )
    assert metrics["trained-clients"] == 5
    assert metrics["adopted-exchanged"] == 2
    assert metrics["adopted-other-architecture"] == sum(
        architectures[partner[c]] != architectures[c] for c in (0, 3)
    )
    assert "chose-exchanged" not in metrics and metrics["train-loss-personalized"] == 1.0


@pytest.mark.parametrize("fault", ["shape", "nan", "missing", "error", "silent", "choice"])
def test_invalid_replies_are_logged_and_dropped(fault, caplog):
    clients = NumpyClients(broken={2: fault})
    grid = StandInGrid(NODE_IDS, clients)
    strategy = make_fedme(model_tuning=False)
    caplog.set_level(logging.WARNING)
    messages, _, (_, metrics) = train_round(strategy, grid, 1)
    node = next(n for n, c in CLIENT_OF.items() if c == 2)
    assert str(node) in caplog.text and "client 2" in caplog.text
    assert metrics["trained-clients"] == 4
    sent = by_client(messages)
    copies_of_2 = [c for c, m in sent.items() if int(m.content["config"]["exchanged-from"]) == 2]
    # Client 2's untrained model is averaged with the copies others trained (+2 each).
    assert strategy.clients[2].model["out.bias"][0] == pytest.approx(
        (2 + sum(2 + 2 for _ in copies_of_2)) / (len(copies_of_2) + 1)
    )
    assert strategy.clients[2].architecture == strategy.architecture_for(2)
    # Client 2's copy of its partner's model is left out of the partner's average.
    partner = int(sent[2].content["config"]["exchanged-from"])
    other_holders = [
        c
        for c, m in sent.items()
        if int(m.content["config"]["exchanged-from"]) == partner and c != 2
    ]
    assert strategy.clients[partner].model["out.bias"][0] == pytest.approx(
        (partner + 1 + sum(partner + 2 for _ in other_holders)) / (len(other_holders) + 1)
    )


def test_a_dropped_client_nobody_received_keeps_its_model_exactly():
    strategy = make_fedme()
    grid = StandInGrid(NODE_IDS, NumpyClients())
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
    sent = by_client(messages)
    received = {int(m.content["config"]["exchanged-from"]) for m in sent.values()}
    lonely = next(c for c in range(5) if c not in received)
    before = strategy.clients[lonely].model
    replies = [
        r for r in grid.send_and_receive(messages) if CLIENT_OF[r.metadata.src_node_id] != lonely
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["trained-clients"] == 4
    assert strategy.clients[lonely].model is before


def test_clustering_groups_clients_by_outputs_and_times_it():
    predictor = Predictor()
    strategy = make_fedme(predictor, cluster_rounds=(2,))
    grid = StandInGrid(NODE_IDS, NumpyClients())
    _, _, (_, first) = train_round(strategy, grid, 1)
    assert (
        predictor.calls == [] and first["num-clusters"] == 1 and first["clustering-seconds"] == 0.0
    )
    # Make two clearly separated groups of outputs: {0, 1, 2} and {3, 4}.
    for cid, state in strategy.clients.items():
        state.model = {
            **state.model,
            "out.bias": np.array([8.0, 0, 0] if cid < 3 else [0, 0, 8.0], np.float32),
        }
    messages, _, (_, second) = train_round(strategy, grid, 2)
    assert sorted(predictor.calls) == sorted(c.architecture for c in strategy.clients.values())
    assert second["num-clusters"] == 2 and second["clustering-seconds"] > 0.0
    for cid, message in by_client(messages).items():
        assert (int(message.content["config"]["exchanged-from"]) < 3) == (cid < 3)


def test_clustering_switched_off_never_computes_outputs():
    predictor = Predictor()
    strategy = make_fedme(predictor, cluster_rounds=(2,), clustering=False)
    grid = StandInGrid(NODE_IDS, NumpyClients())
    for server_round in (1, 2, 3):
        _, _, (_, metrics) = train_round(strategy, grid, server_round)
        assert metrics["num-clusters"] == 1
    assert predictor.calls == []


def test_a_round_with_fewer_than_two_clients_is_skipped(caplog):
    strategy = make_fedme()
    grid = StandInGrid(NODE_IDS[:1], NumpyClients())
    caplog.set_level(logging.WARNING)
    assert list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)) == []
    assert "needs two to exchange" in caplog.text
    assert strategy.aggregate_train(1, []) == (None, None)


def test_a_restarted_node_keeps_its_clients_model():
    strategy = make_fedme()
    grid = StandInGrid(NODE_IDS, NumpyClients())
    train_round(strategy, grid, 1)
    model = strategy.clients[CLIENT_OF[NODE_IDS[0]]].model
    new_node = 77
    CLIENT_OF[new_node] = CLIENT_OF[NODE_IDS[0]]
    try:
        grid.node_ids = [new_node, *NODE_IDS[1:]]
        messages = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    finally:
        del CLIENT_OF[new_node]
    cid = CLIENT_OF[NODE_IDS[0]]
    assert strategy.clients[cid].node_id == new_node and len(strategy.clients) == 5
    assert strategy.clients[cid].model is model
    assert {m.metadata.dst_node_id for m in messages} == {new_node, *NODE_IDS[1:]}


def test_personalized_evaluation_reports_every_client_and_mean_and_std():
    strategy = make_fedme(evaluate_every=2, finetune_epochs=3)
    strategy.begin_run(num_rounds=5, timeout=60.0)
    grid = StandInGrid(NODE_IDS, NumpyClients())
    train_round(strategy, grid, 1)
    assert list(strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)) == []
    messages = list(strategy.configure_evaluate(2, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid))
    assert len(messages) == 5
    for message in messages:
        config = message.content["config"]
        cid = int(config["client-id"])
        assert message.metadata.message_type == "evaluate"
        assert config["personalized-architecture"] == strategy.clients[cid].architecture
        assert config["finetune-epochs"] == 3 and config["lr"] == 0.1
    replies = grid.send_and_receive(messages)
    replies[0] = Message(Error(code=0, reason="boom"), reply_to=messages[0])
    metrics = strategy.aggregate_evaluate(2, replies)
    results = strategy.evaluations[2]
    dropped = CLIENT_OF[messages[0].metadata.dst_node_id]
    assert [r.client_id for r in results] == sorted(set(range(5)) - {dropped})
    accuracies = [0.1 * r.client_id for r in results]
    assert [r.accuracy for r in results] == pytest.approx(accuracies)
    assert metrics["personalized-accuracy"] == pytest.approx(np.mean(accuracies))
    assert metrics["personalized-accuracy-std"] == pytest.approx(np.std(accuracies))
    assert metrics["evaluated-clients"] == 4
    assert results[0].architecture == strategy.clients[results[0].client_id].architecture
    # The last round is always evaluated.
    assert len(list(strategy.configure_evaluate(5, ArrayRecord(), ConfigRecord(), grid))) == 5


def test_constructor_rejects_bad_settings():
    with pytest.raises(ValueError, match=r"^min_train_nodes must be an integer >= 2, got 1$"):
        make_fedme(min_train_nodes=1)
    with pytest.raises(
        ValueError, match=r"^architectures must be at least one architecture name, got \(\)$"
    ):
        make_fedme(architectures=())
    with pytest.raises(ValueError, match=r"^fraction_train must be a number in \(0, 1\], got 0.0$"):
        make_fedme(fraction_train=0.0)
    with pytest.raises(
        ValueError, match=r"^cluster_rounds must be increasing rounds >= 2, got \(3, 2\)$"
    ):
        make_fedme(cluster_rounds=(3, 2))


# ---------------------------------------------------------------------------
# Initial architectures
# ---------------------------------------------------------------------------


# Every client chooses the architecture round-robin would not give it.
def opposite_choices(strategy: FedMe) -> dict[int, str]:
    return {
        cid: "wide" if strategy.architecture_for(cid) == "narrow" else "narrow" for cid in range(5)
    }


def test_local_best_clients_start_with_the_architecture_they_choose():
    strategy = make_fedme(initial_architecture="local-best", choice_epochs=3)
    strategy.begin_run(num_rounds=3, timeout=60.0)
    chosen = opposite_choices(strategy)
    grid = StandInGrid(NODE_IDS, NumpyClients(architectures=chosen))
    messages, _, (_, metrics) = train_round(strategy, grid, 1)
    queries, choices = grid.sent[0], grid.sent[1]
    assert [m.metadata.message_type for m in queries] == ["query"] * 5
    assert [m.metadata.message_type for m in choices] == ["train"] * 5
    assert all(not m.content.array_records for m in choices)  # candidates only, no model
    for message in choices:
        config = message.content["config"]
        assert CLIENT_OF[message.metadata.dst_node_id] == config["client-id"]
        assert list(config["candidate-architectures"]) == ["narrow", "wide"]
        assert config["choice-epochs"] == 3 and config["lr"] == 0.1  # the round's settings
        assert config["server-round"] == 1
    assert {cid: c.architecture for cid, c in strategy.clients.items()} == chosen
    for cid, message in by_client(messages).items():
        # Each client starts from its first model of the architecture it chose.
        first = to_model(message.content["personalized"])
        for name, value in initial_model(chosen[cid], cid).items():
            np.testing.assert_array_equal(first[name], value)
        config = message.content["config"]
        assert config["personalized-architecture"] == chosen[cid]
        assert config["exchanged-architecture"] == chosen[int(config["exchanged-from"])]
    wide = sum(a == "wide" for a in chosen.values())
    assert metrics["initial-wide"] == wide and metrics["initial-narrow"] == 5 - wide
    assert metrics["architecture-choice-seconds"] >= 0.0
    # Nobody chooses twice; evaluation and checkpoints know the architectures.
    train_round(strategy, grid, 2)
    assert len(grid.sent) == 4 and all("personalized" in m.content for m in grid.sent[-1])
    evaluation = list(strategy.configure_evaluate(3, ArrayRecord(), ConfigRecord(), grid))
    for message in evaluation:
        config = message.content["config"]
        cid = int(config["client-id"])
        assert config["personalized-architecture"] == strategy.clients[cid].architecture
    restored = make_fedme(initial_architecture="local-best")
    restored.load_state_dict(strategy.state_dict())
    assert {c: s.architecture for c, s in restored.clients.items()} == {
        c: s.architecture for c, s in strategy.clients.items()
    }
    again = StandInGrid(NODE_IDS, NumpyClients(architectures=chosen))
    train_round(restored, again, 3)  # known clients: identified again, not asked to choose
    assert [m.metadata.message_type for m in again.sent[0]] == ["query"] * 5
    assert "personalized" in again.sent[1][0].content.array_records


@pytest.mark.parametrize("fault", ["silent", "error", "no-record", "huge"])
def test_a_client_without_a_valid_choice_starts_round_robin(fault, caplog):
    strategy = make_fedme(initial_architecture="local-best")
    chosen = opposite_choices(strategy)
    grid = StandInGrid(NODE_IDS, NumpyClients(architectures={**chosen, 2: fault}))
    caplog.set_level(logging.INFO)
    train_round(strategy, grid, 1)
    assert strategy.clients[2].architecture == strategy.architecture_for(2) != chosen[2]
    assert {c: s.architecture for c, s in strategy.clients.items() if c != 2} == {
        c: a for c, a in chosen.items() if c != 2
    }
    node = next(n for n, c in CLIENT_OF.items() if c == 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        str(node) in line
        and "client 2, architecture choice" in line
        and "it starts with its round-robin architecture" in line
        for line in warnings
    ), warnings
    assert (
        f"Client 2 (node {node}) joined with architecture {strategy.architecture_for(2)} (round-robin: no valid architecture choice)"
        in caplog.text
    )


def test_fixed_initial_architecture_gives_every_client_the_same_one():
    strategy = make_fedme(initial_architecture="fixed:wide")
    grid = StandInGrid(NODE_IDS, NumpyClients())
    messages, _, (_, metrics) = train_round(strategy, grid, 1)
    assert {c.architecture for c in strategy.clients.values()} == {"wide"}
    assert all(m.content["config"]["exchanged-architecture"] == "wide" for m in messages)
    assert metrics["initial-wide"] == 5 and "initial-narrow" not in metrics
    assert [m.metadata.message_type for m in grid.sent[0]] == ["query"] * 5
    assert len(grid.sent) == 2  # no choice messages
    for value in ("fixed:huge", "fixed:", "best", "local_best"):
        with pytest.raises(ValueError, match=r"^initial_architecture must be local-best, round"):
            make_fedme(initial_architecture=value)
    with pytest.raises(ValueError, match=r"^choice_epochs must be an integer >= 1, got 0$"):
        make_fedme(choice_epochs=0)


# ---------------------------------------------------------------------------
# FedAvg + fine-tuning
# ---------------------------------------------------------------------------


def _evaluation_reply(message: Message) -> Message:
    node = message.metadata.dst_node_id
    cid = CLIENT_OF[node]
    if cid == 4:
        metrics = {"eval-acc": 0.5, "eval-loss": 1.0, "num-examples": 5}  # no client-id
    else:
        metrics = {"eval-acc": 0.2 * cid, "eval-loss": 1.0, "num-examples": 5, "client-id": cid}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)


def test_fedavg_ft_sends_the_finetuning_epochs_and_keeps_per_client_results(caplog):
    strategy = FedAvgFT(finetune_epochs=2, evaluate_every=3, min_available_nodes=1)
    strategy.begin_run(num_rounds=4, timeout=60.0)
    grid = StandInGrid(NODE_IDS, _evaluation_reply)
    arrays = ArrayRecord()
    assert list(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid)) == []
    messages = list(strategy.configure_evaluate(3, arrays, ConfigRecord(), grid))
    assert len(messages) == 5  # every node: fraction_evaluate defaults to 1.0
    assert all(m.content["config"]["finetune-epochs"] == 2 for m in messages)
    caplog.set_level(logging.WARNING)
    metrics = strategy.aggregate_evaluate(3, grid.send_and_receive(messages))
    assert "client-id" in caplog.text  # the reply without an id is dropped
    assert [r.client_id for r in strategy.evaluations[3]] == [0, 1, 2, 3]
    assert metrics["personalized-accuracy"] == pytest.approx(np.mean([0.0, 0.2, 0.4, 0.6]))
    assert metrics["personalized-accuracy-std"] == pytest.approx(np.std([0.0, 0.2, 0.4, 0.6]))
    assert len(list(strategy.configure_evaluate(4, arrays, ConfigRecord(), grid))) == 5


@pytest.mark.usefixtures("server_task_identity")
def test_fedavg_ft_evaluates_the_last_round_once_told_the_run_length():
    # The app drives strategies with run_rounds, which calls begin_run, not start.
    from fedx.strategies import FedAvgFT  # pylint: disable=import-outside-toplevel

    grid = StandInGrid(NODE_IDS)
    strategy = FedAvgFT(evaluate_every=2, min_available_nodes=1, min_evaluate_nodes=1)
    assert list(strategy.configure_evaluate(3, ArrayRecord(), ConfigRecord(), grid)) == []
    strategy.begin_run(num_rounds=3, timeout=1.0)
    assert len(list(strategy.configure_evaluate(3, ArrayRecord(), ConfigRecord(), grid))) == len(
        NODE_IDS
    )
    assert list(strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)) == []
