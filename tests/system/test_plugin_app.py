"""fedx's strategies inside somebody else's Flower app (examples/numpy-plugin).

That app has its own numpy ClientApp, replies by Flower's convention
("arrays" + "metrics" with "num-examples") and imports nothing of fedx but
``fedx.strategies``. It runs here in Flower's Ray simulation, under a
ServerApp that asks the nodes whether they read fedx's packed model form
as fedx's ServerApp does: this ClientApp does not say so (it has no query
handler), so it gets standard ``ArrayRecord`` s.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedx.arrays import is_packed
from fedx.strategies import FedCross, FedMR, FedMut, to_model
from fedx.strategy_core.client_identity import query_client_ids
from fedx.strategy_core.packing import PackingGrid

pytestmark = pytest.mark.cost(1)

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "examples" / "numpy-plugin"
NUM_NODES = 4
NUM_ROUNDS = 3
#: The ServerApp's PackingGrid, once it has run.
PACKING: list[PackingGrid] = []


class Recording:
    """Mixin for a strategy that remembers what it sent and what came back."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent: dict[int, dict[int, dict]] = {}
        self.uploaded: dict[int, list[dict]] = {}
        #: Whether any message or reply held a model in fedx's packed form.
        self.packed = False

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sent[server_round] = {
            m.metadata.dst_node_id: to_model(m.content["arrays"]) for m in messages
        }
        self.packed |= any(is_packed(m.content["arrays"]) for m in messages)
        return messages

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.uploaded[server_round] = [
            to_model(r.content["arrays"]) for r in replies if not r.has_error()
        ]
        self.packed |= any(is_packed(r.content["arrays"]) for r in replies if not r.has_error())
        return super().aggregate_train(server_round, replies)


STRATEGIES = {
    "fedmr": type("RecordingFedMR", (Recording, FedMR), {}),
    "fedmut": type("RecordingFedMut", (Recording, FedMut), {}),
    "fedcross": type("RecordingFedCross", (Recording, FedCross), {}),
}


@pytest.fixture(scope="module")
def plugin_runs():
    """One Ray simulation whose ServerApp runs each strategy in turn on the same nodes."""
    sys.path.insert(0, str(PLUGIN_DIR))
    # Ray workers import the ClientApp by module name: they need the path too.
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN_DIR), previous]))
    from numpy_plugin.client_app import app as client_app  # pylint: disable=import-outside-toplevel
    from numpy_plugin.task import initial_model  # pylint: disable=import-outside-toplevel

    outcomes = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        # As fedx's ServerApp: packed models for the nodes that say they read them.
        grid = PackingGrid(grid)
        query_client_ids(grid, list(grid.get_node_ids()), 60)
        PACKING.append(grid)
        for name, strategy_class in STRATEGIES.items():
            strategy = strategy_class(fraction_train=1.0, fraction_evaluate=1.0, seed=0)
            initial = ArrayRecord({n: Array(a) for n, a in initial_model().items()})
            outcomes[name] = (
                strategy,
                strategy.start(
                    grid=grid,
                    initial_arrays=initial,
                    num_rounds=NUM_ROUNDS,
                    timeout=120,
                    train_config=ConfigRecord(),
                ),
            )

    try:
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=NUM_NODES,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
    return outcomes


@pytest.fixture(params=list(STRATEGIES))
def plugin_run(request, plugin_runs):
    assert request.param in plugin_runs, "the ServerApp did not get to this strategy"
    return plugin_runs[request.param]


def test_every_round_completes_with_the_users_clientapp(plugin_run):
    strategy, result = plugin_run
    assert result is not None, "the ServerApp did not finish"
    assert sorted(result.train_metrics_clientapp) == list(range(1, NUM_ROUNDS + 1))
    assert all(len(strategy.uploaded[r]) == NUM_NODES for r in strategy.uploaded)
    # The user's ClientApp never said it reads fedx's packed form: standard ArrayRecords only.
    assert not strategy.packed
    (packing,) = PACKING
    assert not packing.packed_nodes and packing.sent_packed == 0 and packing.sent_standard > 0
    # Federated evaluation by the user's own evaluate function, on the global model.
    accuracy = result.evaluate_metrics_clientapp[NUM_ROUNDS]["accuracy"]
    assert accuracy > 0.8


def test_each_node_received_a_different_model(plugin_run):
    strategy, _ = plugin_run
    # FedMut's mutations of a two-tensor model repeat with some luck (2 x 2 sign
    # patterns for 4 nodes); FedMR and FedCross give every node its own model.
    expected_distinct = 2 if isinstance(strategy, FedMut) else NUM_NODES
    for server_round in range(2, NUM_ROUNDS + 1):
        received = list(strategy.sent[server_round].values())
        fingerprints = {tuple(m[n].tobytes() for n in sorted(m)) for m in received}
        assert len(received) == NUM_NODES
        assert len(fingerprints) >= expected_distinct
    # Round 1 sends the same initial model to everybody.
    first = list(strategy.sent[1].values())
    assert all(np.array_equal(m["weight"], first[0]["weight"]) for m in first)


def test_fedmr_sends_the_previous_uploads_recombined(plugin_runs):
    """FedMR only: every layer it sends is a layer uploaded the round before."""
    strategy, _ = plugin_runs["fedmr"]
    assert isinstance(strategy, FedMR)
    for server_round in range(2, NUM_ROUNDS + 1):
        received = list(strategy.sent[server_round].values())
        # What was sent is the previous round's uploads, layer by layer reshuffled.
        uploaded = strategy.uploaded[server_round - 1]
        for name in received[0]:
            assert sorted(m[name].tobytes() for m in received) == sorted(
                m[name].tobytes() for m in uploaded
            )
