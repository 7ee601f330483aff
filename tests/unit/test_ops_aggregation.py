"""Averaging and reply validation on real arrays."""

import copy

import numpy as np
import pytest

from fedx.ops import average, find_problem


def test_plain_mean(models):
    result = average(models)
    for name, array in result.items():
        if name.endswith("num_batches_tracked"):
            continue
        expected = np.mean([m[name].astype(np.float64) for m in models], axis=0)
        np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)
        assert array.dtype == models[0][name].dtype


@pytest.mark.parametrize("weights", [None, [1, 2, 3, 4, 5, 6]])
def test_results_are_arrays_even_for_zero_dim_tensors(models, weights):
    result = average(models, weights)
    assert all(isinstance(a, np.ndarray) for a in result.values())
    assert result["bn1.num_batches_tracked"].shape == ()


def test_weighted_mean_matches_formula_and_keeps_inputs(models):
    snapshot = copy.deepcopy(models)
    weights = [1, 5, 2, 0, 7, 3]
    result = average(models, weights)
    total = sum(weights)
    for name in models[0]:
        expected = sum(
            w / total * m[name].astype(np.float64) for w, m in zip(weights, models, strict=True)
        )
        if np.issubdtype(models[0][name].dtype, np.integer):
            assert result[name] == np.rint(expected).astype(np.int64)
        else:
            np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)
    for before, after in zip(snapshot, models, strict=True):
        for name in before:
            np.testing.assert_array_equal(before[name], after[name])


def test_weighted_mean_of_large_tensor_crosses_blocks():
    rng = np.random.default_rng(0)
    big = [{"w": rng.normal(size=(300, 701)).astype(np.float32)} for _ in range(3)]
    result = average(big, [1.0, 2.0, 3.0])
    expected = (big[0]["w"] + 2 * big[1]["w"] + 3 * big[2]["w"]) / 6
    np.testing.assert_allclose(result["w"], expected, rtol=1e-5, atol=1e-6)


def test_bad_weights_are_rejected(models):
    with pytest.raises(ValueError, match="weights"):
        average(models, [1.0] * 5)
    with pytest.raises(ValueError, match="non-negative"):
        average(models, [1.0, -1.0, 1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="at least one"):
        average([])


def test_find_problem_accepts_a_matching_model(models):
    assert find_problem(models[0], models[1]) is None


@pytest.mark.parametrize(
    "corrupt, reason",
    [
        (lambda m: m.pop("fc2.bias"), "names differ"),
        (lambda m: m.update({"extra": np.zeros(1, np.float32)}), "names differ"),
        (lambda m: m.update({"fc1.weight": np.zeros((16, 8), np.float32)}), "shape"),
        (lambda m: m.update({"fc1.bias": m["fc1.bias"].astype(np.float64)}), "dtype"),
        (lambda m: m["fc2.weight"].__setitem__((0, 0), np.nan), "NaN"),
        (lambda m: m["conv1.bias"].__setitem__(0, np.inf), "NaN or Inf"),
    ],
)
def test_find_problem_names_what_is_wrong(models, corrupt, reason):
    received = copy.deepcopy(models[1])
    corrupt(received)
    problem = find_problem(models[0], received)
    assert problem is not None and reason in problem
