"""The app's run configuration: the app's own keys, and every method's through the registry.

Flower merges ``--run-config`` overrides into the defaults of
``pyproject.toml`` (``[tool.flwr.app.config]``, written from these
declarations by ``python -m fedx.reference``). :meth:`RunConfig.from_mapping`
reads a run config once, on the server and on every client, and fails with
one line that names the key, the bad value and what is allowed.

Two kinds of keys:

* the app's own (data, model, local training, sampling, evaluation, outputs),
  declared below as the fields of :class:`RunConfig` and checked here;
* a method's own (``<method>-alpha``), declared by the method
  (:mod:`fedx.method`, found by :mod:`fedx.registry`). Its value is checked
  here whichever method runs, and again by the strategy's constructor when
  the strategy is built (:func:`fedx.server.building.build_strategy`, which
  turns the constructor's error into the same one-line message).

Importing this module imports neither torch nor the data sets: the lists of
models and data sets are read from :mod:`fedx.models` and :mod:`fedx.data`
when a run config is checked. ``dataset`` and ``model`` also take a data set
or a model of another package (``package.module:NAME``, or the name of an
installed entry point), loaded when the run config is checked, so that a
name that loads nothing stops the run at its start with the reason.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedx.checks import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    PROPER_FRACTION,
    UNIT_INTERVAL,
    Allowed,
    Flag,
    Integer,
    Number,
    OneOf,
    Rule,
    Text,
)
from fedx.components import (
    Component,
    dataset_names,
    devices,
    find_dataset,
    find_model,
    model_names,
    partitionings,
)
from fedx.method import Key, Method, comma_list
from fedx.registry import (
    DATASET_GROUP,
    MODEL_GROUP,
    UnknownMethod,
    all_methods,
    builtin_methods,
    get_method,
    method_names,
)


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


def _app(default: Any, allowed: Allowed, help_text: str, argument: str | None = None) -> Any:
    """A field of :class:`RunConfig`: one of the app's own keys."""
    return field(default=default, metadata={"key": (allowed, help_text, argument)})


# pylint: disable=too-many-instance-attributes
@dataclass(frozen=True)
class RunConfig:
    """A checked run configuration.

    The app's keys are attributes (``seed``, ``num_server_rounds``: the key in
    snake_case); every key, the methods' included, is ``config["key-name"]``.
    Build one with :meth:`from_mapping`; ``RunConfig()`` holds the defaults.
    """

    strategy: str = _app(
        "fedmr", OneOf(method_names), "the server strategy (a registered method, see below)"
    )
    num_server_rounds: int = _app(20, Integer(1), "rounds")
    seed: int = _app(
        0,
        Integer(0),
        "drives node sampling, partitions, the digits test split, model init and every "
        "method's randomness (recombination, mutation, exchanges)",
        "seed",
    )
    deterministic: bool = _app(
        False,
        Flag(),
        "deterministic kernels on every client and the server (torch.use_deterministic_algorithms, "
        "cuDNN benchmark off, CUBLAS_WORKSPACE_CONFIG=:4096:8): a seeded run on a GPU repeats bit "
        "for bit; CPU runs repeat without it",
    )
    device: str = _app(
        "auto",
        OneOf(devices),
        "where clients train and the server evaluates: `auto` = a GPU where the process sees "
        "one, else the CPU; `cpu`; `cuda` (a client without a GPU fails its messages)",
    )
    client_group_size: int = _app(
        1,
        Integer(1),
        "simulation only: a ClientApp actor trains up to this many of a round's clients as one "
        "batched step (torch.func over their stacked weights; each client's result is its own "
        "training's); 1 = one client at a time. Clients whose model cannot be batched (an LSTM) "
        "or whose method trains its own way train one by one",
    )
    fraction_train: float = _app(
        1.0,
        FRACTION,
        "fraction of connected nodes sampled per round (fixes K in round 1)",
        "fraction_train",
    )
    min_train_nodes: int = _app(
        2,
        Integer(1),
        "at least this many nodes per round (a method may need more)",
        "min_train_nodes",
    )
    min_available_nodes: int = _app(
        2, Integer(1), "nodes to wait for at start and before each round", "min_available_nodes"
    )
    fraction_evaluate: float = _app(
        0.0,
        UNIT_INTERVAL,
        "federated evaluation (each node on its share of the test split); 0 = off, the server "
        "evaluates centrally. Personalized methods always evaluate every client",
        "fraction_evaluate",
    )
    min_evaluate_nodes: int = _app(
        2, Integer(0), "at least this many nodes for federated evaluation", "min_evaluate_nodes"
    )
    node_wait_timeout: float = _app(
        60.0, POSITIVE, "seconds to wait for `min-available-nodes`", "node_wait_timeout"
    )
    round_timeout: float = _app(600.0, POSITIVE, "seconds a round waits for replies")
    dataset: str = _app(
        "digits",
        Component("dataset", DATASET_GROUP, dataset_names, find_dataset),
        "data set: fedx's, or one of your own, a `fedx.data.DatasetSpec` "
        "([Your own data and model](own-data.md))",
    )
    data_root: str = _app(
        "data",
        Text(),
        "where torchvision data sets live, LEAF's `<dataset>/data/{train,test}/`, and the files "
        "of a data set of your own (its loader gets it as an absolute path)",
    )
    download: bool = _app(
        False, Flag(), "let torchvision download CIFAR (LEAF data is never downloaded)"
    )
    partitioning: str = _app(
        "dirichlet",
        OneOf(partitionings),
        "label partitioning (flwr-datasets partitioners); `dirichlet-size-label`: sizes from "
        "Dir(`size-alpha`), labels from Dir(`dirichlet-alpha`) (Matsuda et al.); `natural` "
        "(LEAF only): one client per selected user, `num-partitions` = their number",
    )
    dirichlet_alpha: float = _app(
        1.0, POSITIVE, "label Dirichlet concentration (smaller = more skewed)"
    )
    min_partition_size: int = _app(
        10,
        Integer(0),
        "resample Dirichlet partitions smaller than this (`dirichlet-size-label`: every "
        "partition gets this many first); personalized methods need at least 3",
    )
    test_fraction: float = _app(
        0.2, PROPER_FRACTION, "digits only: held-out test share (stratified)"
    )
    leaf_users: int = _app(
        0,
        Rule(
            int,
            lambda v: v >= 0,
            "0 (every user with more than leaf-min-samples) or an integer >= 1",
        ),
        "LEAF: users drawn by `seed` (sorted ids, seeded sample); 0 = every eligible user",
    )
    leaf_min_samples: int = _app(
        0,
        Integer(0),
        "LEAF: a user needs more than this many samples (train + test, LEAF's `-k`)",
    )
    model: str = _app(
        "cnn",
        Component("model", MODEL_GROUP, model_names, find_model),
        "FedAvg-paper CNN, CIFAR ResNet-20, VGG-16 with a small-input head, LEAF's Shakespeare "
        "LSTM; the CNN with 1-4 conv blocks, other VGG depths; or a function "
        "`(input_shape, num_classes) -> torch.nn.Module` of your own",
    )
    learning_rate: float = _app(0.05, POSITIVE, "local SGD learning rate (papers: 0.01)")
    momentum: float = _app(0.9, Number(0.0, 1.0, high_open=True), "SGD momentum")
    weight_decay: float = _app(0.0, NON_NEGATIVE, "SGD weight decay")
    batch_size: int = _app(50, Integer(1), "local batch size")
    local_epochs: int = _app(5, Integer(1), "local epochs per round")
    size_alpha: float = _app(
        10.0,
        POSITIVE,
        "size Dirichlet concentration of `dirichlet-size-label` (smaller = more unequal sizes)",
    )
    unlabeled_size: int = _app(
        0,
        Rule(int, lambda v: v >= 0, "0 (the dataset's default) or an integer >= 1"),
        "personalized methods: training images held out as the server's unlabeled set; "
        "0 = 1000, 200 for digits",
    )
    local_test_fraction: float = _app(
        0.2,
        PROPER_FRACTION,
        "personalized methods: share of each client's data that is its test split",
    )
    local_validation_fraction: float = _app(
        0.2, PROPER_FRACTION, "personalized methods: share of the rest that is its validation split"
    )
    eval_every: int = _app(
        1,
        Integer(1),
        "central (and personalized) evaluation every this many rounds (and the last)",
        "evaluate_every",
    )
    divergence_rounds: int = _app(
        3,
        Integer(0),
        "stop the run (`stop-reason` in metrics.json) after this many consecutive rounds in "
        "which training replies came back but every one was invalid (NaN, Inf...); 0 = never",
    )
    divergence_nonfinite: bool = _app(
        True,
        Flag(),
        "stop the run when the global model or its central loss is NaN or infinite",
    )
    divergence_loss_ratio: float = _app(
        1000.0,
        NON_NEGATIVE,
        "stop the run when the central loss exceeds this multiple of the initial model's; 0 = never",
    )
    run_name: str = _app(
        "", Text(), "output folder name; empty = `<strategy>-<dataset>-<model>-<time>`"
    )
    output_dir: str = _app("outputs", Text(), "where run folders go")
    # "" starts a new run; a run directory (or its checkpoint.json) continues it, and
    # num-server-rounds set along with it extends it (fedx.server.resume).
    resume_from: str = _app(
        "",
        Text(),
        "continue an interrupted run from its directory (or its `checkpoint.json`), or extend a "
        "finished one with a larger `num-server-rounds`; empty = a new run",
    )
    #: The methods' keys, by run-config name.
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> "RunConfig":
        """Check a Flower run config and return it typed.

        A key the run config lacks takes its declared default. Every key is
        checked against what it allows, whichever method runs; the method's
        constructor checks its own arguments again (and how they combine, see
        :func:`fedx.server.building.build_strategy`).

        Raises
        ------
        ConfigError
            On an unknown key, a value of the wrong type, an app key out of
            range, or a method key set for a method that does not use it
            (a key declared ``exclusive``, set for another method).
        """
        known = {key.name: key for key in _all_keys()}
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown run-config key(s) {unknown}; known keys: {', '.join(known)}"
            )
        app: dict[str, Any] = {}
        for key in APP_KEYS:
            value = run_config.get(key.name, key.default)
            if not key.allowed.accepts(value):
                raise invalid(key, value)
            app[key.name.replace("-", "_")] = _typed(key, value)
        try:
            method = get_method(app["strategy"])
        except UnknownMethod as err:
            raise ConfigError(f"invalid run config strategy={app['strategy']!r}: {err}") from None
        options: dict[str, Any] = {}
        for key in _method_keys(tuple(builtin_methods()) + (method,)):
            options[key.name] = run_config.get(key.name, key.default)
        for name, value in run_config.items():
            if name not in options and name not in APP_BY_NAME:
                options[name] = value  # a key of another installed method, as given
        for name, value in options.items():
            # Every method's keys, not only the running method's: a value
            # that would stop the run after a switch of strategy stops it now.
            key = known[name]
            if not key.allowed.accepts(value):
                raise invalid(key, value)
            options[name] = _typed(key, value)
            if key.exclusive and value != key.default and key not in method.keys:
                users = [m.name for m in all_methods() if key in m.keys]
                raise ConfigError(
                    f"{name}={_toml(value)} needs strategy={' or '.join(map(repr, users))}, "
                    f"got strategy={method.name!r}"
                )
        return cls(**app, options=options)

    def __getitem__(self, name: str) -> Any:
        """The value of any key by its run-config name (a method's key: its default if unset)."""
        if name in APP_BY_NAME:
            return getattr(self, name.replace("-", "_"))
        if name in self.options:
            return self.options[name]
        key = next((key for key in _all_keys() if key.name == name), None)
        if key is None:
            raise KeyError(name)
        return key.default

    @property
    def method(self) -> Method:
        """The method ``strategy`` names."""
        return get_method(self.strategy)

    @property
    def personalized(self) -> bool:
        """Whether the method is evaluated per client (and its clients hold personalized splits)."""
        return self.method.personalized

    @property
    def models(self) -> tuple[str, ...]:
        """The architectures this run builds (``model``, or the method's ``model_key``)."""
        return comma_list(str(self[self.method.model_key]))

    def to_dict(self) -> dict[str, Any]:
        """Every key with its value, by run-config (kebab-case) name."""
        values = {key.name: self[key.name] for key in APP_KEYS}
        return {**values, **self.options}

    def data_settings(self) -> dict[str, Any]:
        """The loader arguments that decide which samples a split holds (server and clients)."""
        return self._arguments(_DATA_ARGUMENTS)

    def partition_settings(self) -> dict[str, Any]:
        """How the training data is shared out (:func:`fedx.data.load_partition`)."""
        return self._arguments(_DATA_ARGUMENTS + _PARTITION_ARGUMENTS)

    def local_split_settings(self) -> dict[str, Any]:
        """The personalized layout's arguments (:func:`fedx.data.load_local_splits`)."""
        return self._arguments(_DATA_ARGUMENTS + _PARTITION_ARGUMENTS + _LOCAL_SPLIT_ARGUMENTS)

    def _arguments(self, names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        return {argument: getattr(self, field_name) for argument, field_name in names}

    def arguments(self, method: Method | None = None) -> dict[str, Any]:
        """The constructor arguments of ``method`` (default: this run's) from this run config.

        The app keys it ``takes`` and its own keys, parsed (``"10,15"`` is
        ``(10, 15)``); not the ``components`` the app builds.

        Raises
        ------
        ConfigError
            When a key's value cannot be parsed.
        """
        method = method or self.method
        arguments: dict[str, Any] = {}
        for name in method.takes:
            key = APP_BY_NAME[name]
            assert key.argument is not None, f"{name} feeds no constructor argument"
            arguments[key.argument] = self[name]
        for key in method.keys:
            assert key.argument is not None, f"{key.name} feeds no constructor argument"
            try:
                arguments[key.argument] = key.argument_value(self[key.name])
            except ValueError:
                raise invalid(key, self[key.name]) from None
        return arguments

    def key_for(self, argument: str, method: Method | None = None) -> Key | None:
        """The key whose value feeds constructor ``argument`` of ``method``."""
        method = method or self.method
        own = method.key(argument)
        if own is not None:
            return own
        return next(
            (APP_BY_NAME[name] for name in method.takes if APP_BY_NAME[name].argument == argument),
            None,
        )


# (loader argument, field): what the data loaders take from a run config.
_DATA_ARGUMENTS = (
    ("root", "data_root"), ("download", "download"), ("seed", "seed"),
    ("test_fraction", "test_fraction"), ("leaf_users", "leaf_users"),
    ("leaf_min_samples", "leaf_min_samples"),
)  # fmt: skip
_PARTITION_ARGUMENTS = (
    ("partitioning", "partitioning"), ("alpha", "dirichlet_alpha"),
    ("min_partition_size", "min_partition_size"),
)  # fmt: skip
_LOCAL_SPLIT_ARGUMENTS = (
    ("size_alpha", "size_alpha"), ("unlabeled", "unlabeled_size"),
    ("local_test_fraction", "local_test_fraction"),
    ("local_validation_fraction", "local_validation_fraction"),
)  # fmt: skip


def invalid(key: Key, value: Any, allowed: str | None = None) -> ConfigError:
    """The one-line error for a bad value of ``key`` (with the reason, for a data set or model)."""
    reason = key.allowed.reason(value) if isinstance(key.allowed, Component) else None
    return ConfigError(
        f"invalid run config {key.name}={value!r}: must be {allowed or key.allowed.text}"
        + (f" ({reason})" if reason else "")
    )


def _typed(key: Key, value: Any) -> Any:
    return float(value) if key.allowed.kind is float else value


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _method_keys(methods: tuple[Method, ...]) -> list[Key]:
    """The keys of ``methods``, each once, in order; two keys of one name must be one object."""
    keys: dict[str, Key] = {}
    for method in methods:
        for key in method.keys:
            known = keys.get(key.name)
            if known is not None and known is not key:
                raise ValueError(f"two declarations of run-config key {key.name!r}")
            if key.name in APP_BY_NAME:
                raise ValueError(f"method {method.name} declares the app's key {key.name!r}")
            keys[key.name] = key
    return list(keys.values())


def _all_keys() -> list[Key]:
    """The app's keys, then every registered method's."""
    return [*APP_KEYS, *_method_keys(all_methods())]


def builtin_keys() -> list[Key]:
    """The app's keys, then fedx's own methods' (what ``pyproject.toml`` lists)."""
    return [*APP_KEYS, *_method_keys(builtin_methods())]


#: The app's own keys, in the order of the fields of :class:`RunConfig`.
APP_KEYS: tuple[Key, ...] = tuple(
    Key(f.name.replace("_", "-"), f.default, *f.metadata["key"])
    for f in dataclasses.fields(RunConfig)
    if "key" in f.metadata
)
APP_BY_NAME: dict[str, Key] = {key.name: key for key in APP_KEYS}
