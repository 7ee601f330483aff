"""FedMR's recombination on real arrays: the properties of Lemma 4.4 and the ablations."""

import copy
import math

import numpy as np
import pytest

from fedx.ops import layer_groups, recombine, segment_ids


def _source_of(models, recombined, name):
    """For each new model, the index of the input model whose tensor it holds."""
    return [next(k for k, m in enumerate(models) if m[name] is new[name]) for new in recombined]


def test_every_uploaded_layer_is_used_exactly_once(models):
    recombined = recombine(models, np.random.default_rng(0))
    assert len(recombined) == len(models)
    for name in models[0]:
        sources = _source_of(models, recombined, name)
        assert sorted(sources) == list(range(len(models)))


def test_sum_and_squared_distances_per_layer_are_unchanged(models):
    recombined = recombine(models, np.random.default_rng(1))
    point = {n: np.random.default_rng(2).normal(size=a.shape) for n, a in models[0].items()}
    for name in models[0]:
        before = sum(m[name].astype(np.float64) for m in models)
        after = sum(m[name].astype(np.float64) for m in recombined)
        np.testing.assert_array_equal(before, after)
        dist_before = sum(np.sum((m[name] - point[name]) ** 2) for m in models)
        dist_after = sum(np.sum((m[name] - point[name]) ** 2) for m in recombined)
        assert dist_after == pytest.approx(dist_before, rel=1e-12)


def test_layers_are_actually_mixed(models):
    recombined = recombine(models, np.random.default_rng(3))
    mixed = [
        len(set(_source_of(models, [new], name)[0] for name in models[0])) > 1 for new in recombined
    ]
    assert any(mixed), "with 11 tensors and 6 models some model must take layers from several"


def test_inputs_are_not_modified_and_no_array_is_copied(models):
    snapshot = copy.deepcopy(models)
    recombined = recombine(models, np.random.default_rng(4))
    for before, after in zip(snapshot, models, strict=True):
        for name in before:
            np.testing.assert_array_equal(before[name], after[name])
    ids_in = {id(a) for m in models for a in m.values()}
    assert all(id(a) in ids_in for m in recombined for a in m.values())
    assert all(list(m) == list(models[0]) for m in recombined), "state-dict order kept"


def test_same_seed_same_result(models):
    first = recombine(models, np.random.default_rng(7))
    second = recombine(models, np.random.default_rng(7))
    for name in models[0]:
        assert _source_of(models, first, name) == _source_of(models, second, name)


def test_module_grouping_keeps_a_modules_tensors_together(models):
    for seed in range(5):
        recombined = recombine(models, np.random.default_rng(seed), grouping="module")
        for group in layer_groups(list(models[0]), "module"):
            sources = [_source_of(models, recombined, name) for name in group]
            assert all(s == sources[0] for s in sources), group


def test_layer_groups_by_module():
    names = [
        "conv1.weight",
        "conv1.bias",
        "bn1.weight",
        "bn1.num_batches_tracked",
        "fc.weight",
        "scale",
    ]
    assert layer_groups(names, "module") == [
        ["conv1.weight", "conv1.bias"],
        ["bn1.weight", "bn1.num_batches_tracked"],
        ["fc.weight"],
        ["scale"],
    ]
    assert layer_groups(names, "tensor") == [[n] for n in names]
    with pytest.raises(ValueError, match="grouping"):
        layer_groups(names, "block")


@pytest.mark.parametrize("num_layers", [1, 4, 7, 10, 11, 20, 100])
@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.25, 0.29, 0.3, 0.5, 1.0])
def test_segment_rule_is_ceil_j_over_xn(num_layers, fraction):
    segments = segment_ids(num_layers, fraction)
    expected = []
    for j in range(1, num_layers + 1):
        exact = j / (fraction * num_layers)
        # exact ratios that floating point misses by an ulp still count as integers
        expected.append(round(exact) if abs(exact - round(exact)) < 1e-9 else math.ceil(exact))
    assert segments == expected
    assert max(segments) <= math.ceil(1 / fraction)


def test_segment_rule_known_values():
    assert segment_ids(10, 0.25) == [1, 1, 2, 2, 2, 3, 3, 4, 4, 4]
    assert segment_ids(100, 0.29)[28] == 1  # 29 / 29.0 is one segment, not two
    assert segment_ids(4, None) == [1, 2, 3, 4]
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="segment_fraction"):
            segment_ids(4, bad)


def test_segments_share_one_permutation(models):
    groups = layer_groups(list(models[0]), "tensor")
    segments = segment_ids(len(groups), 0.5)
    recombined = recombine(models, np.random.default_rng(5), segment_fraction=0.5)
    by_segment: dict[int, list] = {}
    for group, segment in zip(groups, segments, strict=True):
        by_segment.setdefault(segment, []).append(_source_of(models, recombined, group[0]))
    assert len(by_segment) == 2
    for sources in by_segment.values():
        assert all(s == sources[0] for s in sources)


def test_fraction_one_shuffles_whole_models(models):
    for seed in range(5):
        recombined = recombine(models, np.random.default_rng(seed), segment_fraction=1.0)
        for new in recombined:
            owners = {next(k for k, m in enumerate(models) if m[n] is new[n]) for n in new}
            assert len(owners) == 1
