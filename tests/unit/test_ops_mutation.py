"""Tests for FedMut's model mutation (fedx.ops.mutation)."""

import copy

import numpy as np
import pytest

from fedx.ops import dynamic_beta, mutate

# Shapes of a small CNN with BatchNorm: conv, BN (with its int64 counter),
# another conv and a linear head. Eight float tensors, one integer tensor.
SHAPES = {
    "conv1.weight": (8, 3, 3, 3),
    "conv1.bias": (8,),
    "bn1.weight": (8,),
    "bn1.bias": (8,),
    "bn1.running_mean": (8,),
    "bn1.running_var": (8,),
    "bn1.num_batches_tracked": (),
    "conv2.weight": (16, 8, 3, 3),
    "fc.weight": (10, 64),
}
FLOAT_NAMES = [name for name in SHAPES if name != "bn1.num_batches_tracked"]


def random_model(rng: np.random.Generator, dtype=np.float32, batches: int = 7) -> dict:
    model = {}
    for name, shape in SHAPES.items():
        if name.endswith("num_batches_tracked"):
            model[name] = np.array(batches, dtype=np.int64)
        else:
            model[name] = rng.standard_normal(shape).astype(dtype)
    return model


@pytest.fixture
def pair() -> tuple[dict, dict]:
    """A global model and a previous global model a small step away."""
    rng = np.random.default_rng(1)
    previous = random_model(rng, batches=3)
    step = random_model(rng)
    current = {
        name: previous[name] + np.float32(0.1) * step[name]
        if name in FLOAT_NAMES
        else np.array(11, dtype=np.int64)
        for name in SHAPES
    }
    return current, previous


def coefficient(mutated: np.ndarray, current: np.ndarray, previous: np.ndarray) -> float:
    """The scalar c with mutated = current + c * (current - previous), least squares."""
    update = current.astype(np.float64) - previous.astype(np.float64)
    offset = mutated.astype(np.float64) - current.astype(np.float64)
    return float(np.dot(offset.ravel(), update.ravel()) / np.dot(update.ravel(), update.ravel()))


def coefficients(models: list[dict], current: dict, previous: dict) -> np.ndarray:
    """Matrix [model, float layer] of mutation coefficients alpha * v."""
    return np.array(
        [
            [coefficient(model[name], current[name], previous[name]) for name in FLOAT_NAMES]
            for model in models
        ]
    )


def test_returns_k_models_with_global_names_and_dtypes(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(0), k=6, alpha=4.0)
    assert len(models) == 6
    for model in models:
        assert list(model) == list(current)
        for name, array in model.items():
            assert array.shape == current[name].shape
            assert array.dtype == current[name].dtype


def test_float64_models_stay_float64():
    rng = np.random.default_rng(2)
    current, previous = random_model(rng, np.float64), random_model(rng, np.float64)
    models = mutate(current, previous, rng, k=4, alpha=1.0)
    assert all(model["fc.weight"].dtype == np.float64 for model in models)


@pytest.mark.parametrize("k", [2, 4, 10])
def test_beta_zero_mean_of_mutated_models_is_global(pair, k):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(0), k=k, alpha=4.0)
    for name in FLOAT_NAMES:
        mean = np.mean([model[name].astype(np.float64) for model in models], axis=0)
        # Only float32 rounding of global +- alpha * g separates the two.
        np.testing.assert_allclose(mean, current[name], rtol=0, atol=1e-6)


def test_beta_zero_each_layer_is_alpha_times_update_norm_away(pair):
    current, previous = pair
    alpha = 4.0
    models = mutate(current, previous, np.random.default_rng(0), k=6, alpha=alpha)
    for model in models:
        for name in FLOAT_NAMES:
            update = current[name].astype(np.float64) - previous[name]
            distance = np.linalg.norm(model[name].astype(np.float64) - current[name])
            assert distance == pytest.approx(alpha * np.linalg.norm(update), rel=1e-5)


@pytest.mark.parametrize("k", [2, 6, 8])
def test_signs_are_balanced_in_every_layer(pair, k):
    current, previous = pair
    alpha = 4.0
    models = mutate(current, previous, np.random.default_rng(3), k=k, alpha=alpha)
    values = coefficients(models, current, previous) / alpha
    np.testing.assert_allclose(np.abs(values), 1.0, atol=1e-5)
    signs = np.sign(values)
    assert (signs == 1).sum(axis=0).tolist() == [k // 2] * len(FLOAT_NAMES)
    assert (signs == -1).sum(axis=0).tolist() == [k // 2] * len(FLOAT_NAMES)


def test_layers_are_shuffled_independently(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(4), k=8, alpha=1.0)
    signs = np.sign(coefficients(models, current, previous))
    patterns = {tuple(signs[:, layer]) for layer in range(signs.shape[1])}
    # Eight layers that all drew one of the 70 balanced patterns would mean
    # a single shuffle for the whole model.
    assert len(patterns) > 1
    # Models differ from each other too (each model is not all +1 or all -1).
    assert len({tuple(row) for row in signs}) > 1


def test_odd_k_appends_the_unmutated_global(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(5), k=5, alpha=4.0)
    assert len(models) == 5
    for name in SHAPES:
        np.testing.assert_array_equal(models[-1][name], current[name])
    signs = np.sign(coefficients(models[:4], current, previous))
    assert (signs == 1).sum(axis=0).tolist() == [2] * len(FLOAT_NAMES)
    assert (signs == -1).sum(axis=0).tolist() == [2] * len(FLOAT_NAMES)


def test_k_one_returns_only_the_global(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(5), k=1, alpha=4.0)
    assert len(models) == 1
    for name in SHAPES:
        np.testing.assert_array_equal(models[0][name], current[name])


def test_positive_beta_turns_minus_one_into_minus_one_plus_beta(pair):
    current, previous = pair
    alpha, beta = 4.0, 0.3
    models = mutate(current, previous, np.random.default_rng(6), k=6, alpha=alpha, beta=beta)
    values = coefficients(models, current, previous) / alpha
    forward = np.isclose(values, 1.0, atol=1e-5)
    backward = np.isclose(values, -1.0 + beta, atol=1e-5)
    assert np.all(forward | backward)
    assert forward.sum(axis=0).tolist() == [3] * len(FLOAT_NAMES)
    assert backward.sum(axis=0).tolist() == [3] * len(FLOAT_NAMES)


def test_beta_one_leaves_half_the_models_at_the_global(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(6), k=4, alpha=2.0, beta=1.0)
    for name in FLOAT_NAMES:
        at_global = [np.array_equal(model[name], current[name]) for model in models]
        assert sum(at_global) == 2


def test_alpha_zero_gives_copies_of_the_global(pair):
    current, previous = pair
    for model in mutate(current, previous, np.random.default_rng(0), k=4, alpha=0.0):
        for name in SHAPES:
            np.testing.assert_array_equal(model[name], current[name])


def test_integer_tensors_are_the_globals(pair):
    current, previous = pair
    assert previous["bn1.num_batches_tracked"] != current["bn1.num_batches_tracked"]
    for model in mutate(current, previous, np.random.default_rng(0), k=5, alpha=4.0, beta=0.5):
        tracked = model["bn1.num_batches_tracked"]
        assert tracked.dtype == np.int64
        assert tracked == current["bn1.num_batches_tracked"]


def test_inputs_are_not_modified(pair):
    current, previous = pair
    current_before, previous_before = copy.deepcopy(current), copy.deepcopy(previous)
    mutate(current, previous, np.random.default_rng(0), k=7, alpha=4.0, beta=0.3)
    for name in SHAPES:
        np.testing.assert_array_equal(current[name], current_before[name])
        np.testing.assert_array_equal(previous[name], previous_before[name])


def test_models_share_two_arrays_per_layer_and_none_with_the_inputs(pair):
    current, previous = pair
    models = mutate(current, previous, np.random.default_rng(0), k=10, alpha=4.0)
    for name in FLOAT_NAMES:
        distinct = {id(model[name]) for model in models}
        assert len(distinct) == 2
        assert not any(np.shares_memory(model[name], current[name]) for model in models)
        assert not any(np.shares_memory(model[name], previous[name]) for model in models)


def test_same_seed_same_models(pair):
    current, previous = pair
    first = mutate(current, previous, np.random.default_rng(9), k=6, alpha=4.0)
    second = mutate(current, previous, np.random.default_rng(9), k=6, alpha=4.0)
    for a, b in zip(first, second, strict=True):
        for name in SHAPES:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"k": 0, "alpha": 4.0}, "k must be an integer >= 1, got 0"),
        ({"k": 2.5, "alpha": 4.0}, "k must be an integer >= 1, got 2.5"),
        ({"k": 4, "alpha": -1.0}, r"alpha must be finite and >= 0, got -1.0"),
        ({"k": 4, "alpha": float("nan")}, "alpha must be finite and >= 0, got nan"),
        ({"k": 4, "alpha": 4.0, "beta": 1.5}, r"beta must be in \[0, 1\], got 1.5"),
        ({"k": 4, "alpha": 4.0, "beta": -0.1}, r"beta must be in \[0, 1\], got -0.1"),
    ],
)
def test_bad_arguments_are_rejected(pair, arguments, message):
    current, previous = pair
    with pytest.raises(ValueError, match=message):
        mutate(current, previous, np.random.default_rng(0), **arguments)


def test_layout_mismatch_is_rejected(pair):
    current, previous = pair
    renamed = {("head.weight" if name == "fc.weight" else name): a for name, a in previous.items()}
    with pytest.raises(
        ValueError, match=r"previous_global does not match global_model: names differ"
    ):
        mutate(current, renamed, np.random.default_rng(0), k=2, alpha=1.0)
    reshaped = dict(previous, **{"fc.weight": previous["fc.weight"].reshape(64, 10)})
    with pytest.raises(ValueError, match=r"fc.weight: shape \(64, 10\), expected \(10, 64\)"):
        mutate(current, reshaped, np.random.default_rng(0), k=2, alpha=1.0)


@pytest.mark.parametrize(
    ("round_index", "expected"), [(0, 0.3), (50, 0.15), (100, 0.0), (150, 0.0), (25, 0.225)]
)
def test_dynamic_beta_falls_linearly_to_zero(round_index, expected):
    assert dynamic_beta(0.3, round_index, 100) == pytest.approx(expected, abs=1e-12)


def test_dynamic_beta_rejects_bad_arguments():
    with pytest.raises(ValueError, match="beta0"):
        dynamic_beta(1.2, 0, 100)
    with pytest.raises(ValueError, match="round_index"):
        dynamic_beta(0.3, -1, 100)
    with pytest.raises(ValueError, match="beta_rounds"):
        dynamic_beta(0.3, 0, 0)
