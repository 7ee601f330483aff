"""fedx's Ray backend: Flower's ``RayBackend`` with fedx's actor pool in place of its ``BasicActorPool``.

:class:`ClusterRayBackend` keeps Flower's backend configuration
(``client_resources``, ``init_args``, ``actor``) and its ``ray.init``
(attaching to the cluster named by ``RAY_ADDRESS``), and runs the
ClientApps on :class:`fedx.simulation.pool.ActorPool`. It refuses a
``RAY_ADDRESS`` where nothing listens, and a cluster where no node can host
one ClientApp, with a clear error where Ray would retry for many minutes. A
Ray it starts itself passes objects up to :data:`INLINE_OBJECT_BYTES`
inline in Ray calls rather than through its shared-memory object store (a
model travels to a ClientApp actor and back in every message, and for a
model the size of digits' CNN that round trip is faster inline:
docs/results.md, "Inside the simulation"; a cluster that is already running
keeps its own settings), and
gets the app's path from the environment rather than as a runtime env
(:func:`fedx.simulation.ray_cluster.start_local_ray`).

Where the run config's ``client-group-size`` is above 1, a round's training
messages run in client groups, several on one actor
(:mod:`fedx.simulation.groups`).

Flower's engine builds this backend where :func:`fedx.simulation.install`
put it (:mod:`fedx.flower.ray_backend`).
"""

import os
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

import ray
from flwr.app import Context, Message, MessageType
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.common.constant import PARTITION_ID_KEY

from fedx.flower.ray_backend import BackendConfig, FlowerRayBackend
from fedx.simulation import groups
from fedx.simulation.actor import ClientAppActor
from fedx.simulation.pool import ActorPool
from fedx.simulation.ray_cluster import check_cluster_address, start_local_ray, starts_own_ray

# Objects up to this size travel inline in Ray calls (Ray's default: 100 KiB) when
# this backend starts Ray: a round trip of a model of up to about 2 MB each way is
# faster inline than through the object store, while a model several times larger
# is faster through the store (docs/results.md, "Inside the simulation", has the
# digits CNN's round trip).
INLINE_OBJECT_BYTES = 2 << 20


#: A run can take on this many more concurrent ClientApps than its cluster had
#: at the start (or twice as many, if that is more): Flower's engine starts its
#: worker threads once. An idle worker thread costs next to nothing.
JOIN_HEADROOM = 32


class ClusterRayBackend(FlowerRayBackend):
    """Flower's ``RayBackend`` with :class:`~fedx.simulation.pool.ActorPool` in place of its ``BasicActorPool``.

    Same backend config (``client_resources``, ``init_args``, ``actor``),
    same ``ray.init`` (attaches to the cluster named by ``RAY_ADDRESS``).
    """

    #: Modules every actor imports when it starts (set by :func:`fedx.simulation.install`).
    actor_preload: tuple[str, ...] = ()
    #: ``"module:function"`` that answers a client group's training messages in an actor
    #: (:func:`fedx.client.groups.train_messages`); empty: no groups (set by ``install``).
    group_handler: str = ""

    def init_ray(self, backend_config: BackendConfig) -> None:
        if not ray.is_initialized():
            init_args = dict(backend_config.get(self.init_args_key) or {})
            address = str(init_args.get("address") or os.environ.get("RAY_ADDRESS") or "")
            check_cluster_address(address)
            if starts_own_ray(address):
                # A Ray started here: pass models inline (a running cluster keeps its settings).
                system_config = dict(init_args.get("_system_config") or {})
                system_config.setdefault("max_direct_call_object_size", INLINE_OBJECT_BYTES)
                init_args["_system_config"] = system_config
                start_local_ray(init_args)
                return
        super().init_ray(backend_config)

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        if float(self.client_resources.get("num_cpus", 0)) <= 0:
            raise ValueError(
                f"client-resources-num-cpus must be > 0 in the federation config, got {self.client_resources}"
            )
        resources, actor_kwargs = dict(self.client_resources), dict(self.actor_kwargs)
        self.pool = ActorPool(
            resources,
            lambda: ClientAppActor.options(**resources).remote(**actor_kwargs),
            app_fn,
            self.actor_preload,
        )
        self.app_fn = app_fn
        self._group_sizes: dict[int, int] = {}
        groups.COLLECTOR.configure(
            lambda: self.pool.capacity if self.pool else 1, lambda: self.num_workers
        )

    @property
    def num_workers(self) -> int:
        if self.pool is None:
            return 0
        capacity = self.pool.capacity
        return capacity + max(capacity, JOIN_HEADROOM)

    def is_worker_idle(self) -> bool:
        return self.pool is not None and self.pool.idle > 0

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        if self.pool is None or self.app_fn is None:
            raise ValueError("build() the backend before it processes messages")
        app_fn, partition_id = self.app_fn, str(context.node_config[PARTITION_ID_KEY])

        def run_one(message: Message, context: Context) -> tuple[Message, Context]:
            assert self.pool is not None
            _, out_message, updated_context = self.pool.run(
                lambda actor: actor.run.remote(app_fn, message, partition_id, context)
            )
            return out_message, updated_context

        group_size = self._group_size(message, context)
        if group_size > 1 and message.metadata.message_type == MessageType.TRAIN:
            return groups.COLLECTOR.run(
                message, context, int(partition_id), group_size, self._run_group, run_one
            )
        groups.COLLECTOR.arrived(message)
        return run_one(message, context)

    def _run_group(
        self, messages: list[Message], contexts: list[Context]
    ) -> list[tuple[Any, Context]]:
        """A client group's messages on one actor: per message, its reply (or error) and context."""
        assert self.pool is not None
        cids = [str(c.node_config[PARTITION_ID_KEY]) for c in contexts]
        answers = self.pool.run(
            lambda actor: actor.run_group.remote(
                self.app_fn, self.group_handler, messages, cids, contexts
            )
        )
        return [(reply, context) for _, reply, context in answers]

    def _group_size(self, message: Message, context: Context) -> int:
        """The run's ``client-group-size`` (1 where the app has no groups), read once per run."""
        run_id = message.metadata.run_id
        if run_id not in self._group_sizes:
            size = 1
            if self.group_handler:
                # pylint: disable-next=import-outside-toplevel  (the app's config: once per run)
                from fedx.config import RunConfig

                try:
                    size = RunConfig.from_mapping(context.run_config).client_group_size
                except ValueError as err:
                    log(WARNING, "fedx Ray backend: no client groups for run %s: %s", run_id, err)
            self._group_sizes[run_id] = size
            if size > 1:
                log(
                    INFO,
                    "fedx Ray backend: client groups of up to %d training messages per actor",
                    size,
                )
        return self._group_sizes[run_id]

    def terminate(self) -> None:
        sizes = groups.COLLECTOR.group_sizes
        if sizes:
            log(
                INFO,
                "fedx Ray backend: client groups run: %s",
                ", ".join(f"{count} of {size}" for size, count in sorted(sizes.items())),
            )
        if self.pool is not None:
            self.pool.shutdown()
        ray.shutdown()
