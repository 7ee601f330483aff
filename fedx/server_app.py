"""fedx ServerApp: read the run config, build the strategy, run it, record the run.

The work, and its parts in :mod:`fedx.server`, are in
:mod:`fedx.server.experiment`.

This module imports neither torch nor fedx's data, models and strategies:
``main`` imports them when it runs. Flower's simulation loads this module
and the ClientApp's under one import lock (``flwr/supercore/object_ref.py``),
and its engine starts Ray only once it has the ClientApp: importing torch
here would hold Ray's start back by the whole of torch's import, where
importing it in ``main`` runs alongside it.
"""

from logging import WARNING

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedx import simulation

# In Flower's simulation this module is loaded first; the engine then loads
# fedx's ClientApp module, which imports Ray (fedx/simulation/backend.py), and
# starts Ray. Importing it here, before main() imports torch on this thread,
# keeps the two imports from sharing the interpreter, which brings ray.init
# sooner.
if simulation.in_simulation_engine():
    import fedx.simulation.backend  # noqa: F401  pylint: disable=unused-import

app = ServerApp()


def change_flower() -> None:
    """In a deployment, make this process's changes to Flower (:mod:`fedx.flower`), all or none.

    The objects of a reply that its node is still pushing are asked for at
    the pace of the reply pulls (:func:`fedx.messaging.pull_intervals`;
    Flower: after 1 s, 2 s, 4 s ... up to 10 s), and ``FEDX_OBJECTS_IN_FLIGHT``
    objects move at once when it is set. In Flower's simulation the grid is
    in memory and no object is pulled: nothing is changed there.
    """
    if simulation.in_simulation_engine():
        return
    # pylint: disable=import-outside-toplevel
    from flwr.common import log

    from fedx import flower
    from fedx.flower import objects_in_flight
    from fedx.messaging import pull_intervals

    first, longest = pull_intervals()
    changes: dict[str, dict] = {"object_pulls": {"first": first, "longest": longest}}
    try:
        if (count := objects_in_flight.from_environment()) is not None:
            changes["objects_in_flight"] = {"count": count}
    except ValueError as err:
        log(WARNING, "fedx: Flower's objects in flight kept: %s", err)
    flower.install("serverapp", changes)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one fedx experiment as the run config describes."""
    from fedx.server.experiment import run_experiment  # pylint: disable=import-outside-toplevel

    change_flower()
    run_experiment(grid, context)
