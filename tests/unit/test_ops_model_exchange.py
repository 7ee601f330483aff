"""FedMe's exchange operations: partner choice, eq. 8 aggregation, cluster schedule."""

import copy
from collections import Counter

import numpy as np
import pytest

from fedx.ops import assign_exchanges, cluster_count, fedme_aggregate
from tests.support.helpers import make_model


def _small_model(rng: np.random.Generator, width: int) -> dict[str, np.ndarray]:
    """A model whose layer sizes depend on ``width``: a stand-in for another architecture."""
    return {
        "features.0.weight": rng.normal(size=(width, 1, 3, 3)).astype(np.float32),
        "classifier.0.weight": rng.normal(size=(3, width)).astype(np.float32),
        "classifier.0.bias": rng.normal(size=(3,)).astype(np.float32),
    }


# ---------------------------------------------------------------------------
# fedme_aggregate (eq. 8)
# ---------------------------------------------------------------------------


def test_fedme_aggregate_is_eq_8_on_constructed_arrays():
    # Four clients with scalar-valued layers, so eq. 8 can be written out by hand.
    # Client j received the personalized model exchanged_from[j]:
    #   model 0 went to clients 1, 2 and 3 (s_0 = 3), model 1 to client 0
    #   (s_1 = 1), models 2 and 3 to nobody (s = 0).
    personalized = [
        {"w": np.full((2, 2), v, dtype=np.float32), "b": np.array([v], np.float32)}
        for v in (1.0, 10.0, 100.0, 1000.0)
    ]
    exchanged = [
        {"w": np.full((2, 2), v, dtype=np.float32), "b": np.array([v], np.float32)}
        for v in (20.0, 3.0, 5.0, 7.0)
    ]
    exchanged_from = [1, 0, 0, 0]
    before = copy.deepcopy((personalized, exchanged))

    result = fedme_aggregate(personalized, exchanged, exchanged_from)

    expected = [
        (1.0 + 3.0 + 5.0 + 7.0) / 4,  # w_0 and its three trained copies
        (10.0 + 20.0) / 2,  # w_1 and client 0's copy of it
        100.0,  # exchanged to nobody: unchanged
        1000.0,
    ]
    for model, value in zip(result, expected, strict=True):
        np.testing.assert_allclose(model["w"], np.full((2, 2), value), rtol=1e-6)
        np.testing.assert_allclose(model["b"], [value], rtol=1e-6)
        assert model["w"].dtype == np.float32
    # A model no copy came back for is passed through untouched; inputs are unchanged.
    assert result[2] is personalized[2]
    for now, then in zip((personalized, exchanged), before, strict=True):
        for model, original in zip(now, then, strict=True):
            assert all(np.array_equal(model[k], original[k]) for k in original)


def test_fedme_aggregate_matches_eq_8_written_with_u_and_s(models):
    # Eq. 8 literally: w_i <- (w_i + sum_j u_ij v_j) / (s_i + 1), u_ij = [from_j == i].
    rng = np.random.default_rng(5)
    exchanged = [make_model(rng) for _ in models]
    exchanged_from = [3, 3, 3, 0, 1, 3]  # model 3 out four times; 2, 4 and 5 never
    result = fedme_aggregate(models, exchanged, exchanged_from)
    for i, model in enumerate(models):
        u = [1.0 if source == i else 0.0 for source in exchanged_from]
        s = sum(u)
        for name in ("conv1.weight", "fc2.bias", "bn1.running_var"):
            total = model[name].astype(np.float64) + sum(
                u_j * v[name].astype(np.float64) for u_j, v in zip(u, exchanged, strict=True)
            )
            np.testing.assert_allclose(result[i][name], total / (s + 1), rtol=1e-5, atol=1e-6)
    # The integer BatchNorm counter is averaged and rounded, not truncated.
    counters = [models[3]["bn1.num_batches_tracked"]] + [
        exchanged[j]["bn1.num_batches_tracked"] for j in (0, 1, 2, 5)
    ]
    assert result[3]["bn1.num_batches_tracked"] == np.rint(np.mean(counters))
    assert result[3]["bn1.num_batches_tracked"].dtype == np.int64


def test_fedme_aggregate_leaves_out_copies_that_did_not_come_back():
    personalized = [{"w": np.array([v])} for v in (0.0, 4.0, 8.0)]
    exchanged = [{"w": np.array([2.0])}, None, {"w": np.array([6.0])}]
    result = fedme_aggregate(personalized, exchanged, [1, 0, 0])
    # Model 0 went to clients 1 and 2, but only client 2's copy came back: s_0 = 1.
    np.testing.assert_allclose(result[0]["w"], [(0.0 + 6.0) / 2])
    np.testing.assert_allclose(result[1]["w"], [(4.0 + 2.0) / 2])
    np.testing.assert_allclose(result[2]["w"], [8.0])


def test_fedme_aggregate_keeps_architectures_apart():
    rng = np.random.default_rng(1)
    # Clients 0, 1 have a narrow architecture, client 2 a wide one.
    personalized = [_small_model(rng, 4), _small_model(rng, 4), _small_model(rng, 8)]
    exchanged = [_small_model(rng, 8), _small_model(rng, 4), _small_model(rng, 4)]
    result = fedme_aggregate(personalized, exchanged, [2, 0, 1])
    assert [m["features.0.weight"].shape[0] for m in result] == [4, 4, 8]
    np.testing.assert_allclose(
        result[2]["classifier.0.weight"],
        (personalized[2]["classifier.0.weight"] + exchanged[0]["classifier.0.weight"]) / 2,
        rtol=1e-6,
    )


def test_fedme_aggregate_rejects_inconsistent_inputs():
    rng = np.random.default_rng(2)
    narrow, wide = _small_model(rng, 4), _small_model(rng, 8)
    with pytest.raises(ValueError, match="copy of model 1 trained by client 0"):
        fedme_aggregate([narrow, narrow], [wide, narrow], [1, 0])
    with pytest.raises(ValueError, match="client 1 received model 1"):
        fedme_aggregate([narrow, narrow], [narrow, narrow], [1, 1])
    with pytest.raises(ValueError, match="client 0 received model 5"):
        fedme_aggregate([narrow, narrow], [narrow, narrow], [5, 0])
    with pytest.raises(ValueError, match="one exchanged model and source per client"):
        fedme_aggregate([narrow, narrow], [narrow], [1, 0])


# ---------------------------------------------------------------------------
# assign_exchanges
# ---------------------------------------------------------------------------


def test_partners_come_from_the_own_cluster_and_never_oneself():
    labels = [0, 1, 0, 1, 1, 2, 2, 0]
    for seed in range(50):
        partners = assign_exchanges(labels, np.random.default_rng(seed))
        assert len(partners) == len(labels)
        for i, j in enumerate(partners):
            assert j != i
            assert labels[j] == labels[i]


def test_a_singleton_gets_a_model_from_another_cluster():
    labels = [0, 0, 1, 0, 2, 2]  # client 2 is alone in cluster 1
    seen = Counter()
    for seed in range(300):
        partners = assign_exchanges(labels, np.random.default_rng(seed))
        assert partners[2] != 2
        assert labels[partners[2]] != 1
        seen[partners[2]] += 1
    # Uniform over the five other models.
    assert set(seen) == {0, 1, 3, 4, 5}
    assert min(seen.values()) > 30


def test_with_one_cluster_every_other_model_can_be_the_partner():
    labels = np.zeros(4, dtype=np.int64)
    seen = {i: Counter() for i in range(4)}
    for seed in range(200):
        for i, j in enumerate(assign_exchanges(labels, np.random.default_rng(seed))):
            seen[i][j] += 1
    for i in range(4):
        assert set(seen[i]) == set(range(4)) - {i}


def test_all_singletons_and_two_models():
    partners = assign_exchanges([0, 1, 2], np.random.default_rng(0))
    assert all(j != i for i, j in enumerate(partners))
    assert assign_exchanges([7, 7], np.random.default_rng(0)) == [1, 0]
    assert assign_exchanges([0, 1], np.random.default_rng(0)) == [1, 0]


def test_assign_exchanges_is_reproducible_and_needs_two_models():
    labels = [0, 0, 0, 1, 1, 1, 1]
    first = assign_exchanges(labels, np.random.default_rng(9))
    assert first == assign_exchanges(labels, np.random.default_rng(9))
    assert any(assign_exchanges(labels, np.random.default_rng(s)) != first for s in range(10, 20))
    with pytest.raises(ValueError, match="at least two models"):
        assign_exchanges([0], np.random.default_rng(0))
    with pytest.raises(ValueError, match="1-D"):
        assign_exchanges([[0, 1]], np.random.default_rng(0))


# ---------------------------------------------------------------------------
# cluster_count
# ---------------------------------------------------------------------------


def test_cluster_count_starts_at_one_and_grows_at_the_listed_rounds():
    schedule = (250, 375, 450)  # the paper's CIFAR-10 schedule, 500 rounds
    assert [cluster_count(r, schedule) for r in (1, 249, 250, 374, 375, 449, 450, 500)] == [
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
    ]
    assert cluster_count(100, ()) == 1
