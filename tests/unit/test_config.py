"""Run-config checking: every default is valid, every bad value names its key; the configs/ files.

How a checked run config becomes a strategy (the methods' own checks) is in
tests/unit/test_building.py.
"""

import importlib.util
import tomllib

import pytest

from fedx.config import APP_KEYS, ConfigError, RunConfig
from fedx.data import DATASET_NAMES
from fedx.registry import method_names
from fedx.server.building import build_strategy
from tests.support.helpers import REPO


def config_error(defaults: dict, overrides: dict) -> str:
    """The one-line error of a run config: from checking it, or from building its strategy."""
    with pytest.raises(ConfigError) as error:
        build_strategy(RunConfig.from_mapping({**defaults, **overrides}))
    return str(error.value)


def test_the_defaults_are_valid_and_typed(defaults):
    cfg = RunConfig.from_mapping(defaults)
    assert cfg.to_dict() == {
        k: (float(v) if isinstance(cfg[k], float) else v) for k, v in defaults.items()
    }
    assert cfg == RunConfig.from_mapping({})  # a key the run config lacks takes its default
    assert isinstance(cfg.learning_rate, float) and isinstance(cfg.batch_size, int)
    assert list(cfg.to_dict())[: len(APP_KEYS)] == [key.name for key in APP_KEYS]


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("strategy", "fedfoo", f"one of {', '.join(method_names())}"),
        (
            "model",
            "resnet99",
            "one of cnn, resnet20, vgg16, lstm, cnn-1, cnn-2, cnn-3, cnn-4, vgg11, vgg13, vgg19, "
            "or a model of your own: `package.module:NAME` or an entry point of the group "
            "fedx.models (model 'resnet99': no entry point 'resnet99' in the group fedx.models "
            "(installed: none))",
        ),
        (
            "dataset",
            "mnist",
            "one of digits, cifar10, cifar100, femnist, shakespeare, or a dataset of your own: "
            "`package.module:NAME` or an entry point of the group fedx.datasets (dataset "
            "'mnist': no entry point 'mnist' in the group fedx.datasets (installed: none))",
        ),
        ("fraction-train", 0.0, "a number in (0, 1]"),
        ("fraction-train", 1.5, "a number in (0, 1]"),
        ("learning-rate", -0.1, "a number in (0, inf)"),
        ("partitioning", "pathological", "one of iid, dirichlet, dirichlet-size-label, natural"),
        ("leaf-users", -1, "0 (every user with more than leaf-min-samples) or an integer >= 1"),
        ("leaf-min-samples", 1.5, "an integer >= 0"),
        ("size-alpha", 0.0, "a number in (0, inf)"),
        ("unlabeled-size", -1, "0 (the dataset's default) or an integer >= 1"),
        ("local-test-fraction", 1.0, "a number in (0, 1)"),
        ("local-validation-fraction", 0.0, "a number in (0, 1)"),
        ("num-server-rounds", 0, "an integer >= 1"),
        ("local-epochs", 2.5, "an integer >= 1"),
        ("batch-size", True, "an integer >= 1"),
        ("momentum", 1.0, "a number in [0, 1)"),
        ("download", "yes", "true or false"),
        # A method's key has its type checked whichever method runs.
        ("fedme-clustering", 1, "true or false"),
        ("fedmut-alpha", "four", "a number in [0, inf)"),
    ],
)
def test_bad_values_name_key_value_and_allowed_range(defaults, key, value, allowed):
    with pytest.raises(ConfigError) as error:
        RunConfig.from_mapping({**defaults, key: value})
    assert str(error.value) == f"invalid run config {key}={value!r}: must be {allowed}"


@pytest.mark.parametrize(
    "strategy, key, value, allowed",
    [
        ("fedcross", "fedcross-alpha", 1.0, "a number in [0.5, 1)"),
        ("fedcross", "fedcross-alpha", 0.4, "a number in [0.5, 1)"),
        (
            "fedcross",
            "fedcross-selection",
            "random",
            "one of in_order, highest_similarity, lowest_similarity",
        ),
        ("fedmut", "fedmut-alpha", -1.0, "a number in [0, inf)"),
        ("fedmut", "fedmut-beta0", 1.2, "a number in [0, 1]"),
        (
            "fedmr",
            "segment-fraction",
            -0.5,
            "0 (off: layer-wise recombination) or a number in (0, 1]",
        ),
        (
            "fedmr",
            "segment-fraction",
            2.0,
            "0 (off: layer-wise recombination) or a number in (0, 1]",
        ),
        ("fedmr", "grouping", "layer", "one of tensor, module"),
        ("fedmut", "pool-mean", "median", "one of uniform, weighted"),
        ("fedprox", "proximal-mu", -0.5, "a number in [0, inf)"),
        ("fedavg-ft", "finetune-epochs", -1, "an integer >= 0"),
        ("fedme", "finetune-epochs", -1, "an integer >= 0"),
        ("fedme", "fedme-architectures", " , ", "comma-separated `model` names"),
        (
            "fedme",
            "fedme-cluster-rounds",
            "10,5",
            "comma-separated increasing rounds >= 2 (empty: always one cluster)",
        ),
        (
            "fedme",
            "fedme-cluster-rounds",
            "1,5",
            "comma-separated increasing rounds >= 2 (empty: always one cluster)",
        ),
        (
            "fedme",
            "fedme-cluster-rounds",
            "ten",
            "comma-separated increasing rounds >= 2 (empty: always one cluster)",
        ),
    ],
)
def test_a_methods_bad_values_are_named_when_it_runs(defaults, strategy, key, value, allowed):
    """A method's bad value is named, also when another method runs (it would stop a later run)."""
    message = f"invalid run config {key}={value!r}: must be {allowed}"
    assert config_error(defaults, {"strategy": strategy, key: value}) == message
    other = "fedavg" if strategy != "fedavg" else "fedmr"
    assert config_error(defaults, {"strategy": other, key: value}) == message


def test_unknown_keys_and_keys_of_another_method(defaults):
    with pytest.raises(ConfigError, match=r"unknown run-config key\(s\) \['lr'\]"):
        RunConfig.from_mapping({**defaults, "lr": 0.1})
    with pytest.raises(ConfigError) as error:
        RunConfig.from_mapping({**defaults, "strategy": "fedmut", "secure-recombination": True})
    assert (
        str(error.value)
        == "secure-recombination=true needs strategy='fedmr', got strategy='fedmut'"
    )


def test_integers_are_accepted_for_numbers(defaults):
    cfg = RunConfig.from_mapping({**defaults, "learning-rate": 1, "segment-fraction": 1})
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg["segment-fraction"] == 1.0 and isinstance(cfg["segment-fraction"], float)


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
    strategy = build_strategy(cfg)
    assert type(strategy) is cfg.method.strategy  # pylint: disable=unidiomatic-typecheck
    assert strategy.fraction_train == cfg.fraction_train
    # It says what it reproduces and how to run it.
    assert text.startswith("# ") and "flwr run . " in text
    assert f"--run-config configs/{path.name}" in text
    if path not in SETTING_FILES:
        assert (
            path.stem.startswith(cfg.strategy)
            and cfg.dataset in path.stem
            and cfg.model in path.stem
        )


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
        built = build_strategy(RunConfig.from_mapping({**cfg.to_dict(), "strategy": strategy}))
        assert type(built).__name__.lower() == strategy  # pylint: disable=unidiomatic-typecheck


@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda p: p.name)
def test_paper_setting_files_hold_every_methods_paper_values(defaults, path):
    text = path.read_text()
    overrides = tomllib.loads(text)
    cfg = RunConfig.from_mapping({**defaults, **overrides})
    model, partition = path.stem.split("-")[1], path.stem.split("-")[-1]
    for key, value in PAPER_VALUES.items():
        assert overrides.get(key) == value, f"{path.name}: {key}"
    for key in (
        "num-server-rounds",
        "proximal-mu",
        "first-stage-rounds",
        "fedmut-beta0",
        "min-train-nodes",
        "min-available-nodes",
    ):
        assert key in overrides, f"{path.name} leaves {key} to pyproject's default"
    assert cfg["proximal-mu"] > 0
    # The two-stage FedMR's first stage (fedx-compare's fedmr sets 0).
    assert (
        cfg["first-stage-rounds"] == {"resnet20": 100, "vgg16": 100, "cnn": 50, "lstm": 50}[model]
    )
    assert cfg["fedmut-beta0"] == (0.5 if model == "resnet20" else 0.3)
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
