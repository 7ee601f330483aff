"""Tests for fedx.training: local SGD training, the proximal term, evaluation."""

import logging
import math
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from fedx.data import load_split
from fedx.models import build_model
from fedx.training import (
    CUBLAS_WORKSPACE_ENV,
    deterministic_kernels,
    evaluate,
    get_device,
    train,
)
from tests.support.torch_helpers import CPU

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _digits_loaders(num_train: int = 400) -> tuple[DataLoader, DataLoader]:
    train_split = load_split("digits", "train")
    subset = Subset(train_split, np.arange(num_train))
    generator = torch.Generator().manual_seed(0)
    train_loader = DataLoader(subset, batch_size=32, shuffle=True, generator=generator)
    test_loader = DataLoader(load_split("digits", "test"), batch_size=128)
    return train_loader, test_loader


def _flat_parameters(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_get_device_prefers_cuda() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert get_device() == get_device("auto") == torch.device(expected)


def test_a_device_can_be_pinned_and_cuda_without_a_gpu_says_so(monkeypatch) -> None:
    assert get_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert get_device("auto") == CPU
    with pytest.raises(RuntimeError, match="device='cuda' but torch sees no GPU"):
        get_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device("cuda") == get_device("auto") == torch.device("cuda")
    with pytest.raises(ValueError, match="'gpu' is not one of"):
        get_device("gpu")


def test_deterministic_kernels_hold_for_the_block_only(monkeypatch) -> None:
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, "")  # restored after the test, as it was
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV)
    torch.backends.cudnn.benchmark = True
    try:
        with deterministic_kernels(False):
            assert not torch.are_deterministic_algorithms_enabled()
        assert CUBLAS_WORKSPACE_ENV not in os.environ
        with deterministic_kernels(True):
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.backends.cudnn.benchmark
            # cuBLAS reads it when the process first uses it: set before any GPU work.
            assert os.environ[CUBLAS_WORKSPACE_ENV] == ":4096:8"
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark
        with pytest.raises(KeyError), deterministic_kernels(True):
            raise KeyError("a failing block")
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.backends.cudnn.benchmark = False


def test_deterministic_kernels_warn_where_cuda_started_without_the_cublas_setting(
    monkeypatch, caplog
) -> None:
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":16:8")  # a deterministic value of the user's: kept
    with deterministic_kernels(True):
        assert os.environ[CUBLAS_WORKSPACE_ENV] == ":16:8"
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr("fedx.training._logged", set())
    with caplog.at_level(logging.WARNING, logger="flwr"), deterministic_kernels(True):
        pass
    assert "CUDA started in this process" in caplog.text
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in caplog.text


def test_training_reads_its_running_sums_from_the_device_once_per_call(monkeypatch) -> None:
    """No host synchronisation per batch: a GPU queues batch after batch."""
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    # The batches as a list: a DataLoader reads a seed for each pass (on the CPU).
    loader = list(DataLoader(Subset(load_split("digits", "train"), np.arange(200)), batch_size=20))
    reads = []
    item = torch.Tensor.item

    def counted(tensor: torch.Tensor):
        reads.append(tensor.shape)
        return item(tensor)

    monkeypatch.setattr(torch.Tensor, "item", counted)
    loss = train(model, loader, epochs=3, learning_rate=0.05, device=CPU)
    assert len(reads) == 1 and loss > 0  # 30 batches, one read
    reads.clear()
    evaluate(model, loader, device=CPU)
    assert len(reads) == 2  # the loss and the count of correct predictions


def test_training_on_digits_learns() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    train_loader, test_loader = _digits_loaders()
    loss_before, accuracy_before = evaluate(model, test_loader, device=CPU)

    first_loss = train(model, train_loader, epochs=1, learning_rate=0.05, device=CPU)
    last_loss = train(model, train_loader, epochs=4, learning_rate=0.05, device=CPU)
    loss_after, accuracy_after = evaluate(model, test_loader, device=CPU)

    assert last_loss < first_loss
    assert loss_after < loss_before
    assert accuracy_before < 0.3  # about chance (0.1) before training
    assert accuracy_after > 0.7
    assert model.training is False  # evaluate() left it in eval mode


def test_train_returns_sample_weighted_mean_loss_of_last_epoch() -> None:
    # With a zero learning rate the model never changes, so the reported
    # loss must equal evaluate()'s, batches of unequal size included (7 = 3+3+1).
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    data = TensorDataset(torch.randn(7, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0]))
    loader = DataLoader(data, batch_size=3)
    before = _flat_parameters(model)

    reported = train(model, loader, epochs=2, learning_rate=0.0, device=CPU)

    torch.testing.assert_close(_flat_parameters(model), before)
    assert model.training is True
    expected_loss, _ = evaluate(model, loader, device=CPU)
    assert reported == pytest.approx(expected_loss, rel=1e-6)
    assert train(model, loader, epochs=0, learning_rate=0.1, device=CPU) == 0.0
    torch.testing.assert_close(_flat_parameters(model), before)


def test_proximal_term_keeps_weights_closer_to_the_start() -> None:
    train_loader, _ = _digits_loaders(num_train=160)
    # Same data order for both runs.
    loader = DataLoader(train_loader.dataset, batch_size=32, shuffle=False)

    def distance_travelled(mu: float) -> float:
        torch.manual_seed(1)
        model = build_model("cnn", (1, 8, 8), 10)
        start = _flat_parameters(model)
        train(model, loader, epochs=2, learning_rate=0.05, proximal_mu=mu, device=CPU)
        return float(torch.linalg.vector_norm(_flat_parameters(model) - start))

    free, near, nearer = distance_travelled(0.0), distance_travelled(1.0), distance_travelled(10.0)
    assert near < free
    assert nearer < 0.5 * near


def test_proximal_gradient_matches_fedprox() -> None:
    # Two full-batch SGD steps without momentum. The first step starts at
    # w0, where the proximal gradient is zero, so both runs reach the same w1;
    # the second step then adds -lr * mu * (w1 - w0) to the plain update.
    torch.manual_seed(0)
    inputs, labels = torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1])
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=5)
    lr, mu = 0.1, 2.0

    plain = nn.Linear(3, 2)
    proximal = nn.Linear(3, 2)
    proximal.load_state_dict(plain.state_dict())
    w0 = _flat_parameters(plain)
    train(plain, loader, epochs=1, learning_rate=lr, momentum=0.0, device=CPU)
    w1 = _flat_parameters(plain)
    # Second step of the plain run, for the data gradient at w1.
    train(plain, loader, epochs=1, learning_rate=lr, momentum=0.0, device=CPU)
    data_step = _flat_parameters(plain) - w1

    train(proximal, loader, epochs=2, learning_rate=lr, momentum=0.0, proximal_mu=mu, device=CPU)
    expected = w1 + data_step - lr * mu * (w1 - w0)
    torch.testing.assert_close(_flat_parameters(proximal), expected)


def test_evaluate_matches_a_hand_count() -> None:
    # Logits are the inputs themselves: predictions are the argmax of each row.
    model = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
    inputs = torch.tensor(
        [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    )
    labels = torch.tensor([0, 1, 1, 0, 2])
    # Correct: rows 0 and 1; row 2 predicts 2, row 3 predicts 1, row 4 is a
    # tie that argmax resolves to class 0.
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=2)

    loss, accuracy = evaluate(model, loader, device=CPU)

    def cross_entropy(logits: list[float], label: int) -> float:
        return math.log(sum(math.exp(v) for v in logits)) - logits[label]

    expected_loss = np.mean(
        [cross_entropy(row.tolist(), int(y)) for row, y in zip(inputs, labels, strict=True)]
    )
    assert accuracy == pytest.approx(2 / 5)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert evaluate(model, DataLoader(TensorDataset(inputs[:0], labels[:0])), CPU) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "key"), [({"epochs": -1}, "epochs"), ({"proximal_mu": -0.1}, "proximal_mu")]
)
def test_train_rejects_negative_settings(kwargs: dict, key: str) -> None:
    loader = DataLoader(TensorDataset(torch.zeros(2, 3), torch.tensor([0, 1])))
    arguments = {"epochs": 1, "learning_rate": 0.1} | kwargs
    with pytest.raises(ValueError, match=key):
        train(nn.Linear(3, 2), loader, device=CPU, **arguments)
