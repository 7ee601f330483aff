"""From a checked run config to a strategy, and the checks that need several keys.

Every method is built the same way (:func:`build_strategy`): its
constructor gets the values of the app keys it takes and of its own keys
(:meth:`fedx.config.RunConfig.arguments`), plus the parts the app builds for
it (``components``). The constructor checks its arguments; its error
becomes the one-line config error that names the key.
"""

from logging import WARNING

import torch
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedx.checks import ArgumentError
from fedx.config import APP_BY_NAME, ConfigError, RunConfig, invalid
from fedx.data import LEAF_DATASETS, dataset_has_users, dataset_info, load_split
from fedx.data.personalized import MIN_LOCAL_SAMPLES
from fedx.messaging import wait_for_nodes
from fedx.method import resolve
from fedx.models import build_model


def build_strategy(cfg: RunConfig) -> Strategy:
    """Build the strategy of the method the ``strategy`` key names.

    Raises
    ------
    ConfigError
        When the strategy rejects a value or a combination of values (for
        example a starting value above the final one), or the data
        and model keys do not fit together (:func:`check_data_and_model`).
        Reads no data.
    """
    method = cfg.method
    check_data_and_model(cfg)
    if method.personalized and cfg.min_partition_size < MIN_LOCAL_SAMPLES:
        raise invalid(
            APP_BY_NAME["min-partition-size"],
            cfg.min_partition_size,
            f"an integer >= {MIN_LOCAL_SAMPLES} for strategy={cfg.strategy!r} (every client "
            "needs train, validation and test samples)",
        )
    if not method.checks_arguments:
        for key in method.keys:
            if not key.allowed.accepts(cfg[key.name]):
                raise invalid(key, cfg[key.name])
    arguments = cfg.arguments(method)
    try:
        components = resolve(method.components)(cfg) if method.components is not None else {}
        return method.strategy(**arguments, **components)
    except ArgumentError as err:
        key = cfg.key_for(err.argument, method)
        if key is None:
            raise ConfigError(f"strategy={cfg.strategy!r}: {err}") from None
        # A key whose value is parsed is described by its run-config form.
        raise invalid(key, cfg[key.name], key.allowed.text if key.parse else err.allowed) from None
    except ValueError as err:
        raise ConfigError(f"strategy={cfg.strategy!r}: {err}") from None


def prepare_data(cfg: RunConfig) -> None:
    """Load what the method needs on the server before round 1 (its ``prepare``).

    Raises
    ------
    ConfigError
        When that data is missing or unreadable.
    """
    prepare = cfg.method.prepare
    if prepare is None:
        return
    try:
        resolve(prepare)(cfg)
    except (OSError, ValueError) as err:
        raise ConfigError(f"dataset={cfg.dataset!r}: {err}") from None


def check_data_and_model(cfg: RunConfig) -> None:
    """Reject data and model keys that are valid alone but not together.

    Raises
    ------
    ConfigError
        When ``partitioning = "natural"`` is asked of a dataset without users
        (not LEAF, nor one of another package that has them), or a model of
        the run (``model``, or the method's ``model_key``) cannot read the
        dataset's inputs (``lstm`` on images, an image model on Shakespeare,
        a VGG on 28x28 FEMNIST, a model of one's own whose builder fails).
    """
    if cfg.partitioning == "natural" and not dataset_has_users(cfg.dataset):
        raise ConfigError(
            f"invalid run config partitioning='natural': it makes every user of a LEAF dataset "
            f"({', '.join(LEAF_DATASETS)}) or of a DatasetSpec with users=True one client; "
            f"dataset={cfg.dataset!r} has no users"
        )
    info = dataset_info(cfg.dataset)
    key = cfg.method.model_key
    for name in cfg.models:
        try:
            with torch.device("meta"):  # checks the shapes without allocating any weights
                build_model(name, info.input_shape, info.num_classes)
        except ValueError as err:
            raise ConfigError(
                f"invalid run config {key}={cfg[key]!r} for dataset={cfg.dataset!r}: {err}"
            ) from None


def require_nodes(grid: Grid, minimum: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for ``minimum`` connected nodes; return how many there are.

    Raises
    ------
    ConfigError
        When fewer nodes are connected after the timeout.
    """
    connected = len(wait_for_nodes(grid, minimum, timeout))
    if connected < minimum:
        raise ConfigError(
            f"min-available-nodes={minimum} but only {connected} node(s) connected "
            f"after node-wait-timeout={timeout:g}s: start more SuperNodes or lower "
            "min-available-nodes"
        )
    return connected


def check_natural_clients(cfg: RunConfig, connected: int) -> None:
    """Compare the connected nodes with the clients of ``partitioning = "natural"``.

    Every selected LEAF user is one client, so a simulation needs exactly
    that many SuperNodes (each node's ``num-partitions`` is the federation's
    node count, and a client whose ``num-partitions`` differs fails). More
    nodes than users is an error; fewer is logged, as a deployment may run
    some clients only.

    Raises
    ------
    ConfigError
        When more nodes are connected than users are selected, or the LEAF
        files are missing or do not yield the users asked for.
    """
    if cfg.partitioning != "natural":
        return
    try:
        users = len(load_split(cfg.dataset, "train", **cfg.data_settings()).users)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"dataset={cfg.dataset!r}: {err}") from None
    message = (
        f"partitioning='natural' makes each of the {users} selected {cfg.dataset} users "
        f"(leaf-users={cfg.leaf_users}) one client, but {connected} nodes are connected"
    )
    if connected > users:
        raise ConfigError(f"{message}: run {users} SuperNodes (num-supernodes={users})")
    if connected < users:
        log(
            WARNING,
            "fedx: %s; nodes need num-partitions=%d, and the other users never train",
            message,
            users,
        )
