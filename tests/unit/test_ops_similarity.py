"""Tests for the similarity measures behind FedCross's collaborator selection.

The reference values are computed here directly, entry by entry in float64,
without the library's Gram matrices.
"""

import numpy as np
import pytest

from fedx.ops import cosine_similarity_matrix, cross_aggregate, similarity_terms
from fedx.ops import parallel as parallel_module
from fedx.ops import similarity as similarity_module
from tests.support.helpers import make_model


def direct_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Cosine of two float64 vectors; 0 if either is zero (PyTorch's value)."""
    norms = np.linalg.norm(x) * np.linalg.norm(y)
    return float(np.dot(x, y) / norms) if norms > 0 else 0.0


def authors_layer_pairs(a: dict, b: dict) -> float:
    """The authors' ``sim`` for one pair of models, transcribed from its description.

    Walk the state dict; at every odd position the current pair (the entry
    before and this one, concatenated) adds its cosine; after the loop the
    pair in hand (the last pair, or a trailing single entry) adds its cosine
    once more. Every entry counts, integer buffers as floats.
    """
    total = 0.0
    pair_a = pair_b = None
    for position, name in enumerate(a):
        x = a[name].astype(np.float64).ravel()
        y = b[name].astype(np.float64).ravel()
        if position % 2 == 0:
            pair_a, pair_b = x, y
        else:
            pair_a, pair_b = np.concatenate([pair_a, x]), np.concatenate([pair_b, y])
            total += direct_cosine(pair_a, pair_b)
    return total + direct_cosine(pair_a, pair_b)


def related_models(count: int, seed: int = 0, drop: tuple[str, ...] = ()) -> list[dict]:
    """Models around a shared one, so that the similarities are spread out."""
    rng = np.random.default_rng(seed)
    base = make_model(rng)
    models = []
    for index in range(count):
        noise = make_model(rng)
        model = {
            name: (array + (0.3 + index) * noise[name]).astype(array.dtype)
            if array.dtype.kind == "f"
            else noise[name]
            for name, array in base.items()
            if name not in drop
        }
        models.append(model)
    return models


# --- layer-pairs: the authors' quantity -----------------------------------


@pytest.mark.parametrize(
    "drop",
    [(), ("fc2.bias",)],
    ids=["odd-entry-count-trailing-single", "even-entry-count-last-pair-twice"],
)
def test_layer_pairs_match_the_authors_sum_entry_by_entry(drop):
    models = related_models(5, drop=drop)
    result = cosine_similarity_matrix(models, measure="layer-pairs")
    for i, a in enumerate(models):
        for j, b in enumerate(models):
            if i != j:
                assert result[i, j] == pytest.approx(authors_layer_pairs(a, b), abs=1e-6)
    np.testing.assert_array_equal(result, result.T)


def test_layer_pair_terms_cross_module_boundaries_and_count_the_end_right():
    model = make_model(np.random.default_rng(0))  # 11 entries, BatchNorm in the middle
    terms = similarity_terms(model, "layer-pairs")
    assert terms == [
        (("conv1.weight", "conv1.bias"), 1),
        (("bn1.weight", "bn1.bias"), 1),
        (("bn1.running_mean", "bn1.running_var"), 1),
        (("bn1.num_batches_tracked", "fc1.weight"), 1),  # the counter pairs with the next layer
        (("fc1.bias", "fc2.weight"), 1),
        (("fc2.bias",), 1),  # trailing single entry: once
    ]
    even = dict(list(model.items())[:-1])
    assert similarity_terms(even, "layer-pairs")[-1] == (("fc1.bias", "fc2.weight"), 2)
    assert similarity_terms(model, "model") == [
        (tuple(n for n in model if n != "bn1.num_batches_tracked"), 1)
    ]


def test_layer_pairs_count_integer_buffers_and_the_model_measure_does_not():
    models = related_models(3)
    changed = [dict(model) for model in models]
    changed[1]["bn1.num_batches_tracked"] = np.array(10**6, dtype=np.int64)
    np.testing.assert_array_equal(
        cosine_similarity_matrix(models), cosine_similarity_matrix(changed)
    )
    before = cosine_similarity_matrix(models, measure="layer-pairs")
    after = cosine_similarity_matrix(changed, measure="layer-pairs")
    assert not np.allclose(before[1], after[1])
    assert after[0, 1] == pytest.approx(authors_layer_pairs(changed[0], changed[1]), abs=1e-6)


def test_layer_pairs_diagonal_counts_the_non_zero_terms():
    models = related_models(3)
    # Five pairs and a trailing single entry, all of non-zero norm.
    np.testing.assert_array_equal(np.diag(cosine_similarity_matrix(models, "layer-pairs")), 6.0)
    models[2] = dict(
        models[2],
        **{
            "conv1.weight": np.zeros((4, 1, 3, 3), np.float32),
            "conv1.bias": np.zeros(4, np.float32),
        },
    )
    result = cosine_similarity_matrix(models, "layer-pairs")
    assert result[2, 2] == 5.0
    assert result[0, 2] == pytest.approx(authors_layer_pairs(models[0], models[2]), abs=1e-6)


def test_cross_aggregate_uses_the_requested_measure():
    """Models whose layer-pair and whole-model rankings disagree pick differently."""
    rng = np.random.default_rng(5)
    # One big tensor dominates the whole-model cosine; four small pairs
    # dominate the layer-pair sum.
    names = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
    shapes = [(400,), (1,), (3,), (1,), (3,), (1,)]
    base = {n: rng.normal(size=s).astype(np.float32) for n, s in zip(names, shapes, strict=True)}
    flipped = {n: (-a if n != "a.weight" else a.copy()) for n, a in base.items()}
    big_flipped = {n: (-a if n == "a.weight" else a.copy()) for n, a in base.items()}
    models = [base, flipped, big_flipped]
    by_model = cosine_similarity_matrix(models, "model")
    by_pairs = cosine_similarity_matrix(models, "layer-pairs")
    assert np.argmin(by_model[0, 1:]) + 1 == 2  # the big tensor flipped is least similar
    assert np.argmin(by_pairs[0, 1:]) + 1 == 1  # the small pairs flipped are
    for measure, expected_partner in (("model", 2), ("layer-pairs", 1)):
        result = cross_aggregate(
            models, alpha=0.9, selection="lowest_similarity", round_index=0, measure=measure
        )
        expected = 0.9 * base["b.weight"] + 0.1 * models[expected_partner]["b.weight"]
        np.testing.assert_allclose(result[0]["b.weight"], expected, rtol=1e-6)


# --- the float32 fast path: same values to float32 rounding -------------------


@pytest.fixture
def small_blocks(monkeypatch):
    """Staging blocks of 40 elements and tasks of 100, so small models cross both."""
    monkeypatch.setattr(similarity_module, "_STAGING_BYTES", 4 * 40 * 6)
    monkeypatch.setattr(similarity_module, "_CHUNK", 100)


def float32_models(count: int, seed: int = 0, scale: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(1000)
    models = []
    for index in range(count):
        models.append(
            {
                "w": (scale * (shared + (0.2 + 0.3 * index) * rng.standard_normal(1000)))
                .astype(np.float32)
                .reshape(10, 100),
                "b": (scale * rng.standard_normal(37)).astype(np.float32),
                "steps": np.array(index, dtype=np.int64),
            }
        )
    return models


def float64_reference(models: list[dict]) -> np.ndarray:
    vectors = [
        np.concatenate([m["w"].astype(np.float64).ravel(), m["b"].astype(np.float64)])
        for m in models
    ]
    return np.array([[direct_cosine(x, y) for y in vectors] for x in vectors])


@pytest.mark.usefixtures("small_blocks")
def test_float32_blocks_match_a_float64_computation():
    models = float32_models(6)
    result = cosine_similarity_matrix(models)
    np.testing.assert_allclose(result, float64_reference(models), rtol=0, atol=1e-6)
    # The same collaborators as the float64 similarity.
    reference = float64_reference(models)
    np.fill_diagonal(reference, np.inf)
    checked = result.copy()
    np.fill_diagonal(checked, np.inf)
    np.testing.assert_array_equal(np.argmin(checked, axis=1), np.argmin(reference, axis=1))


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("measure", ["model", "layer-pairs"])
def test_the_result_does_not_depend_on_the_number_of_threads(monkeypatch, measure):
    models = float32_models(5)
    monkeypatch.setattr(similarity_module, "_PARALLEL_WORK", 0)
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel_module, "thread_count", lambda threads=threads: threads)
        results.append(cosine_similarity_matrix(models, measure))
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("scale", [1e-30, 1e-21, 1e30, 3e37], ids=str)
def test_float32_models_far_from_one_keep_their_cosines(scale):
    """Squares that underflow or overflow float32 are redone in float64."""
    models = float32_models(4, scale=scale)
    np.testing.assert_allclose(
        cosine_similarity_matrix(models), float64_reference(models), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("scale", [1e-300, 1e300], ids=str)
def test_float64_models_far_from_one_keep_their_cosines(scale):
    """float64 squares would underflow or overflow: the models are scaled first."""
    models = [
        {
            name: (a.astype(np.float64) * scale if a.dtype.kind == "f" else a)
            for name, a in model.items()
        }
        for model in float32_models(4)
    ]
    expected = float64_reference(
        [{n: a / scale if a.dtype.kind == "f" else a for n, a in m.items()} for m in models]
    )
    np.testing.assert_allclose(cosine_similarity_matrix(models), expected, rtol=0, atol=1e-12)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("selection", ["lowest_similarity", "highest_similarity"])
def test_cross_aggregation_of_float32_models_matches_the_float64_computation(selection):
    """The float32 Gram blocks give the collaborators and models of a float64 computation."""
    models = float32_models(6, seed=4)
    reference = float64_reference(models)
    np.fill_diagonal(reference, np.nan)
    pick = np.nanargmin if selection == "lowest_similarity" else np.nanargmax
    partners = [int(pick(row)) for row in reference]
    result = cross_aggregate(models, alpha=0.99, selection=selection, round_index=0)
    for index, model in enumerate(result):
        for name in ("w", "b"):
            expected = 0.99 * models[index][name].astype(np.float64) + 0.01 * models[
                partners[index]
            ][name].astype(np.float64)
            np.testing.assert_allclose(model[name], expected, rtol=1e-6, atol=1e-6)
        assert model["steps"] == models[index]["steps"]
