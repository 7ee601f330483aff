"""The Ray that the simulation runs on: starting or joining it, and its nodes as the actor pool sees them.

:func:`check_cluster_address` refuses a ``RAY_ADDRESS`` where nothing
listens (Ray itself retries for many minutes); :func:`start_local_ray`
starts a Ray on this machine without the runtime env Flower gives it (see
there); :func:`live_nodes` and :func:`actors_per_node` say where ClientApp
actors fit, by Flower's sizing rule.
"""

import math
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import ray

# How long to wait for a TCP connection to the cluster's address.
CONNECT_TIMEOUT = 10.0
# Flower's federation config names two resources; Ray's node resources call them so.
RESOURCE_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU"}


def check_cluster_address(address: str | None, timeout: float = CONNECT_TIMEOUT) -> None:
    """Fail at once when ``address`` (``RAY_ADDRESS``) names a host:port where nothing listens.

    Ray itself retries a dead address for many minutes. ``auto``/``local``
    and an unset address are Ray's to resolve (they fail fast).

    Raises
    ------
    ConnectionError
        Naming the address and what to do.
    """
    if not address or address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConnectionError(
            f"RAY_ADDRESS={address!r} is not <host>:<port> (the head's GCS address, port 6379 by default)"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConnectionError(
            f"RAY_ADDRESS={address!r}: no Ray cluster answers there ({err or type(err).__name__}). "
            "Start its head with `ray start --head` and use the address it prints, "
            "or unset RAY_ADDRESS to simulate on this machine alone"
        ) from None


def starts_own_ray(address: str) -> bool:
    """Whether ``ray.init(address=address or None)`` starts a Ray rather than joining one.

    Ray joins the cluster that ``RAY_ADDRESS`` or ``address`` names, or one
    that ``ray start`` left running on this machine; only a Ray it starts
    takes settings (``_system_config``). False when that cannot be told.
    """
    try:
        from ray._private import services  # pylint: disable=import-outside-toplevel

        return services.canonicalize_bootstrap_address(address or None) is None
    except Exception:  # pylint: disable=broad-exception-caught
        return False


def start_local_ray(init_args: dict[str, Any]) -> None:
    """Start Ray here as Flower's backend does, with the app's path in the environment only.

    Flower's ``RayBackend.init_ray`` puts this process's ``sys.path`` into
    its environment's ``PYTHONPATH`` and passes it to the workers as a
    runtime env as well (``env_vars``). A Ray started here inherits the
    environment, so there the runtime env only costs: every worker starts
    through Ray's ``setup_worker.py`` (a second interpreter start and import
    of Ray) once the runtime-env agent has prepared it, and the workers Ray
    prestarts as it starts (one per CPU, without the runtime env) cannot
    host the actors, so they start for nothing while the actors' own start.
    A cluster (``RAY_ADDRESS``) keeps Flower's runtime env: its workers run
    elsewhere.
    """
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    ray.init(**{"include_dashboard": False, **init_args})


def actors_per_node(resources: dict[str, float], client_resources: dict[str, float]) -> int:
    """How many ClientApp actors fit on a node: Flower's rule (``pool_size_from_resources``)."""
    fits = math.inf
    for key, name in RESOURCE_NAMES.items():
        need = float(client_resources.get(key, 0.0))
        if need > 0:
            # Ray counts resources in units of 1e-4: 0.9 / 0.3 is 3, not 2.9999.
            fits = min(fits, math.floor(resources.get(name, 0.0) / need + 1e-6))
    return 0 if math.isinf(fits) else int(fits)


def node_death_time() -> float:
    """The longest Ray takes to declare a silent node dead, by its health-check settings.

    As this process sees them: the head's own settings may differ.
    """
    try:
        config = ray._config  # pylint: disable=protected-access
        checks = config.health_check_period_ms() + config.health_check_timeout_ms()
        return (
            config.health_check_initial_delay_ms()
            + config.health_check_failure_threshold() * checks
        ) / 1000
    except (AttributeError, TypeError):
        return 70.0  # Ray 2.55's defaults: 5 s, then 5 checks of up to 3 + 10 s


@dataclass
class Node:
    """A live Ray node as the pool sees it."""

    node_id: str
    address: str
    resources: dict[str, float]

    @property
    def label(self) -> str:
        """The node's address and the start of its id (a restarted node keeps its address)."""
        return f"{self.address} ({self.node_id[:8]})"


def live_nodes() -> dict[str, Node]:
    """The cluster's live nodes, by node id, from Ray's GCS."""
    return {
        info["NodeID"]: Node(
            info["NodeID"], info.get("NodeManagerAddress", "?"), dict(info.get("Resources") or {})
        )
        for info in ray.nodes()
        if info.get("Alive")
    }


def capacity(nodes: dict[str, Node], client_resources: dict[str, float]) -> int:
    """How many ClientApp actors of ``client_resources`` the ``nodes`` have room for."""
    return sum(actors_per_node(node.resources, client_resources) for node in nodes.values())


def resources_text(client_resources: dict[str, float]) -> str:
    """``num_cpus=1, num_gpus=0.5``: one ClientApp's resources, for log lines and errors."""
    return ", ".join(f"{key}={value:g}" for key, value in client_resources.items())


def nodes_text(nodes: dict[str, Node], client_resources: dict[str, float]) -> str:
    """The nodes, their resources and their room for ClientApp actors, in one line."""
    parts = [
        f"{node.address} ({node.resources.get('CPU', 0):g} CPU, {node.resources.get('GPU', 0):g} GPU: "
        f"room for {actors_per_node(node.resources, client_resources)})"
        for node in sorted(nodes.values(), key=lambda n: n.address)
    ]
    return f"{len(nodes)} Ray node{'s' if len(nodes) != 1 else ''}: " + ", ".join(parts)


def too_small(nodes: dict[str, Node], client_resources: dict[str, float]) -> str:
    """The error of a cluster none of whose nodes can host one ClientApp actor."""
    return (
        f"no Ray node can host a ClientApp with {resources_text(client_resources)}: the cluster has "
        f"{nodes_text(nodes, client_resources)}. Ask for less (--federation-config "
        f"'client-resources-num-cpus=... client-resources-num-gpus=...') or add nodes that have it"
    )
