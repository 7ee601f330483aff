"""Run-config validation: every default is valid, every bad value names its key."""

import importlib.util
import tomllib
from pathlib import Path

import pytest

from fedx.config import RULES, STRATEGY_NAMES, ConfigError, RunConfig
from fedx.data import DATASET_NAMES
from fedx.server_app import STRATEGY_BUILDERS, build_strategy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def defaults() -> dict:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["flwr"]["app"]["config"]


def test_pyproject_declares_exactly_the_validated_keys(defaults):
    assert list(defaults) == list(RULES)
    cfg = RunConfig.from_mapping(defaults)
    assert cfg.to_dict() == {k: (float(v) if RULES[k].kind is float else v) for k, v in defaults.items()}


def test_every_strategy_name_builds(defaults):
    assert set(STRATEGY_BUILDERS) == set(STRATEGY_NAMES)
    for name in STRATEGY_NAMES:
        strategy = build_strategy(RunConfig.from_mapping({**defaults, "strategy": name}))
        assert type(strategy).__name__.lower() == name.replace("-", "")


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("strategy", "fedfoo", "one of fedavg, fedprox, fedmr, fedindep, fedmut, fedcross, fedme, fedavg-ft"),
        ("fedcross-alpha", 1.0, "a number in [0.5, 1)"),
        ("fedcross-alpha", 0.4, "a number in [0.5, 1)"),
        ("fedmut-alpha", -1.0, "a number in [0, inf)"),
        ("fedmut-beta0", 1.2, "a number in [0, 1]"),
        ("fedcross-selection", "random", "one of in_order, highest_similarity, lowest_similarity"),
        ("model", "resnet99", "one of cnn, resnet20, vgg16, lstm, cnn-1, cnn-2, cnn-3, cnn-4, vgg11, vgg13, vgg19"),
        ("dataset", "mnist", "one of digits, cifar10, cifar100, femnist, shakespeare"),
        ("fraction-train", 0.0, "a number in (0, 1]"),
        ("fraction-train", 1.5, "a number in (0, 1]"),
        ("learning-rate", -0.1, "a number in (0, inf)"),
        ("segment-fraction", -0.5, "0 (off: layer-wise recombination) or a number in (0, 1]"),
        ("segment-fraction", 2.0, "0 (off: layer-wise recombination) or a number in (0, 1]"),
        ("grouping", "layer", "one of tensor, module"),
        ("pool-mean", "median", "one of uniform, weighted"),
        ("partitioning", "pathological", "one of iid, dirichlet, dirichlet-size-label, natural"),
        ("leaf-users", -1, "0 (every user with more than leaf-min-samples) or an integer >= 1"),
        ("leaf-min-samples", 1.5, "an integer >= 0"),
        ("size-alpha", 0.0, "a number in (0, inf)"),
        ("unlabeled-size", -1, "0 (the dataset's default) or an integer >= 1"),
        ("local-test-fraction", 1.0, "a number in (0, 1)"),
        ("local-validation-fraction", 0.0, "a number in (0, 1)"),
        ("finetune-epochs", -1, "an integer >= 0"),
        ("fedme-architectures", "cnn-1,resnet99",
         "comma-separated model names from cnn, resnet20, vgg16, lstm, cnn-1, cnn-2, cnn-3, cnn-4, vgg11, vgg13, vgg19"),
        ("fedme-architectures", " , ",
         "comma-separated model names from cnn, resnet20, vgg16, lstm, cnn-1, cnn-2, cnn-3, cnn-4, vgg11, vgg13, vgg19"),
        ("fedme-cluster-rounds", "10,5", "comma-separated increasing rounds >= 2 (empty: always one cluster)"),
        ("fedme-cluster-rounds", "1,5", "comma-separated increasing rounds >= 2 (empty: always one cluster)"),
        ("fedme-cluster-rounds", "ten", "comma-separated increasing rounds >= 2 (empty: always one cluster)"),
        ("fedme-model-tuning", "off", "true or false"),
        ("fedme-clustering", 1, "true or false"),
        ("num-server-rounds", 0, "an integer >= 1"),
        ("local-epochs", 2.5, "an integer >= 1"),
        ("batch-size", True, "an integer >= 1"),
        ("momentum", 1.0, "a number in [0, 1)"),
        ("download", "yes", "true or false"),
    ],
)
def test_bad_values_name_key_value_and_allowed_range(defaults, key, value, allowed):
    with pytest.raises(ConfigError) as error:
        RunConfig.from_mapping({**defaults, key: value})
    assert str(error.value) == f"invalid run config {key}={value!r}: must be {allowed}"


def test_combinations_the_strategy_rejects_are_config_errors(defaults):
    cfg = RunConfig.from_mapping(
        {**defaults, "strategy": "fedcross", "fedcross-alpha": 0.9, "fedcross-alpha-start": 0.95}
    )
    with pytest.raises(ConfigError, match="strategy='fedcross': alpha_start must be in"):
        build_strategy(cfg)


def test_fedme_settings_reach_the_strategy(defaults):
    cfg = RunConfig.from_mapping(
        {**defaults, "strategy": "fedme", "fedme-architectures": "cnn-3, cnn-1",
         "fedme-cluster-rounds": "", "fedme-mutual-learning": False, "finetune-epochs": 2}
    )
    strategy = build_strategy(cfg)
    assert strategy.architectures == ("cnn-3", "cnn-1")
    assert strategy.cluster_rounds == ()
    assert strategy.mutual_learning is False and strategy.model_tuning and strategy.clustering
    assert strategy.finetune_epochs == 2 and strategy.seed == cfg.seed
    assert build_strategy(RunConfig.from_mapping({**defaults, "strategy": "fedme"})).cluster_rounds == (10, 15, 18)


def test_architectures_that_do_not_fit_the_dataset_are_config_errors(defaults):
    cfg = RunConfig.from_mapping({**defaults, "strategy": "fedme", "fedme-architectures": "cnn-2,vgg11"})
    with pytest.raises(ConfigError) as error:
        build_strategy(cfg)
    assert str(error.value).startswith(
        "invalid run config fedme-architectures='cnn-2,vgg11': vgg11 needs inputs of at least 32x32"
    )
    cfg = RunConfig.from_mapping({**defaults, "strategy": "fedme", "min-train-nodes": 1})
    with pytest.raises(ConfigError, match="strategy='fedme': min_train_nodes must be at least 2"):
        build_strategy(cfg)
    cfg = RunConfig.from_mapping({**defaults, "strategy": "fedavg-ft", "min-partition-size": 2})
    with pytest.raises(ConfigError, match=r"^invalid run config min-partition-size=2: must be an integer >= 3"):
        build_strategy(cfg)


def test_unknown_and_missing_keys(defaults):
    with pytest.raises(ConfigError, match=r"unknown run-config key\(s\) \['lr'\]"):
        RunConfig.from_mapping({**defaults, "lr": 0.1})
    incomplete = dict(defaults)
    del incomplete["seed"]
    with pytest.raises(ConfigError, match="lacks 'seed'"):
        RunConfig.from_mapping(incomplete)


def test_integers_are_accepted_for_numbers(defaults):
    cfg = RunConfig.from_mapping({**defaults, "learning-rate": 1, "segment-fraction": 1})
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.segment_fraction == 1.0


def test_segment_fraction_zero_means_layer_wise(defaults):
    strategy = build_strategy(RunConfig.from_mapping({**defaults, "segment-fraction": 0.0}))
    assert strategy.segment_fraction is None
    strategy = build_strategy(RunConfig.from_mapping({**defaults, "segment-fraction": 0.25}))
    assert strategy.segment_fraction == 0.25


CONFIG_DIR = REPO / "configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.toml"))
# A setting file is <dataset>-<model>-<partition>.toml and serves every method;
# those of the papers' data sets reproduce the papers' tables.
SETTING_FILES = [path for path in CONFIG_FILES if path.stem.split("-")[0] in DATASET_NAMES]
PAPER_DATASETS = ("cifar10", "cifar100", "femnist", "shakespeare")
PAPER_FILES = [path for path in SETTING_FILES if path.stem.split("-")[0] in PAPER_DATASETS]
COMPARED_STRATEGIES = ("fedavg", "fedprox", "fedmr", "fedindep", "fedmut", "fedcross")
# The papers' common settings, written out in every setting file.
PAPER_VALUES = {
    "strategy": "fedmr",
    "fraction-train": 0.1,
    "learning-rate": 0.01,
    "momentum": 0.9,
    "batch-size": 50,
    "local-epochs": 5,
    "fedmut-alpha": 4.0,
    "fedcross-alpha": 0.99,
    "fedcross-selection": "lowest_similarity",
    "pool-mean": "uniform",
}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_file_validates_and_builds(defaults, path):
    text = path.read_text()
    overrides = tomllib.loads(text)
    assert overrides, f"{path.name} sets nothing"
    cfg = RunConfig.from_mapping({**defaults, **overrides})
    # build_strategy also checks that the model reads the dataset's inputs.
    assert build_strategy(cfg) is not None
    # It says what it reproduces and how to run it.
    assert text.startswith("# ") and "flwr run . " in text
    assert f"--run-config configs/{path.name}" in text
    if path not in SETTING_FILES:
        assert path.stem.startswith(cfg.strategy) and cfg.dataset in path.stem and cfg.model in path.stem


@pytest.mark.parametrize("path", SETTING_FILES, ids=lambda p: p.name)
def test_setting_files_are_named_by_their_data(defaults, path):
    overrides = tomllib.loads(path.read_text())
    cfg = RunConfig.from_mapping({**defaults, **overrides})
    dataset, rest = path.stem.split("-", 1)
    model, partition = rest.rsplit("-", 1)
    assert (cfg.dataset, cfg.model) == (dataset, model)
    if partition in ("iid", "natural"):
        assert cfg.partitioning == partition
    else:
        assert partition.startswith("dir") and cfg.partitioning == "dirichlet"
        assert overrides["dirichlet-alpha"] == float(partition.removeprefix("dir"))
    # A comparison switches the strategy and nothing else.
    for strategy in COMPARED_STRATEGIES:
        assert build_strategy(RunConfig.from_mapping({**cfg.to_dict(), "strategy": strategy}))


@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda p: p.name)
def test_paper_setting_files_hold_every_methods_paper_values(defaults, path):
    text = path.read_text()
    overrides = tomllib.loads(text)
    cfg = RunConfig.from_mapping({**defaults, **overrides})
    model, partition = path.stem.split("-")[1], path.stem.split("-")[-1]
    for key, value in PAPER_VALUES.items():
        assert overrides.get(key) == value, f"{path.name}: {key}"
    for key in ("num-server-rounds", "proximal-mu", "first-stage-rounds", "fedmut-beta0",
                "min-train-nodes", "min-available-nodes"):
        assert key in overrides, f"{path.name} leaves {key} to pyproject's default"
    assert cfg.proximal_mu > 0
    # The two-stage FedMR's first stage (fedx-compare's fedmr sets 0).
    assert cfg.first_stage_rounds == {"resnet20": 100, "vgg16": 100, "cnn": 50, "lstm": 50}[model]
    assert cfg.fedmut_beta0 == (0.5 if model == "resnet20" else 0.3)
    clients = cfg.leaf_users if partition == "natural" else 100
    assert cfg.min_available_nodes == clients
    assert cfg.min_train_nodes == int(clients * cfg.fraction_train)
    assert f'--federation-config "num-supernodes={clients} ' in text


def test_the_paper_settings_are_all_there():
    expected = {
        f"{dataset}-{model}-{partition}.toml"
        for dataset in ("cifar10", "cifar100")
        for model in ("cnn", "resnet20", "vgg16")
        for partition in ("dir0.1", "dir0.5", "dir1.0", "iid")
    }
    assert len(expected) == 24
    expected |= {"femnist-cnn-natural.toml", "shakespeare-lstm-natural.toml"}
    assert {path.name for path in PAPER_FILES} == expected
    femnist = tomllib.loads((CONFIG_DIR / "femnist-cnn-natural.toml").read_text())
    # FedMR Sec. 5.1, FedCross Sec. 4.1.1: 180 writers with more than 100 samples.
    assert (femnist["leaf-users"], femnist["leaf-min-samples"]) == (180, 100)


def test_the_generator_writes_the_committed_setting_files(tmp_path):
    spec = importlib.util.spec_from_file_location("generate_configs", CONFIG_DIR / "generate.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    written = generator.write(tmp_path)
    assert sorted(path.name for path in written) == sorted(path.name for path in PAPER_FILES)
    for path in written:
        assert path.read_text() == (CONFIG_DIR / path.name).read_text(), path.name
