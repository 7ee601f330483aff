"""FedMe's client side: mutual-learning losses, joint training, the model choice."""

import copy
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

from fedx.data import load_split
from fedx.models import build_model
from fedx.mutual import mutual_losses, prefers_exchanged, train_mutual
from fedx.training import train
from tests.support.torch_helpers import CPU

pytestmark = pytest.mark.usefixtures("one_torch_thread")


PERSONALIZED_LOGITS = [[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]]
EXCHANGED_LOGITS = [[0.0, 1.0, 0.0], [2.0, 0.0, 1.0]]
LABELS = [0, 2]


def _softmax(logits: list[float]) -> list[float]:
    exps = [math.exp(v) for v in logits]
    return [e / sum(exps) for e in exps]


def _hand_losses() -> tuple[float, float]:
    """Eqs. 3 and 4 divided by the batch size, with math only."""
    loss_p = loss_ex = 0.0
    for z_p, z_ex, y in zip(PERSONALIZED_LOGITS, EXCHANGED_LOGITS, LABELS, strict=True):
        p, q = _softmax(z_p), _softmax(z_ex)
        loss_p += -math.log(p[y]) + sum(q[m] * math.log(q[m] / p[m]) for m in range(3))
        loss_ex += -math.log(q[y]) + sum(p[m] * math.log(p[m] / q[m]) for m in range(3))
    return loss_p / len(LABELS), loss_ex / len(LABELS)


def _tensors():
    z_p = torch.tensor(PERSONALIZED_LOGITS, dtype=torch.float64, requires_grad=True)
    z_ex = torch.tensor(EXCHANGED_LOGITS, dtype=torch.float64, requires_grad=True)
    return z_p, z_ex, torch.tensor(LABELS)


def test_mutual_losses_match_a_hand_computation_on_fixed_logits():
    z_p, z_ex, labels = _tensors()
    loss_p, loss_ex = mutual_losses(z_p, z_ex, labels)
    expected_p, expected_ex = _hand_losses()
    assert loss_p.item() == pytest.approx(expected_p, rel=1e-12)
    assert loss_ex.item() == pytest.approx(expected_ex, rel=1e-12)
    # The two KL directions differ here, so a swapped KL would fail above.
    assert expected_p != pytest.approx(expected_ex, rel=1e-3)


def test_without_mutual_learning_the_losses_are_cross_entropy():
    z_p, z_ex, labels = _tensors()
    loss_p, loss_ex = mutual_losses(z_p, z_ex, labels, mutual_learning=False)
    ce = [
        sum(-math.log(_softmax(z)[y]) for z, y in zip(logits, LABELS, strict=True)) / 2
        for logits in (PERSONALIZED_LOGITS, EXCHANGED_LOGITS)
    ]
    assert loss_p.item() == pytest.approx(ce[0], rel=1e-12)
    assert loss_ex.item() == pytest.approx(ce[1], rel=1e-12)


def test_each_loss_moves_only_its_own_model_with_the_expected_gradient():
    z_p, z_ex, labels = _tensors()
    loss_p, _ = mutual_losses(z_p, z_ex, labels)
    grad_p, grad_ex = torch.autograd.grad(loss_p, (z_p, z_ex), allow_unused=True)
    # The exchanged model's probabilities are constants in loss_p.
    assert grad_ex is None or torch.count_nonzero(grad_ex) == 0
    # d/dz_p [CE(p, y) + KL(q || p)] = (p - onehot(y)) + (p - q), over the batch size.
    for n, (z, zq, y) in enumerate(zip(PERSONALIZED_LOGITS, EXCHANGED_LOGITS, LABELS, strict=True)):
        p, q = _softmax(z), _softmax(zq)
        expected = [(2 * p[m] - (m == y) - q[m]) / 2 for m in range(3)]
        np.testing.assert_allclose(grad_p[n].numpy(), expected, rtol=1e-10)


def _digits_loader(seed: int) -> DataLoader:
    subset = Subset(load_split("digits", "train"), np.arange(120))
    return DataLoader(
        subset, batch_size=30, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )


def test_train_mutual_updates_both_models_of_different_architectures():
    torch.manual_seed(0)
    personalized, exchanged = (
        build_model("cnn-1", (1, 8, 8), 10),
        build_model("cnn-3", (1, 8, 8), 10),
    )
    before = [copy.deepcopy(m.state_dict()) for m in (personalized, exchanged)]
    losses = train_mutual(
        personalized,
        exchanged,
        _digits_loader(0),
        epochs=2,
        learning_rate=0.05,
        weight_decay=1e-4,
        device=CPU,
    )
    assert all(math.isfinite(loss) and loss > 0 for loss in losses)
    for model, start in zip((personalized, exchanged), before, strict=True):
        assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert train_mutual(
        personalized, exchanged, _digits_loader(0), epochs=0, learning_rate=0.05, device=CPU
    ) == (0.0, 0.0)


def test_train_mutual_without_mutual_learning_is_plain_sgd_on_each_model():
    torch.manual_seed(1)
    model = build_model("cnn-2", (1, 8, 8), 10)
    partner = build_model("cnn-1", (1, 8, 8), 10)
    alone, joint = copy.deepcopy(model), copy.deepcopy(model)
    settings = {
        "epochs": 2,
        "learning_rate": 0.05,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "device": CPU,
    }
    loss_alone = train(alone, _digits_loader(3), **settings)
    loss_joint, _ = train_mutual(
        joint, copy.deepcopy(partner), _digits_loader(3), mutual_learning=False, **settings
    )
    assert loss_joint == pytest.approx(loss_alone, rel=1e-5)
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(joint.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    # With mutual learning the same start ends elsewhere: the KL terms matter.
    mutual = copy.deepcopy(model)
    train_mutual(mutual, copy.deepcopy(partner), _digits_loader(3), **settings)
    assert any(
        not torch.allclose(mutual.state_dict()[k], v, atol=1e-4)
        for k, v in alone.state_dict().items()
    )


@pytest.mark.parametrize(
    ("personalized_loss", "exchanged_loss", "adopt"),
    [(0.9, 0.4, True), (0.4, 0.9, False), (0.5, 0.5, False), (2.3, 2.2999, True)],
)
def test_the_choice_rule_picks_the_lower_validation_loss(personalized_loss, exchanged_loss, adopt):
    assert prefers_exchanged(personalized_loss, exchanged_loss) is adopt
