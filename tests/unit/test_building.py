"""From a run config to a strategy: every method builds, its constructor's errors become config errors."""

import re

import pytest

from fedx.config import ConfigError, RunConfig
from fedx.registry import builtin_methods
from fedx.server.building import build_strategy
from fedx.strategies import FedCross, FedMe, FedMR


def build_error(settings: dict) -> str:
    """The ConfigError that building the strategy of the run config ``settings`` raises."""
    cfg = RunConfig.from_mapping(settings)
    with pytest.raises(ConfigError) as error:
        build_strategy(cfg)
    return str(error.value)


@pytest.mark.parametrize("method", builtin_methods(), ids=lambda m: m.name)
def test_every_method_builds_with_its_keys(defaults, method):
    cfg = RunConfig.from_mapping({**defaults, "strategy": method.name})
    strategy = build_strategy(cfg)
    assert type(strategy) is method.strategy  # pylint: disable=unidiomatic-typecheck
    # The app keys it takes reached the constructor.
    if "min-train-nodes" in method.takes:
        assert strategy.min_train_nodes == cfg.min_train_nodes
    if "seed" in method.takes:
        assert strategy.seed == cfg.seed


def test_the_methods_own_values_reach_the_constructor(defaults):
    cross = build_strategy(
        RunConfig.from_mapping(
            {
                **defaults,
                "strategy": "fedcross",
                "fedcross-alpha": 0.9,
                "fedcross-selection": "in_order",
                "fedcross-propeller-rounds": 3,
                "pool-mean": "weighted",
                "seed": 7,
            }
        )
    )
    assert isinstance(cross, FedCross)
    assert (cross.alpha, cross.selection, cross.propeller_rounds, cross.pool_mean, cross.seed) == (
        0.9,
        "in_order",
        3,
        "weighted",
        7,
    )
    secure = build_strategy(
        RunConfig.from_mapping(
            {**defaults, "secure-recombination": True, "secure-repeats": 2, "grouping": "module"}
        )
    )
    assert isinstance(secure, FedMR) and secure.secure is not None
    assert (secure.secure.repeats, secure.secure.min_layers, secure.secure.grouping) == (
        2,
        2,
        "module",
    )
    assert build_strategy(RunConfig.from_mapping(defaults)).secure is None


def test_combinations_the_strategy_rejects_are_config_errors(defaults):
    assert (
        build_error(
            {
                **defaults,
                "strategy": "fedcross",
                "fedcross-alpha": 0.9,
                "fedcross-alpha-start": 0.95,
            }
        )
        == "invalid run config fedcross-alpha-start=0.95: must be a number in [0.5, 0.9]"
    )
    # A key's own range is checked when the run config is read, with the same message.
    with pytest.raises(ConfigError) as error:
        RunConfig.from_mapping({**defaults, "secure-recombination": True, "secure-repeats": 0})
    assert str(error.value) == "invalid run config secure-repeats=0: must be an integer >= 1"
    crossed = {
        **defaults,
        "secure-recombination": True,
        "secure-min-layers": 3,
        "secure-max-layers": 2,
    }
    assert build_error(crossed) == "invalid run config secure-max-layers=2: must be an integer >= 3"
    weighted = {**defaults, "secure-recombination": True, "pool-mean": "weighted"}
    assert build_error(weighted).startswith(
        "invalid run config pool-mean='weighted': must be 'uniform' with secure"
    )


def test_fedme_settings_reach_the_strategy(defaults):
    cfg = RunConfig.from_mapping(
        {
            **defaults,
            "strategy": "fedme",
            "fedme-architectures": "cnn-3, cnn-1",
            "fedme-cluster-rounds": "",
            "fedme-mutual-learning": False,
            "fedme-initial-architecture": "local-best",
            "fedme-choice-epochs": 2,
            "finetune-epochs": 2,
        }
    )
    strategy = build_strategy(cfg)
    assert isinstance(strategy, FedMe)
    assert (strategy.initial_architecture, strategy.choice_epochs) == ("local-best", 2)
    assert strategy.architectures == ("cnn-3", "cnn-1") and cfg.models == ("cnn-3", "cnn-1")
    assert strategy.cluster_rounds == ()
    assert strategy.mutual_learning is False and strategy.model_tuning and strategy.clustering
    assert strategy.finetune_epochs == 2 and strategy.seed == cfg.seed
    default = build_strategy(RunConfig.from_mapping({**defaults, "strategy": "fedme"}))
    assert default.cluster_rounds == (10, 15, 18)
    assert default.initial_architecture == "local-best"
    # The fixed architecture must be one of the list: the error names the key.
    fixed = RunConfig.from_mapping(
        {**defaults, "strategy": "fedme", "fedme-initial-architecture": "fixed:cnn-2 "}
    )
    assert build_strategy(fixed).architecture_for(0) == "cnn-2"
    outside = {**defaults, "strategy": "fedme", "fedme-initial-architecture": "fixed:vgg11"}
    assert build_error(outside).startswith(
        "invalid run config fedme-initial-architecture='fixed:vgg11': must be local-best, "
        "round-robin or fixed:<name> with <name> one of ('cnn-1', 'cnn-2', 'cnn-3', 'cnn-4')"
    )
    with pytest.raises(ConfigError, match=r"^invalid run config fedme-initial-architecture='best'"):
        RunConfig.from_mapping(
            {**defaults, "strategy": "fedme", "fedme-initial-architecture": "best"}
        )
    # The server's unlabeled set (200 digits) feeds the clustering outputs.
    model = strategy.initial_model_fn("cnn-1", 0)
    assert strategy.predict_fn("cnn-1", model).shape == (200, 10)


def test_models_that_do_not_fit_the_data_are_config_errors(defaults):
    too_small = {**defaults, "strategy": "fedme", "fedme-architectures": "cnn-2,vgg11"}
    assert build_error(too_small).startswith(
        "invalid run config fedme-architectures='cnn-2,vgg11' for dataset='digits': vgg11 needs inputs of at least 32x32"
    )
    unknown = {**defaults, "strategy": "fedme", "fedme-architectures": "cnn-1,resnet99"}
    assert re.search(
        r"fedme-architectures='cnn-1,resnet99' .*'resnet99' is not one of", build_error(unknown)
    )
    # The model key of another method is not built: FedMe ignores `model`.
    assert build_strategy(
        RunConfig.from_mapping({**defaults, "strategy": "fedme", "model": "lstm"})
    )
    assert (
        build_error({**defaults, "strategy": "fedme", "min-train-nodes": 1})
        == "invalid run config min-train-nodes=1: must be an integer >= 2"
    )
    assert build_error({**defaults, "strategy": "fedavg-ft", "min-partition-size": 2}).startswith(
        "invalid run config min-partition-size=2: must be an integer >= 3"
    )


def test_segment_fraction_zero_means_layer_wise(defaults):
    strategy = build_strategy(RunConfig.from_mapping({**defaults, "segment-fraction": 0.0}))
    assert strategy.segment_fraction is None
    strategy = build_strategy(RunConfig.from_mapping({**defaults, "segment-fraction": 0.25}))
    assert strategy.segment_fraction == 0.25
