"""A data set and a model of one's own (examples/tabular): named by reference or by entry point.

The example's data are written in their real format (CSV files with a
header row) from the copy that ships inside scikit-learn; fedx loads them
through the example's ``DatasetSpec``, partitions them and trains the
example's MLP. The commands of docs/own-data.md, run as the page types
them: tests/system/test_example_data_model.py.
"""

import sys

import numpy as np
import pytest
import torch

from fedx import registry
from fedx.config import ConfigError, RunConfig
from fedx.data import DatasetSpec, SplitSource, load_local_splits, load_partition, load_split
from fedx.models import build_model
from fedx.server.building import build_strategy, check_data_and_model, prepare_data
from tests.support.helpers import REPO, run_python

EXAMPLE = REPO / "examples" / "tabular"
PAGE = REPO / "docs" / "own-data.md"
DATASET = "fedx_tabular.data:WDBC"
MODEL = "fedx_tabular.model:build_mlp"

sys.path.insert(0, str(EXAMPLE))
# pylint: disable=wrong-import-position
from fedx_tabular.data import CLASSES, FEATURES, Table  # noqa: E402
from fedx_tabular.prepare import write_files  # noqa: E402

sys.path.remove(str(EXAMPLE))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The example's two CSV files, as ``python -m fedx_tabular.prepare`` writes them."""
    folder = tmp_path_factory.mktemp("wdbc")
    write_files(folder)
    return folder


@pytest.fixture
def example_on_path(monkeypatch):
    """The example's folder on the import path, as Flower puts an app's folder."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


def config(files, **keys) -> RunConfig:
    return RunConfig.from_mapping(
        {"dataset": DATASET, "model": MODEL, "data-root": str(files), **keys}
    )


@pytest.mark.usefixtures("example_on_path")
def test_the_example_is_loaded_partitioned_and_trained_like_fedxs_own(files):
    cfg = config(files, partitioning="dirichlet", **{"dirichlet-alpha": 0.5})
    check_data_and_model(cfg)
    train = load_split(cfg.dataset, "train", **cfg.data_settings())
    test = load_split(cfg.dataset, "test", **cfg.data_settings())
    assert (len(train), len(test)) == (455, 114)  # scikit-learn's 569 rows, 80/20
    assert isinstance(train, Table) and train.data.shape == (455, FEATURES)
    # Standardised by the training file: mean 0 and std 1 per measurement.
    np.testing.assert_allclose(train.data.numpy().mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.data.numpy().std(axis=0), 1.0, atol=1e-4)
    # Both classes in both files, in the data's proportion (stratified): 357 benign.
    assert np.bincount(train.targets).tolist() == [285, 170]
    assert len(CLASSES) == 2

    # fedx's partitioner shares out the training split: disjoint, all of it, skewed.
    shares = [load_partition(cfg.dataset, i, 10, **cfg.partition_settings()) for i in range(10)]
    positions = np.concatenate([share.indices for share in shares])
    assert sorted(positions.tolist()) == list(range(455))
    benign = [share.targets.mean() for share in shares]
    assert max(benign) - min(benign) > 0.3, benign

    # The model: the example's builder, for the data set's shape.
    torch.manual_seed(0)
    model = build_model(cfg.model, (FEATURES,), 2)
    inputs, labels = train.gather(np.arange(8))
    assert model(inputs).shape == (8, 2) and labels.dtype == torch.int64
    assert build_strategy(cfg).__class__.__name__ == "FedMR"

    # Personalized methods split each client's share; the unlabeled set must fit.
    local = load_local_splits(
        cfg.dataset, 0, 10, partitioning="iid", unlabeled=50, **cfg.data_settings()
    )
    assert min(len(local.train), len(local.validation), len(local.test)) >= 1
    with pytest.raises(ConfigError, match=r"unlabeled-size=1000 must be below the 455"):
        prepare_data(config(files, strategy="fedme", **{"fedme-architectures": MODEL}))


def test_names_come_from_registrations_and_entry_points(files, monkeypatch):
    sys.path.insert(0, str(EXAMPLE))
    try:
        from fedx_tabular.data import WDBC  # pylint: disable=import-outside-toplevel
        from fedx_tabular.model import build_mlp  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(str(EXAMPLE))
    components = {registry.DATASET_GROUP: {}, registry.MODEL_GROUP: {}}
    monkeypatch.setattr(registry, "_REGISTERED_COMPONENTS", components)
    with pytest.raises(ConfigError, match=r"no entry point 'wdbc' in the group fedx.datasets"):
        RunConfig.from_mapping({"dataset": "wdbc"})
    registry.register_component(registry.DATASET_GROUP, "wdbc", WDBC)
    registry.register_component(registry.MODEL_GROUP, "mlp", build_mlp)
    cfg = RunConfig.from_mapping({"dataset": "wdbc", "model": "mlp", "data-root": str(files)})
    check_data_and_model(cfg)
    assert len(load_split("wdbc", "test", root=str(files))) == 114
    assert (
        "wdbc"
        in RunConfig.from_mapping({})
        .__class__.__dataclass_fields__["dataset"]
        .metadata["key"][0]
        .text
    )
    with pytest.raises(ValueError, match="'mlp' is registered in the group fedx.models already"):
        registry.register_component(registry.MODEL_GROUP, "mlp", lambda shape, classes: None)
    with pytest.raises(ValueError, match="is a reference, not a name"):
        registry.register_component(registry.MODEL_GROUP, "a.b:c", build_mlp)


def _spec_module(tmp_path, monkeypatch, body: str) -> str:
    """A module ``own_data`` of ``tmp_path`` holding ``body``; returns its name."""
    (tmp_path / "own_data.py").write_text(
        "import numpy as np, torch\n"
        "from torch.utils.data import TensorDataset\n"
        "from fedx.data import DatasetSpec\n" + body
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("own_data", None)
    return "own_data"


def test_what_does_not_load_or_fit_stops_the_run_with_the_reason(tmp_path, monkeypatch):
    module = _spec_module(
        tmp_path,
        monkeypatch,
        """
class Rows(TensorDataset):
    def __init__(self, x, y, targets):
        super().__init__(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y))
        if targets is not None:
            self.targets = targets

def rows(n=40, features=4, labels=None, targets=True):
    y = np.arange(n) % 3 if labels is None else labels
    return Rows(np.ones((n, features)), y, y if targets else None)

def fails(split, source):
    raise KeyError("column 'x'")

GOOD = DatasetSpec((4,), 3, lambda split, source: rows())
NO_TARGETS = DatasetSpec((4,), 3, lambda split, source: rows(targets=False))
BAD_LABELS = DatasetSpec((4,), 3, lambda split, source: rows(labels=np.arange(40) % 5))
BAD_SHAPE = DatasetSpec((5,), 3, lambda split, source: rows())
FAILS = DatasetSpec((4,), 3, fails)
MISSING = DatasetSpec((4,), 3, lambda split, source: open(source.root + "/none.csv"))
NOT_A_SPEC = {"input_shape": (4,)}

def model(shape, classes):
    return torch.nn.Linear(shape[0], classes)

def broken_model(shape, classes):
    raise RuntimeError("no weights here")

def not_a_model(shape, classes):
    return "linear"
""",
    )

    def run_config(**keys):
        return RunConfig.from_mapping({"model": f"{module}:model", **keys})

    cfg = run_config(dataset=f"{module}:GOOD")
    check_data_and_model(cfg)
    assert len(load_split(cfg.dataset, "train", **cfg.data_settings())) == 40

    def loading(name: str) -> str:
        with pytest.raises((ValueError, FileNotFoundError)) as error:
            load_split(f"{module}:{name}", "train", root=str(tmp_path))
        return str(error.value)

    assert "it has no 'targets' attribute" in loading("NO_TARGETS")
    assert "labels must be integers in [0, 3), got int64 from 0 to 4" in loading("BAD_LABELS")
    assert "an input has shape (4,), its spec says (5,)" in loading("BAD_SHAPE")
    assert "loading its train split failed: KeyError: \"column 'x'\"" in loading("FAILS")
    assert "none.csv" in loading("MISSING")
    for value, reason in (
        (f"{module}:NOT_A_SPEC", "is a dict, not a fedx.data.DatasetSpec"),
        (f"{module}:NOPE", f"module {module} has no attribute 'NOPE'"),
        ("no_such_package.data:SPEC", "cannot import no_such_package.data: ModuleNotFoundError"),
    ):
        with pytest.raises(ConfigError) as error:
            run_config(dataset=value)
        assert str(error.value).startswith(f"invalid run config dataset={value!r}: must be one of")
        assert reason in str(error.value)
    with pytest.raises(ConfigError, match="model 'own_data:not_a_model' returned a str"):
        check_data_and_model(run_config(dataset=f"{module}:GOOD", model=f"{module}:not_a_model"))
    with pytest.raises(ConfigError, match="RuntimeError: no weights here"):
        check_data_and_model(run_config(dataset=f"{module}:GOOD", model=f"{module}:broken_model"))


def test_natural_partitions_need_a_data_set_with_users(tmp_path, monkeypatch):
    module = _spec_module(
        tmp_path,
        monkeypatch,
        """
class ByUser(TensorDataset):
    def __init__(self):
        super().__init__(torch.ones(30, 2), torch.arange(30) % 2)
        self.targets = np.arange(30) % 2
        self.users = ["ann", "bob", "cy"]
        self.user_index = np.arange(30) // 10

WITH_USERS = DatasetSpec((2,), 2, lambda split, source: ByUser(), users=True)
WITHOUT = DatasetSpec((2,), 2, lambda split, source: ByUser())
""",
    )
    keys = {"model": "fedx.models:CNN", "partitioning": "natural"}
    with pytest.raises(ConfigError, match=r"dataset='own_data:WITHOUT' has no users"):
        check_data_and_model(RunConfig.from_mapping({**keys, "dataset": f"{module}:WITHOUT"}))
    cfg = RunConfig.from_mapping({**keys, "dataset": f"{module}:WITH_USERS"})
    shares = [load_partition(cfg.dataset, i, 3, **cfg.partition_settings()) for i in range(3)]
    assert [share.indices.tolist() for share in shares] == [
        list(range(user * 10, user * 10 + 10)) for user in range(3)
    ]


def test_the_clientapp_imports_a_data_set_of_ones_own_only_for_a_run_that_names_it(files):
    code = (
        "import sys\n"
        "import fedx.client_app\n"
        "from fedx.config import RunConfig\n"
        "RunConfig.from_mapping({})\n"
        "assert 'fedx_tabular' not in sys.modules, 'imported for a digits run'\n"
        f"RunConfig.from_mapping({{'dataset': {DATASET!r}, 'model': {MODEL!r}}})\n"
        "assert 'fedx_tabular.data' in sys.modules and 'fedx_tabular.prepare' not in sys.modules\n"
        "assert 'sklearn' not in sys.modules, 'the loader imports only what it reads with'\n"
    )
    run_python(code, EXAMPLE)


def test_split_source_is_what_a_loader_gets(files, example_on_path):
    del example_on_path
    seen = []

    def load(split, source):
        seen.append((split, source))
        return Table(np.zeros((4, 3)), np.array([0, 1, 0, 1]))

    spec = DatasetSpec((3,), 2, load)
    components = {registry.DATASET_GROUP: {"spy": spec}, registry.MODEL_GROUP: {}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_REGISTERED_COMPONENTS", components)
        load_split("spy", "test", root="relative/folder", seed=7, test_fraction=0.3)
        load_split("spy", "test", root="relative/folder", seed=7, test_fraction=0.3)
    assert len(seen) == 1  # loaded once per process and settings
    split, source = seen[0]
    assert split == "test" and isinstance(source, SplitSource)
    assert source.root.endswith("/relative/folder") and source.root.startswith("/")
    assert (source.seed, source.test_fraction) == (7, 0.3)
