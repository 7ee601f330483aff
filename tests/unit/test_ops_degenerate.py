"""Every server operation has a defined value for degenerate inputs (issue 17, item 1).

Zero models, identical models, one trained slot among untouched copies, and
pools of one or two models. The values chosen:

* cosine similarity against a zero model (or a zero pair of entries) is 0,
  its own included, as PyTorch's ``cosine_similarity`` gives;
* identical models have similarity 1, to float32 rounding (the products
  are float32 per block), so which of several identical models is picked is
  decided by rounding; it does not matter, as they are identical; exact ties
  go to the lowest other index;
* with K = 1 cross aggregation has no collaborator and returns the model
  unchanged; with K = 2 each model's collaborator is the other one;
* the mean of one model is the model; its mutation (k = 1) is the model.
"""

import numpy as np
import pytest

from fedx.ops import (
    SELECTIONS,
    assign_exchanges,
    average,
    collaborator_indices,
    cosine_similarity_matrix,
    cross_aggregate,
    fedme_aggregate,
    mutate,
    recombine,
)
from tests.support.helpers import make_model

MEASURES = ["model", "layer-pairs"]


def zeros_like(model: dict) -> dict:
    return {name: np.zeros_like(array) for name, array in model.items()}


def assert_same_model(actual: dict, expected: dict, rtol: float = 0.0) -> None:
    assert list(actual) == list(expected)
    for name, array in actual.items():
        assert array.dtype == expected[name].dtype and array.shape == expected[name].shape
        np.testing.assert_allclose(array, expected[name], rtol=rtol, atol=0)


@pytest.fixture
def trained():
    rng = np.random.default_rng(7)
    return [make_model(rng) for _ in range(4)]


# --- zero models ------------------------------------------------------------


@pytest.mark.parametrize("measure", MEASURES)
def test_similarity_with_a_zero_model_is_zero(trained, measure):
    models = [*trained[:3], zeros_like(trained[0])]
    result = cosine_similarity_matrix(models, measure)
    np.testing.assert_array_equal(result[3], 0.0)
    np.testing.assert_array_equal(result[:, 3], 0.0)
    assert np.isfinite(result).all()
    # The others keep their similarities.
    np.testing.assert_allclose(
        result[:3, :3], cosine_similarity_matrix(trained[:3], measure), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("measure", MEASURES)
def test_similarity_of_all_zero_models_is_all_zero(trained, measure):
    result = cosine_similarity_matrix([zeros_like(m) for m in trained], measure)
    np.testing.assert_array_equal(result, 0.0)


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("measure", MEASURES)
def test_cross_aggregation_with_a_zero_slot(trained, selection, measure):
    """The regression of issue 17: a zero-initialised slot no client trained."""
    models = [*trained[:3], zeros_like(trained[0])]
    result = cross_aggregate(models, alpha=0.9, selection=selection, round_index=0, measure=measure)
    similarity = cosine_similarity_matrix(models, measure)
    partners = collaborator_indices(4, selection=selection, round_index=0, similarity=similarity)
    for index, model in enumerate(result):
        own, other = models[index], models[partners[index]]
        for name, array in model.items():
            assert np.isfinite(array).all()
            if array.dtype.kind == "f":
                expected = np.float32(0.9) * own[name] + np.float32(0.1) * other[name]
                np.testing.assert_allclose(array, expected, rtol=1e-6, atol=1e-7)
    if selection == "lowest_similarity":
        # Against the zero model every similarity is 0, below the others'
        # positive ones here, so every other model picks it, and it picks
        # the lowest index among its ties.
        assert partners[3] == 0


def test_mutation_of_zero_models_and_of_no_update(trained):
    zero = zeros_like(trained[0])
    for model in mutate(zero, zero, np.random.default_rng(0), k=4, alpha=4.0, beta=0.3):
        assert_same_model(model, zero)
    # Identical global models: no update, so every mutation is the global model.
    for model in mutate(trained[0], trained[0], np.random.default_rng(0), k=3, alpha=4.0):
        assert_same_model(model, trained[0])


def test_average_of_zero_models_is_zero(trained):
    zero = zeros_like(trained[0])
    assert_same_model(average([zero, zero, zero]), zero)
    assert_same_model(average([zero, zero], weights=[3, 1]), zero)


# --- identical models -----------------------------------------------------------


@pytest.mark.parametrize("measure", MEASURES)
def test_identical_models_have_similarity_one_per_term(trained, measure):
    models = [trained[0]] * 3
    result = cosine_similarity_matrix(models, measure)
    terms = 1 if measure == "model" else 6  # five pairs and a trailing single entry
    np.testing.assert_allclose(result, terms, rtol=1e-6)


@pytest.mark.parametrize("selection", SELECTIONS)
def test_cross_aggregation_of_identical_models_gives_them_back(trained, selection):
    models = [trained[1]] * 3
    result = cross_aggregate(models, alpha=0.99, selection=selection, round_index=2)
    for model in result:
        assert_same_model(model, trained[1], rtol=1e-6)
    # Exact ties go to the lowest other index.
    if selection != "in_order":
        assert collaborator_indices(
            3, selection=selection, round_index=0, similarity=np.ones((3, 3))
        ) == [1, 0, 0]


def test_average_and_recombination_of_identical_models(trained):
    models = [trained[2]] * 4
    assert_same_model(average(models), trained[2], rtol=1e-6)
    assert_same_model(average(models, weights=[1, 2, 3, 4]), trained[2], rtol=1e-6)
    for model in recombine(models, np.random.default_rng(0)):
        assert_same_model(model, trained[2])


# --- one trained slot among untouched copies ------------------------------------


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("measure", MEASURES)
def test_one_trained_slot_among_copies_of_the_dispatched_model(trained, selection, measure):
    dispatched, moved = trained[0], trained[1]
    models = [dispatched, dispatched, moved, dispatched]
    similarity = cosine_similarity_matrix(models, measure)
    partners = collaborator_indices(4, selection=selection, round_index=0, similarity=similarity)
    copies = {0, 1, 3}
    if selection == "lowest_similarity":
        # The copies pick the trained model; it picks one of the copies.
        assert [partners[i] for i in sorted(copies)] == [2, 2, 2] and partners[2] in copies
    if selection == "highest_similarity":
        # The copies pick each other.
        assert all(partners[i] in copies - {i} for i in copies)
    result = cross_aggregate(models, alpha=0.9, selection=selection, round_index=0, measure=measure)
    assert all(np.isfinite(a).all() for model in result for a in model.values())


# --- K = 1 and K = 2 --------------------------------------------------------------


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("propeller", [False, True])
def test_cross_aggregation_of_one_model_returns_a_copy(trained, selection, propeller):
    [result] = cross_aggregate(
        [trained[0]], alpha=0.9, selection=selection, round_index=3, propeller=propeller
    )
    assert_same_model(result, trained[0])
    for name, array in result.items():
        if array.dtype.kind == "f":
            assert not np.shares_memory(array, trained[0][name])
    assert collaborator_indices(1, selection=selection, round_index=3) == [0]
    assert cross_aggregate([], alpha=0.9, selection=selection, round_index=0) == []


@pytest.mark.parametrize("measure", MEASURES)
def test_one_and_two_models(trained, measure):
    one = cosine_similarity_matrix([trained[0]], measure)
    assert one.shape == (1, 1) and one[0, 0] == (1.0 if measure == "model" else 6.0)
    two = cosine_similarity_matrix(trained[:2], measure)
    assert two.shape == (2, 2) and two[0, 1] == two[1, 0]
    for selection in SELECTIONS:
        assert collaborator_indices(2, selection=selection, round_index=5, similarity=two) == [1, 0]
    assert_same_model(average([trained[0]]), trained[0])
    assert_same_model(average([trained[0]], weights=[5.0]), trained[0])
    [only] = recombine([trained[0]], np.random.default_rng(0))
    assert only is not trained[0] and all(only[n] is trained[0][n] for n in only)
    [alone] = mutate(trained[0], trained[1], np.random.default_rng(0), k=1, alpha=4.0)
    assert_same_model(alone, trained[0])


def test_fedme_with_two_clients_exchanges_both_ways(trained):
    assert assign_exchanges([0, 0], np.random.default_rng(0)) == [1, 0]
    assert assign_exchanges([0, 1], np.random.default_rng(0)) == [1, 0]
    result = fedme_aggregate(trained[:2], [trained[2], trained[3]], [1, 0])
    # Model 0 comes back with client 1's copy of it (trained[3]) and vice versa.
    expected = average([trained[0], trained[3]])
    assert_same_model(result[0], expected)
    with pytest.raises(ValueError, match="at least two models"):
        assign_exchanges([0], np.random.default_rng(0))  # nobody to exchange with
