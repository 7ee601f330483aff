"""fedx-compare end to end: a small digits grid in Flower simulation, stopped, resumed, run again.

Planning, resuming, the report and the progress lines without a run:
tests/unit/test_compare.py.
"""

import csv
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fedx.compare.runner import write_run_config
from tests.support.helpers import BIN

pytestmark = pytest.mark.cost(3)


def processes_mentioning(text: str) -> list[int]:
    """Ids of the processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def digits_comparison(app, tmp_path_factory):
    """``fedx-compare`` on a 2 methods x 1 seed digits grid: stopped by SIGTERM
    during its second run, then run to the end, then run once more.

    Kept small, as each run's time is mostly the simulation's start (3 runs in
    all): 2 SuperNodes (``--num-supernodes``), 1 local epoch of small batches, 2
    rounds, one seed (not the default 0). Several seeds' means and stds: the
    report's tests (tests/unit/test_compare.py).
    """
    folder = tmp_path_factory.mktemp("compare")
    write_run_config(
        folder / "digits-tiny.toml",
        {
            "num-server-rounds": 2,
            "min-available-nodes": 2,
            "min-train-nodes": 2,
            "partitioning": "iid",
            "local-epochs": 1,
            "batch-size": 25,
        },
    )
    command = [
        str(BIN / "fedx-compare"),
        str(folder / "digits-tiny.toml"),
        "--methods",
        "fedmut,fedcross",
        "--seeds",
        "1",
        "--out",
        str(folder / "out"),
        "--app",
        str(app),
        "--num-supernodes",
        "2",
        # A progress line for every round the runner sees (the output is not a terminal).
        "--progress-interval",
        "0",
    ]

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(600, process.kill)
    watchdog.start()
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("[1/2]") and ": finished" in line:  # not a progress line
            break
    time.sleep(3)  # the second run is under way
    process.send_signal(signal.SIGTERM)
    rest, errors = process.communicate(timeout=120)
    watchdog.cancel()
    stopped = subprocess.CompletedProcess(
        command, process.returncode, "".join(lines) + rest, errors
    )
    leftovers = processes_mentioning(str(folder / "out"))

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return folder / "out", stopped, leftovers, resumed, again


def test_compare_stops_cleanly_on_sigterm(digits_comparison):
    out, stopped, leftovers, _, _ = digits_comparison
    assert stopped.returncode == 130, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    assert "interrupted; the same command resumes" in stopped.stderr
    assert leftovers == []  # no SuperLink, ServerApp or simulation of the comparison runs on
    assert not list(out.glob(".superlink-*"))


def test_compare_resumes_the_grid_and_writes_table_and_plot(digits_comparison):
    out, _, _, first, _ = digits_comparison
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = [line for line in first.stdout.splitlines() if line.startswith("[")]
    outcomes = [line for line in lines if ": finished" in line]
    assert outcomes == [
        "[1/2] digits-tiny · fedmut · seed 1: finished before, skipped",
        outcomes[1],
    ]
    assert outcomes[1].startswith("[2/2] digits-tiny · fedcross · seed 1: finished in")
    # While the run went: its rounds, as the runner saw them (round 0 is the start).
    during = [line for line in lines if line not in outcomes]
    assert all(
        re.match(r"^\[2/2\] digits-tiny · fedcross · seed 1: (starting, )?round [0-2]/2", line)
        for line in during
    ), during

    with (out / "results.csv").open() as file:
        table = {row["method"]: row for row in csv.DictReader(file)}
    assert set(table) == {"fedmut", "fedcross"}
    with (out / "runs.csv").open() as file:
        runs = list(csv.DictReader(file))
    assert len(runs) == 2
    for method, row in table.items():
        (final,) = [float(r["final_accuracy"]) for r in runs if r["method"] == method]
        assert row["seeds"] == "1"
        assert float(row["final_accuracy_mean"]) == pytest.approx(final, abs=1e-4)
        assert float(row["final_accuracy_std"]) == 0.0  # one seed
        assert 0.1 < float(row["final_accuracy_mean"]) <= 1.0  # learned beyond chance
        assert (
            f"| {method} | 1 | {float(row['final_accuracy_mean']):.4f} ±"
            in (out / "results.md").read_text()
        )
    assert (out / "digits-tiny.png").read_bytes()[:4] == b"\x89PNG"

    # Each run is the app's own: its strategy, every slot trained, learning under way.
    def metrics(method: str, seed: int) -> dict:
        return json.loads((out / f"runs/digits-tiny/{method}/seed-{seed}/metrics.json").read_text())

    for method in ("fedmut", "fedcross"):
        run = metrics(method, 1)
        rounds = {row["round"]: row for row in run["rounds"]}
        assert (run["config"]["strategy"], run["config"]["seed"]) == (method, 1)
        assert sorted(rounds) == [0, 1, 2]
        assert all(rounds[r]["trained-slots"] == 2 for r in (1, 2))
        assert rounds[2]["accuracy"] > rounds[0]["accuracy"] + 0.1
    # Same seed, same initial model and data: the round-0 evaluation agrees across methods.
    initial = [metrics(m, 1)["rounds"][0] for m in ("fedmut", "fedcross")]
    assert initial[0]["round"] == 0
    assert (initial[0]["accuracy"], initial[0]["loss"]) == (
        initial[1]["accuracy"],
        initial[1]["loss"],
    )
    assert not list(out.glob(".superlink-*"))  # the SuperLink's state is cleaned up


def test_compare_again_skips_finished_runs(digits_comparison):
    out, _, _, _, second = digits_comparison
    assert second.returncode == 0, second.stderr[-3000:]
    lines = [line for line in second.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 2 and all("finished before, skipped" in line for line in lines)
    assert (out / "results.csv").is_file()
