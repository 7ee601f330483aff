"""RunRecorder: the metrics.json format, with and without personalized results."""

import json

from fedx.outputs import METRICS_FILE, PLOT_FILE, RunRecorder


def test_global_only_runs_keep_their_format(tmp_path):
    recorder = RunRecorder(tmp_path, {"strategy": "fedmr"})
    recorder.record(0, accuracy=0.1, loss=2.3)
    recorder.record(1, **{"round-seconds": 1.5, "accuracy": 0.5, "loss": 1.2})
    assert not (tmp_path / METRICS_FILE).exists()  # written once a round, by flush()
    recorder.flush()
    written = json.loads((tmp_path / METRICS_FILE).read_text())
    assert written["rounds"] == [
        {"round": 0, "accuracy": 0.1, "loss": 2.3},
        {"round": 1, "round-seconds": 1.5, "accuracy": 0.5, "loss": 1.2},
    ]
    assert written["final"] == {"round": 1, "round-seconds": 1.5, "accuracy": 0.5, "loss": 1.2}
    assert recorder.plot("fedmr").read_bytes()[:4] == b"\x89PNG"


def test_personalized_rounds_hold_per_client_results_and_count_as_final(tmp_path):
    recorder = RunRecorder(tmp_path, {"strategy": "fedme"})
    recorder.record(1, **{"round-seconds": 2.0, "clustering-seconds": 0.0})
    clients = {
        "0": {"accuracy": 0.5, "architecture": "cnn-1"},
        "1": {"accuracy": 0.7, "architecture": "cnn-2"},
    }
    recorder.record(2, **{"personalized-accuracy": 0.6, "personalized-accuracy-std": 0.1})
    recorder.record_clients(2, clients)
    recorder.record(3, **{"clustering-seconds": 0.2})
    recorder.flush()
    written = json.loads((tmp_path / METRICS_FILE).read_text())
    assert written["rounds"][1]["clients"] == clients
    # The last evaluated round is final, not the last round with any row.
    assert written["final"]["round"] == 2
    assert written["final"]["personalized-accuracy"] == 0.6
    assert recorder.plot("fedme") == tmp_path / PLOT_FILE
    assert (tmp_path / PLOT_FILE).stat().st_size > 1000
