"""fedx ServerApp: read the run config, build the strategy, run it, record the run.

The work, and its parts in :mod:`fedx.server`, are in
:mod:`fedx.server.experiment`.

This module imports neither torch nor fedx's data, models and strategies:
``main`` imports them when it runs. Flower's simulation loads this module
and the ClientApp's under one import lock (``flwr/supercore/object_ref.py``),
and its engine starts Ray only once it has the ClientApp: importing torch
here would hold Ray's start back (1.6-2.3 s on 2 cores), where importing it
in ``main`` runs alongside it.
"""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedx import simulation

# In Flower's simulation this module is loaded first; the engine then loads
# fedx's ClientApp module, which imports Ray (fedx/simulation/backend.py), and
# starts Ray. Importing it here, before main() imports torch on this thread,
# keeps the two imports from sharing the interpreter (0.2-0.4 s sooner to
# ray.init).
if simulation.in_simulation_engine():
    import fedx.simulation.backend  # noqa: F401  pylint: disable=unused-import

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one fedx experiment as the run config describes."""
    from fedx.server.experiment import run_experiment  # pylint: disable=import-outside-toplevel

    run_experiment(grid, context)
