"""fedx's parts of Flower's simulation engine: a Ray backend whose actor pool follows the cluster, and a message feeder.

Flower (1.41, 1.42) runs a simulation's ClientApps on Ray through its
simulation engine; :func:`install` puts fedx's parts into that engine, in the
process that runs it, all or none (each through the change of
:mod:`fedx.flower` named here):

- :mod:`fedx.simulation.backend`: Flower's ``RayBackend`` with fedx's actor
  pool (:mod:`fedx.flower.ray_backend`);
- :mod:`fedx.simulation.pool`: the actor pool, which follows the nodes of a
  Ray cluster (a lost node's actors are dropped and their messages run
  elsewhere, a joined node is used) and queues a message behind a busy actor
  while more wait than there are actors;
- :mod:`fedx.simulation.actor`: what runs inside the actors (fedx's
  ClientApp actor class, :mod:`fedx.flower.clientapp_actor`);
- :mod:`fedx.simulation.ray_cluster`: starting or joining Ray, and the
  cluster's nodes as the pool sees them;
- :mod:`fedx.simulation.groups`: client groups, a round's training messages
  run several to an actor where the run config asks for them;
- :mod:`fedx.simulation.feeder`: the message feeder, woken by the ServerApp's
  pushes instead of polling every node (:mod:`fedx.flower.message_feeder`,
  :mod:`fedx.flower.linkstate_stores`);
- and the engine runs a thread for every worker the backend asks for
  (:mod:`fedx.flower.engine_threads`), not min(32, cores + 4).

The fedx ClientApp module calls :func:`install` when it is loaded in the
engine (a deployed ClientApp never does). Importing this package imports
neither Flower's engine nor Ray: a Ray actor imports
:mod:`fedx.simulation.actor` and its own imports only.
"""

from collections.abc import Sequence

from fedx.flower import in_simulation_engine

__all__ = ["in_simulation_engine", "install"]


def install(actor_preload: Sequence[str] = (), group_handler: str = "") -> bool:
    """Make Flower's simulation engine in this process use fedx's backend, threads and feeder.

    Call it where the engine is loaded (``flwr-simulation``, or Flower's
    ``run_simulation`` in process: :func:`in_simulation_engine`), before the
    engine builds its backend; the fedx ClientApp module does.
    ``actor_preload`` names modules every ClientApp actor imports when it
    starts, after loading the ClientApp: what a ClientApp module imports
    only on its first message. ``group_handler`` (``"module:function"``)
    answers a client group's training messages in an actor
    (:mod:`fedx.simulation.groups`); without one, every message runs alone.
    Idempotent (the last arguments hold). The changes are made by
    :func:`fedx.flower.install`, all or none: where Flower's engine is not
    the code they were checked against, it runs as Flower ships it, with
    one warning.

    Returns
    -------
    bool
        Whether the engine builds fedx's backend now.
    """
    from fedx import flower  # pylint: disable=import-outside-toplevel

    def backend() -> dict:
        from fedx.simulation.backend import ClusterRayBackend  # pylint: disable=C0415

        ClusterRayBackend.actor_preload = tuple(actor_preload)
        ClusterRayBackend.group_handler = group_handler
        return {"backend": ClusterRayBackend}

    def feeder() -> dict:
        from fedx.simulation.feeder import feed_messages  # pylint: disable=C0415

        return {"feeder": feed_messages}

    return bool(
        flower.install(
            "simulation",
            {
                "clientapp_actor": {},
                "linkstate_stores": {},
                "ray_backend": backend,
                "engine_threads": {},
                "message_feeder": feeder,
            },
        )
    )
