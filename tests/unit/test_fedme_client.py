"""The torch side of FedMe and FedAvg + fine-tuning, in process.

The real ClientApp functions answer the messages of a stand-in grid, so the
message layout, the client's choice and personalized evaluation are checked
without starting Flower's simulation.
"""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedx import client_app
from fedx.client.fedme import CandidateResult, best_architecture, try_architectures
from fedx.config import RunConfig
from fedx.data import load_local_splits, load_unlabeled
from fedx.models import build_model, build_seeded_model, client_model_seed
from fedx.protocol.common import TrainingSettings
from fedx.server.building import build_strategy
from fedx.server_models import ServerModels
from fedx.strategies import to_arrayrecord, to_model
from fedx.training import evaluate
from tests.support.helpers import DEFAULTS
from tests.support.standin_grid import StandInGrid
from tests.support.torch_helpers import CPU

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")
NODES = [2**64 - 3, 17, 2**63 + 5, 8]
HANDLERS = {
    "query": client_app.identify,
    "train": client_app.train_model,
    "evaluate": client_app.evaluate_model,
}


def run_config(**overrides) -> dict:
    return {
        **DEFAULTS,
        "partitioning": "dirichlet-size-label",
        "dirichlet-alpha": 0.5,
        "local-epochs": 1,
        # The same message twice gives the same reply, on a GPU too.
        "deterministic": True,
        **overrides,
    }


def grid_of_clients(config: dict) -> StandInGrid:
    """Four nodes, partitions 0..3, each answering with the real ClientApp functions."""
    contexts = {
        node: Context(
            1, node, {"partition-id": i, "num-partitions": len(NODES)}, RecordDict(), config
        )
        for i, node in enumerate(NODES)
    }
    return StandInGrid(
        NODES, lambda m: HANDLERS[m.metadata.message_type](m, contexts[m.metadata.dst_node_id])
    )


@pytest.fixture(scope="module")
def server_models() -> ServerModels:
    return ServerModels((1, 8, 8), 10, lambda: load_unlabeled("digits"), seed=0)


def fedme_message(server_models: ServerModels, node: int, **config) -> Message:
    # cnn-1 learns fastest on digits: after one epoch the exchanged model wins.
    personalized = server_models.initial_model("cnn-3", 0)
    exchanged = server_models.initial_model("cnn-1", 1)
    settings = {
        "server-round": 1,
        "client-id": 0,
        "personalized-architecture": "cnn-3",
        "exchanged-architecture": "cnn-1",
        "exchanged-from": 1,
        "model-tuning": True,
        "mutual-learning": True,
        **config,
    }
    content = RecordDict(
        {
            "personalized": to_arrayrecord(personalized),
            "exchanged": to_arrayrecord(exchanged),
            "config": ConfigRecord(settings),
        }
    )
    return Message(content, dst_node_id=node, message_type="train")


def test_a_node_identifies_itself_by_its_partition_id():
    grid = grid_of_clients(run_config(strategy="fedme"))
    queries = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in NODES]
    replies = grid.send_and_receive(queries)
    assert [r.content["metrics"]["client-id"] for r in replies] == [0, 1, 2, 3]


@pytest.mark.parametrize("model_tuning", [True, False])
def test_the_client_trains_both_models_and_reports_its_choice(server_models, model_tuning):
    # On the CPU on purpose: the reported losses are checked against
    # evaluate() on the CPU below (a GPU's convolutions round otherwise).
    grid = grid_of_clients(run_config(strategy="fedme", device="cpu"))
    message = fedme_message(server_models, NODES[2], **{"model-tuning": model_tuning})
    reply = grid.send_and_receive([message])[0]
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    for key, architecture, client in (("personalized", "cnn-3", 0), ("exchanged", "cnn-1", 1)):
        sent = server_models.initial_model(architecture, client)
        trained = to_model(reply.content[key])
        assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in sent.items()}
        assert any(not np.array_equal(trained[k], sent[k]) for k in sent)
    metrics = reply.content["metrics"]
    splits = load_local_splits("digits", 2, len(NODES), alpha=0.5)
    assert metrics["num-examples"] == len(splits.train)
    # The reported validation losses are those of the returned models on the
    # client's own validation split, and the choice is the lower one.
    validation = DataLoader(splits.validation, batch_size=64)
    losses = {}
    for key, architecture in (("personalized", "cnn-3"), ("exchanged", "cnn-1")):
        model = build_model(architecture, (1, 8, 8), 10)
        model.load_state_dict(reply.content[key].to_torch_state_dict())
        losses[key] = evaluate(model, validation, CPU)[0]
        assert metrics[f"val-loss-{key}"] == pytest.approx(losses[key], rel=1e-5)
    assert losses["exchanged"] < losses["personalized"]
    assert metrics["chose-exchanged"] == int(model_tuning)
    assert all(np.isfinite(metrics[k]) for k in ("train-loss-personalized", "train-loss-exchanged"))


def test_server_models_reuse_one_module_per_architecture_and_batch(server_models):
    model = server_models.initial_model("cnn-2", 3)
    assert server_models.module("cnn-2") is server_models.module("cnn-2")
    probabilities = server_models.probabilities("cnn-2", model)
    assert probabilities.shape == (200, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    small_batches = ServerModels(
        (1, 8, 8), 10, lambda: load_unlabeled("digits"), seed=0, batch_size=7
    )
    # Batches of 7 and of 200 run other kernels that add in other orders (on
    # an H100 the two differed by 2.4e-6; on a CPU by less than 1e-7). A
    # sample's outputs in another's place would be off by more than 1e-2.
    np.testing.assert_allclose(
        small_batches.probabilities("cnn-2", model), probabilities, atol=2e-5
    )
    # Another model through the same module gives other outputs: the weights were loaded.
    assert not np.allclose(
        server_models.probabilities("cnn-2", server_models.initial_model("cnn-2", 4)), probabilities
    )


def test_initial_models_depend_on_seed_and_client_only(server_models):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = server_models.initial_model("cnn-4", 2)
    assert torch.equal(torch.rand(1), expected_next)  # the global torch RNG is left alone
    again = server_models.initial_model("cnn-4", 2)
    other = server_models.initial_model("cnn-4", 3)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_fedavg_ft_fine_tunes_the_global_model_on_each_client():
    accuracy = {}
    for epochs in (0, 1):
        config = run_config(strategy="fedavg-ft", **{"finetune-epochs": epochs, "local-epochs": 2})
        cfg = RunConfig.from_mapping(config)
        strategy = build_strategy(cfg)
        torch.manual_seed(0)
        initial = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
        strategy.start(
            grid=grid_of_clients(config),
            initial_arrays=initial,
            num_rounds=1,
            timeout=60,
            train_config=TrainingSettings.from_run_config(cfg).to_record(),
            evaluate_config=TrainingSettings.from_run_config(cfg).to_record(),
        )
        results = strategy.evaluations[1]
        assert [r.client_id for r in results] == [0, 1, 2, 3]
        assert [r.num_examples for r in results] == [
            len(load_local_splits("digits", i, 4, alpha=0.5).test) for i in range(4)
        ]
        accuracy[epochs] = np.mean([r.accuracy for r in results])
    # One round of FedAvg leaves a weak global model; one epoch on each
    # client's own (label-skewed) data fits it to that client's test split.
    assert accuracy[1] > accuracy[0] + 0.05


# ---------------------------------------------------------------------------
# The local choice of an architecture before the first round
# ---------------------------------------------------------------------------


def xor_data(size: int, seed: int) -> TensorDataset:
    """Two noisy features; the label is 1 where they have the same sign (XOR)."""
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (size, 2), generator=generator) * 2.0 - 1.0
    inputs = signs + 0.2 * torch.randn(size, 2, generator=generator)
    return TensorDataset(inputs, (signs[:, 0] == signs[:, 1]).long())


# No straight line separates XOR's classes (a linear model gets at most 3 of
# its 4 clusters right); one hidden layer does.
XOR_CANDIDATES = {
    "linear": lambda: nn.Linear(2, 2),
    "one-hidden-layer": lambda: nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)),
}


@pytest.mark.parametrize("order", [("linear", "one-hidden-layer"), ("one-hidden-layer", "linear")])
def test_local_best_picks_the_deeper_model_its_data_favours(order):
    torch.manual_seed(0)
    results = try_architectures(
        order,
        lambda name: XOR_CANDIDATES[name](),
        DataLoader(xor_data(200, seed=1), batch_size=20, shuffle=True),
        DataLoader(xor_data(200, seed=2), batch_size=100),
        epochs=30,
        seed=3,
        device=CPU,
        learning_rate=0.1,
        momentum=0.9,
        weight_decay=0.0,
    )
    accuracy = {r.architecture: r.validation_accuracy for r in results}
    assert [r.architecture for r in results] == list(order)
    assert accuracy["linear"] <= 0.8 and accuracy["one-hidden-layer"] >= 0.95
    assert best_architecture(results) == "one-hidden-layer"


def test_ties_in_accuracy_go_to_the_lower_loss_then_the_earlier_candidate():
    def result(name, accuracy, loss):
        return CandidateResult(name, accuracy, loss)

    assert best_architecture([result("a", 0.8, 0.5), result("b", 0.9, 0.9)]) == "b"
    assert best_architecture([result("a", 0.9, 0.5), result("b", 0.9, 0.4)]) == "b"
    assert best_architecture([result("a", 0.9, 0.5), result("b", 0.9, 0.5)]) == "a"
    assert best_architecture([result("a", 0.9, float("nan")), result("b", 0.9, 2.0)]) == "b"
    with pytest.raises(ValueError):
        best_architecture([])


def test_the_client_answers_the_choice_with_its_best_candidate():
    grid = grid_of_clients(run_config(strategy="fedme"))
    candidates = ["cnn-1", "cnn-4"]
    config = {
        **TrainingSettings.from_run_config(RunConfig.from_mapping(run_config())).to_record(),
        "server-round": 1,
        "client-id": 1,
        "candidate-architectures": candidates,
        "choice-epochs": 2,
    }
    replies = [
        grid.send_and_receive(
            [
                Message(
                    RecordDict({"config": ConfigRecord(config)}),
                    dst_node_id=NODES[1],
                    message_type="train",
                )
            ]
        )[0]
        for _ in range(2)
    ]
    reply = replies[0]
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    metrics = reply.content["metrics"]
    results = [
        CandidateResult(name, accuracy, loss)
        for name, accuracy, loss in zip(
            candidates,
            metrics["val-acc-candidates"],
            metrics["val-loss-candidates"],
            strict=True,
        )
    ]
    assert reply.content["choice"]["chosen-architecture"] == best_architecture(results)
    assert all(0.0 <= r.validation_accuracy <= 1.0 and r.validation_loss > 0 for r in results)
    assert metrics["num-examples"] == len(
        load_local_splits("digits", 1, len(NODES), alpha=0.5).train
    )
    # Each candidate starts from the first model the server gives client 1.
    server = ServerModels((1, 8, 8), 10, lambda: load_unlabeled("digits"), seed=DEFAULTS["seed"])
    for architecture in candidates:
        first = server.initial_model(architecture, 1)
        built = build_seeded_model(
            architecture, (1, 8, 8), 10, client_model_seed(DEFAULTS["seed"], 1)
        )
        assert all(np.array_equal(first[k], v.numpy()) for k, v in built.state_dict().items())
    # Reproducible: the same message gives the same accuracies and losses.
    assert list(replies[1].content["metrics"]["val-loss-candidates"]) == list(
        metrics["val-loss-candidates"]
    )
