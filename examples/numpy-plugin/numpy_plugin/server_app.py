"""An ordinary Flower ServerApp, with ``FedAvg`` swapped for fedx's ``FedMR``."""

from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedx.strategies import FedMR
from numpy_plugin.task import initial_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with FedMR on every connected node."""
    strategy = FedMR(fraction_train=1.0, fraction_evaluate=1.0, seed=0)
    initial = ArrayRecord({name: Array(array) for name, array in initial_model().items()})
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(context.run_config["num-server-rounds"]),
        timeout=120,
        train_config=ConfigRecord(),
    )
    print(f"Final federated evaluation: {result.evaluate_metrics_clientapp}")
