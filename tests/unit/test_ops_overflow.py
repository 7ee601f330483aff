"""Finite inputs never become NaN or Inf on the server (issue 17, item 2).

Replies of large but finite float32 values (a diverging run, a client that
scales its update) pass validation; the plain float32 sum of two of them
overflows. Every operation must still return finite values, equal to the
exact result where that is representable, saturated at the dtype's largest
value where it is not (a mutation beyond the range).
"""

import numpy as np
import pytest

from fedx.ops import aggregation as aggregation_module
from fedx.ops import average, cosine_similarity_matrix, cross_aggregate, fedme_aggregate, mutate

LARGE32 = np.float32(3e38)
MAX32 = np.finfo(np.float32).max
MAX64 = np.finfo(np.float64).max


def huge_models(count: int, dtype=np.float32, value: float = 3e38, size: int = 1000) -> list[dict]:
    """Models near the top of the dtype's range, some elements negative, an int counter."""
    rng = np.random.default_rng(0)
    models = []
    for _ in range(count):
        signs = np.where(rng.random(size) < 0.2, -1.0, 1.0)
        factors = rng.uniform(0.9, 1.0, size)
        models.append(
            {
                "w": (value * signs * factors).astype(dtype),
                "b": np.full(3, value, dtype=dtype),
                "count": np.array(2**62, dtype=np.int64),
            }
        )
    return models


def exact_mean(models: list[dict], name: str, weights=None) -> np.ndarray:
    stacked = np.stack([m[name].astype(np.longdouble) for m in models])
    weights = np.ones(len(models)) if weights is None else np.asarray(weights, dtype=np.float64)
    weights = weights / weights.max()
    return np.tensordot(weights.astype(np.longdouble), stacked, axes=1) / weights.sum()


def assert_finite(model: dict) -> None:
    for name, array in model.items():
        assert np.isfinite(array).all(), f"{name} is not finite"


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 elements, so the safe path is taken block by block."""
    monkeypatch.setattr(aggregation_module, "_BLOCK", 64)


@pytest.mark.parametrize(
    "weights",
    [None, [1.0, 2.0, 3.0], [1e308, 1e308, 1e308]],
    ids=["plain", "weighted", "huge-weights"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_mean_of_huge_finite_models_is_finite_and_exact(weights, dtype):
    value = {np.float32: 3e38, np.float64: 1.7e308, np.float16: 6e4}[dtype]
    models = huge_models(3, dtype=dtype, value=value)
    with np.errstate(over="ignore"):  # the naive sum overflows
        assert not np.isfinite(models[0]["b"] + models[1]["b"]).all()
    result = average(models, weights=weights)
    assert_finite(result)
    for name in ("w", "b"):
        assert result[name].dtype == dtype
        # Rounding of the terms, relative to the largest of them (some cancel).
        np.testing.assert_allclose(
            result[name].astype(np.longdouble),
            exact_mean(models, name, weights),
            rtol=0,
            atol=4 * np.finfo(dtype).eps * value,
        )
    assert result["count"] == 2**62


@pytest.mark.usefixtures("small_blocks")
def test_only_the_blocks_that_overflow_take_the_safe_path():
    models = huge_models(2, size=1000)
    for model in models:
        model["w"][:500] = 1.5  # a harmless first half
    result = average(models)
    np.testing.assert_array_equal(result["w"][:500], np.float32(1.5))
    np.testing.assert_allclose(result["w"][500:], exact_mean(models, "w")[500:], rtol=1e-6)


def test_means_at_the_very_top_of_the_range_saturate_at_the_largest_value():
    models = [{"w": np.full(10, MAX32)} for _ in range(3)]
    for weights in (None, [1, 1, 1], [1, 2, 3]):
        result = average(models, weights=weights)["w"]
        assert np.isfinite(result).all()
        np.testing.assert_array_equal(result, MAX32)


def test_non_finite_inputs_still_give_non_finite_means():
    """The safe path keeps garbage visible: it does not turn Inf or NaN into numbers."""
    models = huge_models(2)
    models[0]["w"][3] = np.inf
    models[1]["w"][4] = np.nan
    result = average(models)["w"]
    assert np.isinf(result[3]) and np.isnan(result[4])
    assert np.isfinite(np.delete(result, [3, 4])).all()


def test_integer_means_stay_in_range():
    models = [{"count": np.array(np.iinfo(np.int64).max)} for _ in range(3)]
    result = average(models)["count"]
    assert result.dtype == np.int64 and result > 2**62


@pytest.mark.parametrize("selection", ["in_order", "lowest_similarity", "highest_similarity"])
@pytest.mark.parametrize("measure", ["model", "layer-pairs"])
@pytest.mark.parametrize("propeller", [False, True])
def test_cross_aggregation_of_huge_models_is_finite(selection, measure, propeller):
    models = huge_models(4)
    # alpha = 0.5: the blend is the plain mean of two models, whose sum overflows.
    result = cross_aggregate(
        models, alpha=0.5, selection=selection, round_index=0, measure=measure, propeller=propeller
    )
    for model in result:
        assert_finite(model)
        assert np.all(np.abs(model["b"]) > 2.9e38)


@pytest.mark.parametrize("measure", ["model", "layer-pairs"])
def test_similarity_of_huge_models_is_that_of_the_scaled_down_models(measure):
    models = huge_models(4)
    scaled = [
        {n: (a / np.float32(1e38) if a.dtype.kind == "f" else a) for n, a in m.items()}
        for m in models
    ]
    result = cosine_similarity_matrix(models, measure)
    np.testing.assert_allclose(result, cosine_similarity_matrix(scaled, measure), atol=1e-6)
    wide = [
        {n: a.astype(np.float64) * 1e268 if a.dtype.kind == "f" else a for n, a in m.items()}
        for m in models
    ]
    np.testing.assert_allclose(cosine_similarity_matrix(wide, measure), result, atol=1e-6)


def test_fedme_aggregation_of_huge_models_is_finite():
    models = huge_models(3)
    result = fedme_aggregate(models, [models[1], models[2], models[0]], [2, 0, 1])
    for model in result:
        assert_finite(model)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mutation_beyond_the_range_saturates(dtype):
    largest = np.finfo(dtype).max
    current = {
        "w": np.array([0.9, -0.9, 0.5, 1e-3], dtype=dtype) * largest,
        "count": np.array(3, dtype=np.int64),
    }
    previous = {
        "w": np.array([-0.9, 0.9, 0.5, -1e-3], dtype=dtype) * largest,
        "count": np.array(2, dtype=np.int64),
    }
    mutated = mutate(current, previous, np.random.default_rng(0), k=4, alpha=4.0, beta=0.0)
    forward = next(m for m in mutated if m["w"][0] > 0 and m["w"][3] > current["w"][3])
    backward = next(m for m in mutated if m["w"][0] < 0)
    for model in mutated:
        assert_finite(model)
    # w + 4 g and w - 4 g, g = w - previous: the first two leave the range.
    np.testing.assert_array_equal(forward["w"][:3], [largest, -largest, 0.5 * largest])
    np.testing.assert_array_equal(backward["w"][:3], [-largest, largest, 0.5 * largest])
    # The last element stays in range: exact, 1e-3 * (1 + 4 * 2) and 1e-3 * (1 - 4 * 2).
    np.testing.assert_allclose(forward["w"][3], 9e-3 * largest, rtol=1e-6)
    np.testing.assert_allclose(backward["w"][3], -7e-3 * largest, rtol=1e-6)


def test_mutation_whose_update_overflows_but_whose_result_does_not():
    """g = w - previous overflows float32; w + 0.25 g (alpha 0.25) does not."""
    current = {"w": np.array([3e38], dtype=np.float32)}
    previous = {"w": np.array([-3e38], dtype=np.float32)}
    mutated = mutate(current, previous, np.random.default_rng(0), k=2, alpha=0.25, beta=0.0)
    values = sorted(float(m["w"][0]) for m in mutated)
    np.testing.assert_allclose(values, [3e38 - 0.25 * 6e38, MAX32], rtol=1e-6)


def test_a_scalar_layer_that_overflows_saturates():
    """A 0-d float layer (a scalar parameter) whose mutation overflows (found by hypothesis)."""
    center = {"temperature": np.array(np.float32(1.7e38))}
    previous = {"temperature": np.array(np.float32(0.0))}
    mutated = mutate(center, previous, np.random.default_rng(0), k=2, alpha=2.0)
    values = sorted(float(model["temperature"]) for model in mutated)
    # w + 2g = 5.1e38 saturates at float32's largest; w - 2g = -1.7e38 fits.
    assert values == [float(np.float32(-1.7e38)), float(np.finfo(np.float32).max)]
    assert all(model["temperature"].shape == () for model in mutated)
