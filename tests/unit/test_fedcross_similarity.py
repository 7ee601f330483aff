"""FedCross's `layer-pairs` similarity against the authors' lab's code, on torch models.

The reference is the ``sim`` function of ``Algorithm/Training_FedCross.py`` in
mastlab-T3S/Federated_Learning (the same in PFLlib's
``system/flcore/servers/servercross.py``), followed here step by step on
torch state dicts as that code sees them: every entry in state-dict order,
BatchNorm's running statistics and its integer ``num_batches_tracked``
included, each flattened; entries 2k and 2k+1 concatenated (torch promotes
the counter to float) and their ``F.cosine_similarity`` added; after the walk
the pair in hand (the last pair, or a trailing single entry) added once
more. Their matrix has 0 on the diagonal, and their "highest" rule may pick
the model itself; fedx's never does.
"""

import functools
from collections.abc import Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from fedx.ops import cosine_similarity_matrix
from fedx.strategies import FedCross, to_model
from fedx.strategy_core.multi_model import PoolRound

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALPHA = 0.9


def small_cnn(last_bias: bool) -> nn.Module:
    """Conv, BatchNorm, two linear layers: 11 state-dict entries (10 without the last bias)."""
    return nn.Sequential(
        nn.Conv2d(1, 3, 3),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 4 * 4, 8),
        nn.ReLU(),
        nn.Linear(8, 3, bias=last_bias),
    )


@functools.cache
def trained_state_dicts(count: int, last_bias: bool) -> tuple[dict[str, torch.Tensor], ...]:
    """``count`` models from different seeds, trained a different number of SGD steps.

    Training moves BatchNorm's running statistics and its step counter, so
    every entry differs between the models.
    """
    dicts = []
    for index in range(count):
        torch.manual_seed(100 + index)
        model = small_cnn(last_bias)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2 + index):
            inputs, labels = torch.randn(16, 1, 6, 6), torch.randint(0, 3, (16,))
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
        dicts.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return tuple(dicts)  # shared by the tests, which only read it


def authors_sim_table(state_dicts: Sequence[dict[str, torch.Tensor]]) -> list[list[float]]:
    """The authors' ``sim_tab``: pairs k > j filled (both ways), 0 on the diagonal."""
    count = len(state_dicts)
    table = [[0.0] * count for _ in range(count)]
    for k in range(count):
        for j in range(k):
            total = torch.zeros(())
            pair_a = pair_b = None
            for position, name in enumerate(state_dicts[k]):
                a = state_dicts[k][name].view(-1)
                b = state_dicts[j][name].view(-1)
                if position % 2 == 0:
                    pair_a, pair_b = a, b
                else:
                    pair_a, pair_b = torch.cat((pair_a, a)), torch.cat((pair_b, b))
                    total = total + F.cosine_similarity(pair_a, pair_b, dim=0)
            total = total + F.cosine_similarity(pair_a, pair_b, dim=0)
            table[k][j] = table[j][k] = float(total)
    return table


def authors_collaborators(table: list[list[float]]) -> tuple[list[int], list[int]]:
    """The authors' ``maxtag`` (highest) and ``mintag`` (lowest) of every model."""
    count = len(table)
    highest, lowest = [], []
    for j in range(count):
        max_tag, min_tag = 0, (j + 1) % count
        for p in range(count):
            if table[j][p] > table[j][max_tag]:
                max_tag = p
            if table[j][p] < table[j][min_tag] and p != j:
                min_tag = p
        highest.append(max_tag)
        lowest.append(min_tag)
    return highest, lowest


def as_server_models(state_dicts: Sequence[dict[str, torch.Tensor]]) -> list[dict[str, np.ndarray]]:
    """The models as the server holds them: through an ArrayRecord, as a reply carries them."""
    return [to_model(ArrayRecord(state_dict)) for state_dict in state_dicts]


def fedcross_pool(models, selection: str, similarity: str) -> list[dict[str, np.ndarray]]:
    strategy = FedCross(alpha=ALPHA, selection=selection, similarity=similarity)
    count = len(models)
    return strategy.update_pool(PoolRound(2, models, [1.0] * count, [True] * count))


def assert_fused_with(pool, models, partners) -> None:
    for index, partner in enumerate(partners):
        for name, array in models[index].items():
            if array.dtype.kind != "f":
                np.testing.assert_array_equal(pool[index][name], array)
                continue
            expected = ALPHA * array + (1 - ALPHA) * models[partner][name]
            np.testing.assert_allclose(pool[index][name], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "last_bias", [True, False], ids=["11-entries-trailing-single", "10-entries-last-pair-twice"]
)
def test_layer_pairs_equal_the_authors_sim_on_trained_torch_models(last_bias):
    state_dicts = trained_state_dicts(5, last_bias)
    table = authors_sim_table(state_dicts)
    models = as_server_models(state_dicts)
    assert list(models[0]) == list(state_dicts[0])  # the server keeps the state-dict order
    assert len({int(m["1.num_batches_tracked"]) for m in models}) == 5
    result = cosine_similarity_matrix(models, measure="layer-pairs")
    for k in range(5):
        for j in range(5):
            if k != j:
                # Their sums are float32, fedx's float64: about six float32 roundings apart.
                assert result[k, j] == pytest.approx(table[k][j], abs=2e-6)
    # 11 entries: five pairs and a single one; 10 entries: five pairs, the last twice.
    np.testing.assert_array_equal(np.diag(result), 6.0)
    # The counter counts: without it (the "model" measure leaves it out) the sums differ.
    without_counter = [{n: a for n, a in m.items() if n != "1.num_batches_tracked"} for m in models]
    assert not np.allclose(result, cosine_similarity_matrix(without_counter, "layer-pairs"))


@pytest.mark.parametrize("last_bias", [True, False])
def test_fedcross_layer_pairs_fuses_with_the_authors_collaborators(last_bias):
    state_dicts = trained_state_dicts(5, last_bias)
    highest, lowest = authors_collaborators(authors_sim_table(state_dicts))
    models = as_server_models(state_dicts)
    assert_fused_with(fedcross_pool(models, "lowest_similarity", "layer-pairs"), models, lowest)
    # Here every model's highest is another model, so the rules agree.
    assert all(partner != index for index, partner in enumerate(highest))
    assert_fused_with(fedcross_pool(models, "highest_similarity", "layer-pairs"), models, highest)


def rotated_models() -> list[dict[str, torch.Tensor]]:
    """Three models 120 degrees apart in every pair of entries: all cosines are -1/2."""
    torch.manual_seed(0)
    shapes = {"fc1.weight": (4, 6), "fc1.bias": (4,), "fc2.weight": (2, 4), "fc2.bias": (2,)}
    directions = {name: torch.randn(2, *shape) for name, shape in shapes.items()}
    return [
        {
            name: torch.cos(angle) * direction[0] + torch.sin(angle) * direction[1]
            for name, direction in directions.items()
        }
        for angle in torch.tensor([0.0, 2.0944, 4.1888])
    ]


def test_highest_similarity_never_picks_the_model_itself():
    """Where every other model is negative, the authors' zero diagonal wins; fedx's rule skips it."""
    state_dicts = rotated_models()
    table = authors_sim_table(state_dicts)
    highest, _ = authors_collaborators(table)
    assert highest[0] == 0  # their model 0 fuses with itself (a no-op)
    models = as_server_models(state_dicts)
    similarity = cosine_similarity_matrix(models, "layer-pairs")
    assert all(similarity[i, j] < 0 for i in range(3) for j in range(3) if i != j)
    pool = fedcross_pool(models, "highest_similarity", "layer-pairs")
    partners = [
        max((j for j in range(3) if j != i), key=lambda j: similarity[i, j]) for i in range(3)
    ]
    assert all(partner != index for index, partner in enumerate(partners))
    assert_fused_with(pool, models, partners)


def test_the_similarity_key_decides_the_collaborator():
    """Flip a model's largest tensor: least similar as a whole; flip the others:
    least similar pair by pair."""
    (trained,) = as_server_models(trained_state_dicts(1, last_bias=True))
    floats = [n for n in trained if trained[n].dtype.kind == "f"]
    largest = max(floats, key=lambda n: trained[n].size)
    # Its norm dominates the whole-model vector; it is one pair of six.
    base = {n: 10 * a if n == largest else a for n, a in trained.items()}
    small_flipped = {n: -a if n in floats and n != largest else a for n, a in base.items()}
    big_flipped = {n: -a if n == largest else a for n, a in base.items()}
    models = [base, small_flipped, big_flipped]
    assert np.argmin(cosine_similarity_matrix(models, "model")[0, 1:]) + 1 == 2
    assert np.argmin(cosine_similarity_matrix(models, "layer-pairs")[0, 1:]) + 1 == 1
    for similarity, partner in (("model", 2), ("layer-pairs", 1)):
        pool = fedcross_pool(models, "lowest_similarity", similarity)
        assert_fused_with(pool[:1], models, [partner])
