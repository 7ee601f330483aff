"""FedMe end to end: `flwr run` against a test SuperLink.

Four simulated clients on digits, each with its own train/validation/test
split and its own architecture. The SuperLink is this module's own (started
on free ports with a private FLWR_HOME by the fixture of test_app_e2e) and is
stopped at the end. FedAvg + fine-tuning runs in process in
test_fedme_client.py: a second `flwr run` would double this file's time.
"""

import json
import re

import numpy as np
import pytest
import torch

from fedx.models import build_model
from fedx.strategies.fedme import FedMe
from tests.support.helpers import metrics_rows, undocumented_fields
from tests.support.simulation import run_app

pytestmark = pytest.mark.cost(2)

ARCHITECTURES = ("cnn-1", "cnn-2", "cnn-3", "cnn-4")


def test_fedme_clients_adopt_other_architectures_and_report_personalized_accuracy(
    superlink, app, tmp_path
):
    output = run_app(
        superlink,
        app,
        f'strategy="fedme" num-server-rounds=3 local-epochs=2 seed=0 '
        f'fedme-architectures="{",".join(ARCHITECTURES)}" fedme-cluster-rounds="2" '
        f'fedme-initial-architecture="round-robin" '
        f'finetune-epochs=0 partitioning="dirichlet-size-label" dirichlet-alpha=0.5 '
        f'run-name="fedme" output-dir="{tmp_path}"',
    )
    directory = tmp_path / "fedme"
    assert (directory / "metrics.json").exists(), output[-3000:]
    metrics = json.loads((directory / "metrics.json").read_text())
    rounds = metrics_rows(directory)
    assert sorted(rounds) == [1, 2, 3]
    assert undocumented_fields(metrics) == []  # docs/outputs.md lists what FedMe writes
    # Both models of every training message went packed (fedx.strategy_core.packing).
    assert "4 nodes connected (4 identified, 4 read packed models)" in output
    assert re.search(r"models went packed in [1-9]\d* messages, standard in 0\b", output)

    # Every client trained every round; clustering ran once there were two clusters.
    assert all(rounds[r]["trained-clients"] == 4 for r in (1, 2, 3))
    assert rounds[1]["num-clusters"] == 1 and rounds[1]["clustering-seconds"] == 0.0
    assert all(rounds[r]["num-clusters"] == 2 for r in (2, 3))
    assert all(0.0 < rounds[r]["clustering-seconds"] < 60.0 for r in (2, 3))

    # Each of the four clients started with its own architecture (round-robin
    # from the seeded offset); a client that adopted an exchanged model of
    # another architecture now reports that architecture.
    same_seed = FedMe(
        architectures=ARCHITECTURES,
        initial_model_fn=lambda arch, cid: {},
        predict_fn=lambda arch, model: np.empty((0, 0)),
        seed=0,
    )
    initial = {str(c): same_seed.architecture_for(c) for c in range(4)}
    assert sorted(initial.values()) == sorted(ARCHITECTURES)
    assert sum(rounds[r]["adopted-other-architecture"] for r in (1, 2, 3)) >= 1
    final_clients = rounds[3]["clients"]
    assert sorted(final_clients) == ["0", "1", "2", "3"]
    assert any(final_clients[c]["architecture"] != initial[c] for c in final_clients)

    # Personalized accuracy: per client and mean ± std, every round.
    for r in (1, 2, 3):
        accuracies = [rounds[r]["clients"][c]["accuracy"] for c in rounds[r]["clients"]]
        assert np.isclose(rounds[r]["personalized-accuracy"], np.mean(accuracies))
        assert np.isclose(rounds[r]["personalized-accuracy-std"], np.std(accuracies))
    assert rounds[3]["personalized-accuracy"] > 0.3  # chance is 0.1
    assert metrics["final"]["round"] == 3
    assert "final personalized test accuracy" in output
    # The saved personalized models load into their clients' architectures.
    saved = torch.load(directory / "personalized-models.pt", weights_only=True)
    assert sorted(saved) == [0, 1, 2, 3]
    for client_id, entry in saved.items():
        assert entry["architecture"] == final_clients[str(client_id)]["architecture"]
        build_model(entry["architecture"], (1, 8, 8), 10).load_state_dict(entry["state_dict"])
    assert (directory / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
