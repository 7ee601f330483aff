"""Tests for FedCross's collaborator selection and cross aggregation."""

import copy

import numpy as np
import pytest

from fedx.ops import SELECTIONS, collaborator_indices, cosine_similarity_matrix, cross_aggregate
from fedx.ops import aggregation as aggregation_module
from fedx.ops import parallel as parallel_module
from fedx.ops import similarity as similarity_module

# A float32 conv and BN, an int64 BN counter that similarity must ignore,
# a float64 tensor, and a tensor larger than the ops' internal block sizes.
SHAPES = {
    "conv.weight": (6, 3, 3, 3),
    "conv.bias": (6,),
    "bn.running_mean": (6,),
    "bn.num_batches_tracked": (),
    "proj.weight": (20, 7),
    "big.weight": (300, 300),
}
FLOAT_NAMES = [name for name in SHAPES if name != "bn.num_batches_tracked"]


def random_model(rng: np.random.Generator, index: int) -> dict:
    model = {}
    for name, shape in SHAPES.items():
        if name == "bn.num_batches_tracked":
            # Large and different per model: it would dominate any similarity
            # that did not ignore it.
            model[name] = np.array(10**6 * (index + 1), dtype=np.int64)
        elif name == "proj.weight":
            model[name] = rng.standard_normal(shape)  # float64
        else:
            model[name] = rng.standard_normal(shape).astype(np.float32)
    return model


def random_models(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [random_model(rng, index) for index in range(count)]


def flat_floats(model: dict) -> np.ndarray:
    return np.concatenate([model[name].astype(np.float64).ravel() for name in FLOAT_NAMES])


def direct_cosine(a: dict, b: dict) -> float:
    x, y = flat_floats(a), flat_floats(b)
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))


# --- cosine_similarity_matrix -------------------------------------------------


def test_similarity_matches_direct_pairwise_cosine():
    models = random_models(5)
    # Correlated models, so the entries are not all near zero.
    for index, model in enumerate(models[1:], start=1):
        for name in FLOAT_NAMES:
            model[name] = (models[0][name] + 0.5 * index * model[name]).astype(model[name].dtype)
    similarity = cosine_similarity_matrix(models)
    assert similarity.dtype == np.float64
    assert similarity.shape == (5, 5)
    expected = np.array([[direct_cosine(a, b) for b in models] for a in models])
    np.testing.assert_allclose(similarity, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(similarity, similarity.T)


def test_similarity_ignores_integer_tensors():
    models = random_models(3)
    changed = copy.deepcopy(models)
    changed[1]["bn.num_batches_tracked"] = np.array(-(10**9), dtype=np.int64)
    np.testing.assert_array_equal(
        cosine_similarity_matrix(models), cosine_similarity_matrix(changed)
    )


def test_similarity_of_scaled_and_negated_models():
    base = random_models(1)[0]
    scaled = {name: a * 3 if name in FLOAT_NAMES else a for name, a in base.items()}
    negated = {name: -a if name in FLOAT_NAMES else a for name, a in base.items()}
    similarity = cosine_similarity_matrix([base, scaled, negated])
    np.testing.assert_allclose(
        similarity, [[1, 1, -1], [1, 1, -1], [-1, -1, 1]], rtol=0, atol=1e-12
    )


def test_similarity_rejects_empty_input_non_finite_models_and_unknown_measures():
    with pytest.raises(ValueError, match="at least one model"):
        cosine_similarity_matrix([])
    models = random_models(3)
    models[1]["conv.bias"] = models[1]["conv.bias"].copy()
    models[1]["conv.bias"][2] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        cosine_similarity_matrix(models)
    with pytest.raises(ValueError, match="measure must be one of"):
        cosine_similarity_matrix(random_models(2), measure="layers")


def test_similarity_rejects_mismatched_layouts():
    models = random_models(2)
    models[1]["big.weight"] = models[1]["big.weight"][:10]
    with pytest.raises(ValueError, match=r"model 1 does not match model 0: big.weight: shape"):
        cosine_similarity_matrix(models)


# --- collaborator_indices -----------------------------------------------------


@pytest.mark.parametrize(
    ("round_index", "expected"),
    [
        (0, [1, 2, 3, 0]),
        (1, [2, 3, 0, 1]),
        (2, [3, 0, 1, 2]),
        (3, [1, 2, 3, 0]),
        (7, [2, 3, 0, 1]),
    ],
)
def test_in_order_follows_the_formula(round_index, expected):
    assert collaborator_indices(4, selection="in_order", round_index=round_index) == expected


@pytest.mark.parametrize("count", [2, 3, 5, 8])
@pytest.mark.parametrize("first_round", [0, 1, 6])
def test_in_order_meets_every_other_model_once_per_k_minus_one_rounds(count, first_round):
    partners = [
        collaborator_indices(count, selection="in_order", round_index=r)
        for r in range(first_round, first_round + count - 1)
    ]
    for rnd in partners:
        # Every model is someone's collaborator exactly once per round.
        assert sorted(rnd) == list(range(count))
    for index in range(count):
        met = sorted(rnd[index] for rnd in partners)
        assert met == [other for other in range(count) if other != index]


# Rows: model 0 is closest to 2 and farthest from 3; 1 closest to 3, farthest
# from 2; 2 closest to 0, farthest from 3; 3 closest to 1, farthest from 0.
# The diagonal (the largest entry of every row) must never be chosen.
SIMILARITY = np.array(
    [
        [1.0, 0.2, 0.9, -0.5],
        [0.2, 1.0, 0.1, 0.8],
        [0.9, 0.1, 1.0, 0.0],
        [-0.5, 0.8, 0.0, 1.0],
    ]
)


def test_highest_similarity_picks_the_most_similar_other_model():
    assert collaborator_indices(
        4, selection="highest_similarity", round_index=0, similarity=SIMILARITY
    ) == [2, 3, 0, 1]


def test_lowest_similarity_picks_the_least_similar_other_model():
    assert collaborator_indices(
        4, selection="lowest_similarity", round_index=0, similarity=SIMILARITY
    ) == [3, 2, 3, 0]


def test_similarity_selections_never_pick_the_model_itself():
    # Diagonal smaller than everything: a lowest-similarity rule that did not
    # exclude it would pick the model itself, and likewise for highest.
    low_diagonal = SIMILARITY - 10 * np.eye(4)
    high_diagonal = SIMILARITY + 10 * np.eye(4)
    lowest = collaborator_indices(
        4, selection="lowest_similarity", round_index=0, similarity=low_diagonal
    )
    highest = collaborator_indices(
        4, selection="highest_similarity", round_index=0, similarity=high_diagonal
    )
    assert lowest == [3, 2, 3, 0]
    assert highest == [2, 3, 0, 1]
    for picks in (lowest, highest):
        assert all(pick != index for index, pick in enumerate(picks))


def test_similarity_ties_go_to_the_lowest_index():
    uniform = np.full((4, 4), 0.5)
    for selection in ("highest_similarity", "lowest_similarity"):
        assert collaborator_indices(4, selection=selection, round_index=0, similarity=uniform) == [
            1,
            0,
            0,
            0,
        ]


def test_two_models_always_pick_each_other():
    similarity = np.array([[1.0, 0.3], [0.3, 1.0]])
    for selection in SELECTIONS:
        for round_index in range(3):
            assert collaborator_indices(
                2, selection=selection, round_index=round_index, similarity=similarity
            ) == [1, 0]


def test_collaborator_indices_rejects_bad_arguments():
    with pytest.raises(ValueError, match="selection must be one of .*in_order.*got 'random'"):
        collaborator_indices(4, selection="random", round_index=0)
    with pytest.raises(ValueError, match="num_models must be >= 0"):
        collaborator_indices(-1, selection="in_order", round_index=0)
    with pytest.raises(ValueError, match="needs a similarity matrix"):
        collaborator_indices(4, selection="lowest_similarity", round_index=0)
    with pytest.raises(ValueError, match=r"similarity must be 4 x 4, got shape \(3, 3\)"):
        collaborator_indices(4, selection="highest_similarity", round_index=0, similarity=np.eye(3))
    with pytest.raises(ValueError, match="round_index must be >= 0"):
        collaborator_indices(4, selection="in_order", round_index=-1)


# --- cross_aggregate ----------------------------------------------------------


def expected_blend(own: dict, others: list[dict], alpha: float) -> dict:
    """alpha * own + (1 - alpha) * mean(others), in float64; ints from own."""
    blended = {}
    for name, array in own.items():
        if name in FLOAT_NAMES:
            mean = np.mean([other[name].astype(np.float64) for other in others], axis=0)
            blended[name] = alpha * array.astype(np.float64) + (1 - alpha) * mean
        else:
            blended[name] = array
    return blended


def assert_models_close(actual: dict, expected: dict, reference: dict) -> None:
    assert list(actual) == list(reference)
    for name, array in actual.items():
        assert array.dtype == reference[name].dtype
        assert array.shape == reference[name].shape
        if name in FLOAT_NAMES:
            tolerance = 1e-6 if array.dtype == np.float32 else 1e-13
            np.testing.assert_allclose(array, expected[name], rtol=tolerance, atol=tolerance)
        else:
            np.testing.assert_array_equal(array, expected[name])


@pytest.mark.parametrize("alpha", [0.5, 0.8, 0.99])
def test_in_order_cross_aggregation_follows_the_formula(alpha):
    models = random_models(4)
    result = cross_aggregate(models, alpha=alpha, selection="in_order", round_index=1)
    partners = [2, 3, 0, 1]  # offset (1 mod 3) + 1 = 2
    for index, model in enumerate(result):
        expected = expected_blend(models[index], [models[partners[index]]], alpha)
        assert_models_close(model, expected, models[index])


@pytest.mark.parametrize("selection", ["highest_similarity", "lowest_similarity"])
def test_similarity_cross_aggregation_uses_the_given_matrix(selection):
    models = random_models(4)
    result = cross_aggregate(
        models, alpha=0.9, selection=selection, round_index=0, similarity=SIMILARITY
    )
    partners = [2, 3, 0, 1] if selection == "highest_similarity" else [3, 2, 3, 0]
    for index, model in enumerate(result):
        expected = expected_blend(models[index], [models[partners[index]]], 0.9)
        assert_models_close(model, expected, models[index])


@pytest.mark.parametrize("selection", ["highest_similarity", "lowest_similarity"])
def test_similarity_is_computed_when_not_given(selection):
    models = random_models(5, seed=3)
    # Give the models a known similarity structure: a shared direction with
    # different amounts of noise.
    for index, model in enumerate(models):
        for name in FLOAT_NAMES:
            model[name] = (models[0][name] * (index % 3 + 1) + model[name]).astype(
                model[name].dtype
            )
    similarity = np.array([[direct_cosine(a, b) for b in models] for a in models])
    np.fill_diagonal(similarity, np.nan)
    pick = np.nanargmax if selection == "highest_similarity" else np.nanargmin
    partners = [int(pick(row)) for row in similarity]
    result = cross_aggregate(models, alpha=0.99, selection=selection, round_index=0)
    for index, model in enumerate(result):
        expected = expected_blend(models[index], [models[partners[index]]], 0.99)
        assert_models_close(model, expected, models[index])


@pytest.mark.parametrize("propeller", [False, True])
def test_integer_tensors_come_from_the_model_itself(propeller):
    models = random_models(3)
    result = cross_aggregate(
        models, alpha=0.7, selection="lowest_similarity", round_index=0, propeller=propeller
    )
    for index, model in enumerate(result):
        assert model["bn.num_batches_tracked"].dtype == np.int64
        assert model["bn.num_batches_tracked"] == models[index]["bn.num_batches_tracked"]


@pytest.mark.parametrize("propeller", [False, True])
def test_inputs_are_not_modified_and_outputs_are_new_arrays(propeller):
    models = random_models(4)
    before = copy.deepcopy(models)
    result = cross_aggregate(
        models, alpha=0.9, selection="lowest_similarity", round_index=2, propeller=propeller
    )
    for original, kept in zip(models, before, strict=True):
        for name in SHAPES:
            np.testing.assert_array_equal(original[name], kept[name])
    for model in result:
        for name in FLOAT_NAMES:
            assert not any(np.shares_memory(model[name], m[name]) for m in models)


@pytest.mark.parametrize("alpha", [0.49, 1.0, 1.5, -0.2])
def test_alpha_outside_half_open_unit_half_is_rejected(alpha):
    with pytest.raises(ValueError, match=rf"alpha must be in \[0.5, 1.0\), got {alpha}"):
        cross_aggregate(random_models(3), alpha=alpha, selection="in_order", round_index=0)


def test_cross_aggregate_rejects_bad_selection():
    with pytest.raises(ValueError, match="selection must be one of"):
        cross_aggregate(random_models(3), alpha=0.9, selection="closest", round_index=0)


@pytest.mark.parametrize("round_index", [0, 1, 2, 5])
def test_propeller_models_are_the_next_two_in_order_collaborators(round_index):
    count, alpha = 4, 0.8
    models = random_models(count, seed=round_index)
    first_offset = round_index % (count - 1) + 1
    second_offset = (round_index + 1) % (count - 1) + 1
    assert first_offset != second_offset
    result = cross_aggregate(
        models, alpha=alpha, selection="lowest_similarity", round_index=round_index, propeller=True
    )
    for index, model in enumerate(result):
        first = models[(index + first_offset) % count]
        second = models[(index + second_offset) % count]
        expected = expected_blend(models[index], [first, second], alpha)
        assert_models_close(model, expected, models[index])


def test_propeller_ignores_the_selection_rule():
    models = random_models(5)
    results = [
        cross_aggregate(models, alpha=0.9, selection=s, round_index=3, propeller=True)
        for s in SELECTIONS
    ]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            for name in SHAPES:
                np.testing.assert_array_equal(a[name], b[name])


def test_propeller_with_two_models_uses_the_other_model_twice():
    models = random_models(2)
    result = cross_aggregate(
        models, alpha=0.75, selection="in_order", round_index=4, propeller=True
    )
    for index, model in enumerate(result):
        other = models[1 - index]
        assert_models_close(model, expected_blend(models[index], [other], 0.75), models[index])


def test_two_models_without_propeller_mix_with_each_other():
    models = random_models(2)
    result = cross_aggregate(models, alpha=0.6, selection="lowest_similarity", round_index=0)
    for index, model in enumerate(result):
        other = models[1 - index]
        assert_models_close(model, expected_blend(models[index], [other], 0.6), models[index])


# --- real models: the float64 computation, and the float32 arithmetic --------


@pytest.fixture(scope="module")
def resnet_pool() -> list[dict]:
    """Seventeen ResNet-20 state dicts (270k parameters, BatchNorm counters
    included): its initialisation, each moved by its own amount, as after a
    round of local training (steps scaled to each tensor's spread)."""
    from fedx.models import build_seeded_model  # pylint: disable=import-outside-toplevel

    model = build_seeded_model("resnet20", (3, 32, 32), 10, seed=0)
    base = {name: tensor.numpy().copy() for name, tensor in model.state_dict().items()}
    rng = np.random.default_rng(0)
    pool = []
    for index in range(17):
        pool.append(
            {
                name: (
                    array
                    + (0.05 + 0.1 * index) * (array.std() + 0.1) * rng.standard_normal(array.shape)
                ).astype(array.dtype)
                if array.dtype.kind == "f"
                else np.array(index, dtype=array.dtype)
                for name, array in base.items()
            }
        )
    return pool


@pytest.fixture
def small_blocks_two_threads(monkeypatch):
    """Blocks, spans, Gram chunks and staging blocks smaller than ResNet-20's
    largest tensors (36,864 elements), on two threads, so that every
    boundary is crossed and the pieces run concurrently."""
    monkeypatch.setattr(aggregation_module, "_BLOCK", 10_000)
    monkeypatch.setattr(aggregation_module, "_SPAN", 30_000)
    monkeypatch.setattr(aggregation_module, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(similarity_module, "_CHUNK", 20_000)
    monkeypatch.setattr(similarity_module, "_STAGING_BYTES", 400_000)
    monkeypatch.setattr(similarity_module, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(parallel_module, "thread_count", lambda: 2)


@pytest.mark.usefixtures("small_blocks_two_threads")
@pytest.mark.parametrize("count", [5, 17], ids=["few-rows", "rank-k-update"])
@pytest.mark.parametrize("selection", ["lowest_similarity", "highest_similarity"])
def test_real_models_match_float64_and_the_float32_formula(resnet_pool, count, selection):
    """The float64 similarity picks the same collaborators; every blend is
    ``f32(alpha * v_i) + f32((1 - alpha) * v_co)`` bit for bit (fedx's
    arithmetic before the blends were computed together, so the results did
    not change), and within float32 rounding of the float64 blend."""
    models, alpha = resnet_pool[:count], 0.99
    floats = [name for name, array in models[0].items() if array.dtype.kind == "f"]
    vectors = np.array(
        [
            np.concatenate([model[name].astype(np.float64).ravel() for name in floats])
            for model in models
        ]
    )
    norms = np.linalg.norm(vectors, axis=1)
    reference = vectors @ vectors.T / np.outer(norms, norms)
    np.testing.assert_allclose(cosine_similarity_matrix(models), reference, rtol=0, atol=1e-6)
    np.fill_diagonal(reference, np.nan)
    pick = np.nanargmin if selection == "lowest_similarity" else np.nanargmax
    partners = [int(pick(row)) for row in reference]
    assert len(set(partners)) > 1

    result = cross_aggregate(models, alpha=alpha, selection=selection, round_index=0)

    own, other = np.float32(alpha), np.float32(1.0 - alpha)
    for index, (model, partner) in enumerate(zip(result, partners, strict=True)):
        assert list(model) == list(models[index])
        for name, array in model.items():
            if name not in floats:
                assert array is models[index][name]
                continue
            mine, theirs = models[index][name], models[partner][name]
            assert array.dtype == mine.dtype and array.shape == mine.shape
            np.testing.assert_array_equal(array, own * mine + other * theirs)
            exact = alpha * mine.astype(np.float64) + (1.0 - alpha) * theirs.astype(np.float64)
            # Rounding of the two factors, the two products and the sum.
            scale = np.abs(alpha * mine.astype(np.float64)) + np.abs((1 - alpha) * theirs)
            assert np.all(np.abs(array - exact) <= 2.0**-22 * scale + 1e-45)
    # Every output is memory of its own.
    for name in floats:
        assert not np.shares_memory(result[0][name], result[1][name])
