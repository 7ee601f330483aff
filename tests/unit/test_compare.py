"""fedx-compare: planning, resuming, the report (a digits grid run for real: tests/system/test_compare.py)."""

import argparse
import csv
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedx.compare.cli import main, parse_override, parse_seeds
from fedx.compare.plan import RUN_RECORD, Setting, app_defaults, plan_runs
from fedx.compare.progress import GridProgress
from fedx.compare.report import (
    load_result,
    method_style,
    results_from_csv,
    summarize_runs,
    write_report,
)
from fedx.compare.runner import finished_record, stop_reason, write_run_config
from fedx.config import ConfigError
from fedx.outputs import METRICS_FILE
from fedx.registry import builtin_methods

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFAULTS = app_defaults(REPO)


def write_setting(path: Path, **keys) -> Setting:
    write_run_config(path, keys)
    return Setting.load(path)


def fake_finished_run(run, curve: list[float], wall: float, stop_reason: str | None = None) -> None:
    """What a finished (or diverged) run leaves: metrics.json with one row per round and run.json."""
    run.directory.mkdir(parents=True)
    rows = [{"round": r, "accuracy": a, "round-seconds": 0.5} for r, a in enumerate(curve)]
    metrics = {
        "rounds": rows,
        "final": rows[-1],
        "timings": {"mean-round-seconds": 0.5},
        "stop-reason": stop_reason,
    }
    (run.directory / METRICS_FILE).write_text(json.dumps(metrics))
    status = "finished" if stop_reason is None else "diverged"
    record = {"status": status, "wall-seconds": wall, "run-config": run.run_config}
    (run.directory / RUN_RECORD).write_text(json.dumps(record))


# --------------------------------------------------------------------------- planning


def test_plan_sets_strategy_seed_and_folders_on_top_of_the_setting(tmp_path):
    setting = write_setting(
        tmp_path / "digits-x.toml",
        **{
            "num-server-rounds": 8,
            "first-stage-rounds": 3,
            "proximal-mu": 0.01,
            "min-available-nodes": 5,
            "min-train-nodes": 5,
        },
    )
    runs = plan_runs(
        [setting],
        ["fedavg", "fedprox", "fedmr", "fedmr-two-stage"],
        [0, 4],
        {"local-epochs": 2},
        DEFAULTS,
        tmp_path / "out",
    )
    assert [(r.method, r.seed) for r in runs] == [
        (m, s) for m in ("fedavg", "fedprox", "fedmr", "fedmr-two-stage") for s in (0, 4)
    ]
    by_method = {r.method: r.run_config for r in runs if r.seed == 4}
    assert by_method["fedavg"]["strategy"] == "fedavg"
    assert by_method["fedprox"]["strategy"] == "fedprox"
    assert by_method["fedmr"]["first-stage-rounds"] == 0  # one-stage FedMR
    assert by_method["fedmr-two-stage"]["first-stage-rounds"] == 3  # the setting's
    for run in runs:
        assert run.run_config["seed"] == run.seed
        assert run.run_config["local-epochs"] == 2
        assert run.num_rounds == 8 and run.num_supernodes == 5
        assert run.directory == (tmp_path / "out/runs/digits-x" / run.method / f"seed-{run.seed}")
        assert Path(run.run_config["output-dir"]) / run.run_config["run-name"] == run.directory
    # The same seed differs only in the method's keys: same data, same initial model.
    fedavg, fedmr = (
        next(r.run_config for r in runs if r.method == m and r.seed == 0)
        for m in ("fedavg", "fedmr")
    )
    differing = {k for k in fedavg.keys() | fedmr.keys() if fedavg.get(k) != fedmr.get(k)}
    assert differing == {"strategy", "first-stage-rounds", "output-dir"}


def test_planning_a_grid_prints_no_warning_per_run(tmp_path, caplog):
    """Checking each run's config builds its strategy: Flower's construction warnings
    (fraction_evaluate = 0.0 for every fedx method) are not repeated once per run."""
    setting = write_setting(tmp_path / "digits-x.toml")
    with caplog.at_level(logging.WARNING):
        runs = plan_runs(
            [setting], ["fedavg", "fedmr", "fedmut"], [0, 1, 2], {}, DEFAULTS, tmp_path
        )
    assert len(runs) == 9
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert logging.getLogger("flwr").level != logging.ERROR  # the level is given back


@pytest.mark.parametrize(
    ("keys", "method", "message"),
    [
        ({"proximal-mu": 0.0}, "fedprox", "needs proximal-mu > 0"),
        ({"first-stage-rounds": 0}, "fedmr-two-stage", "0 < first-stage-rounds"),
        (
            {"first-stage-rounds": 20, "num-server-rounds": 20},
            "fedmr-two-stage",
            "first-stage-rounds=20",
        ),
        ({}, "fedfoo", "unknown method 'fedfoo'"),
        ({"learning-rate": -1.0}, "fedavg", "learning-rate=-1.0"),
        # The method's own checks run before anything starts.
        (
            {"fedcross-alpha": 1.5},
            "fedcross",
            r"fedcross-alpha=1.5: must be a number in \[0.5, 1\)",
        ),
    ],
)
def test_plan_rejects_runs_that_cannot_work(tmp_path, keys, method, message):
    setting = write_setting(tmp_path / "s.toml", **keys)
    with pytest.raises(ConfigError, match=message) as error:
        plan_runs([setting], [method], [0], {}, DEFAULTS, tmp_path)
    assert "setting s" in str(error.value)


def test_settings_and_overrides_cannot_set_what_the_comparison_owns(tmp_path):
    with pytest.raises(ConfigError, match="seed"):
        write_setting(tmp_path / "s.toml", seed=3)
    setting = write_setting(tmp_path / "t.toml")
    with pytest.raises(ConfigError, match="output-dir"):
        plan_runs([setting], ["fedavg"], [0], {"output-dir": "x"}, DEFAULTS, tmp_path)


def test_run_config_file_reads_back_as_written(tmp_path):
    config = {
        "strategy": "fedmr",
        "seed": 3,
        "learning-rate": 0.01,
        "download": False,
        "output-dir": str(tmp_path / 'a "quoted" dir'),
        "dirichlet-alpha": 1e-3,
    }
    write_run_config(tmp_path / "c.toml", config)
    with (tmp_path / "c.toml").open("rb") as file:
        assert tomllib.load(file) == config


def test_command_line_values():
    assert parse_override("num-server-rounds=5") == ("num-server-rounds", 5)
    assert parse_override("learning-rate=0.05") == ("learning-rate", 0.05)
    assert parse_override("download=true") == ("download", True)
    assert parse_override("dataset=digits") == ("dataset", "digits")
    assert parse_override('model="cnn"') == ("model", "cnn")
    assert parse_seeds("0, 2,5") == [0, 2, 5]
    for bad, message in (
        ("1,1", "distinct"),
        ("-1", "distinct integers >= 0"),
        ("a", "comma-separated integers"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_seeds(bad)


def test_finished_run_is_kept_and_a_changed_setting_is_refused(tmp_path):
    setting = write_setting(tmp_path / "s.toml")
    [run] = plan_runs([setting], ["fedavg"], [0], {}, DEFAULTS, tmp_path / "out")
    assert finished_record(run) is None
    fake_finished_run(run, [0.1, 0.5], wall=3.0)
    assert finished_record(run)["wall-seconds"] == 3.0
    [changed] = plan_runs(
        [setting], ["fedavg"], [0], {"local-epochs": 3}, DEFAULTS, tmp_path / "out"
    )
    with pytest.raises(ConfigError, match="another run config"):
        finished_record(changed)
    # The command refuses before starting anything, with exit status 2.
    code = main(
        [
            str(tmp_path / "s.toml"),
            "--methods",
            "fedavg",
            "--seeds",
            "0",
            "--out",
            str(tmp_path / "out"),
            "--set",
            "local-epochs=3",
        ]
    )
    assert code == 2


# --------------------------------------------------------------------------- report


def test_report_means_stds_rounds_to_target_and_files(tmp_path):
    setting = write_setting(tmp_path / "grid.toml")
    runs = plan_runs([setting], ["fedavg", "fedmr"], [0, 1, 2], {}, DEFAULTS, tmp_path / "out")
    curves = {
        ("fedavg", 0): [0.1, 0.5, 0.8, 0.80],
        ("fedavg", 1): [0.1, 0.6, 0.7, 0.82],
        ("fedavg", 2): [0.1, 0.4, 0.6, 0.78],
        ("fedmr", 0): [0.1, 0.3, 0.9, 0.90],
        ("fedmr", 1): [0.1, 0.2, 0.5, 0.92],
        ("fedmr", 2): [0.1, 0.2, 0.4, 0.70],
    }
    for run in runs:
        fake_finished_run(run, curves[run.method, run.seed], wall=10.0 + run.seed)
    rows, paths = write_report(tmp_path / "out", runs, target=0.75)
    fedavg, fedmr = rows
    assert fedavg.final_mean == pytest.approx(statistics.fmean([0.80, 0.82, 0.78]))
    assert fedavg.final_std == pytest.approx(statistics.stdev([0.80, 0.82, 0.78]))
    assert fedavg.rounds_to_target == (2, 3, 3)
    assert fedmr.rounds_to_target == (2, 3, None)
    assert fedmr.rounds_text() == "2.5 (2/3 seeds)"
    assert fedavg.wall_seconds == pytest.approx(11.0)

    markdown = (tmp_path / "out/results.md").read_text()
    assert "## grid" in markdown and "Seeds 0, 1, 2; 3 rounds; target accuracy 0.750" in markdown
    assert f"| fedavg | 3 | {fedavg.final_mean:.4f} ± {fedavg.final_std:.4f} | 2.7 |" in markdown
    assert "| fedmr | 3 | 0.8400 ± 0.1217 | 2.5 (2/3 seeds) |" in markdown
    with (tmp_path / "out/results.csv").open() as file:
        table = list(csv.DictReader(file))
    assert [(r["method"], r["seeds"], r["seeds_reaching_target"]) for r in table] == [
        ("fedavg", "0 1 2", "3"),
        ("fedmr", "0 1 2", "2"),
    ]
    with (tmp_path / "out/runs.csv").open() as file:
        assert len(list(csv.DictReader(file))) == 6
    plot = tmp_path / "out/grid.png"
    assert plot in paths and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_target_is_a_share_of_the_best_mean_and_unfinished_runs_are_left_out(tmp_path):
    setting = write_setting(tmp_path / "g.toml")
    runs = plan_runs([setting], ["fedavg", "fedmr"], [0, 1], {}, DEFAULTS, tmp_path / "out")
    fake_finished_run(runs[0], [0.1, 0.6], 1.0)
    fake_finished_run(runs[1], [0.1, 0.8], 1.0)
    fake_finished_run(runs[2], [0.1, 0.9], 1.0)  # fedmr seed 0; fedmr seed 1 never ran
    results = [r for run in runs if (r := load_result(run))]
    assert len(results) == 3
    rows = summarize_runs(results, target=None)
    assert [row.target for row in rows] == [round(0.95 * 0.9, 3)] * 2
    assert rows[1].seeds == (0,)


def test_diverged_runs_are_reported_as_diverged_not_as_numbers(tmp_path):
    setting = write_setting(tmp_path / "grid.toml")
    runs = plan_runs([setting], ["fedavg", "fedmut"], [0, 1], {}, DEFAULTS, tmp_path / "out")
    reason = "diverged: the central loss of round 2 is nan"
    fake_finished_run(runs[0], [0.1, 0.6, 0.8], 1.0)
    fake_finished_run(runs[1], [0.1, 0.7, 0.9], 1.0, stop_reason=reason)
    for run in runs[2:]:  # fedmut: both seeds diverged
        fake_finished_run(run, [0.1, 0.1, float("nan")], 1.0, stop_reason=reason)
    assert finished_record(runs[1])["status"] == "diverged"  # done: not run again
    assert stop_reason(runs[1]) == reason and stop_reason(runs[0]) is None
    rows, _ = write_report(tmp_path / "out", runs, target=None)
    fedavg, fedmut = rows
    assert fedavg.final_mean == pytest.approx(0.8) and fedavg.diverged == (1,)
    assert fedavg.target == round(0.95 * 0.8, 3), "the target ignores the diverged seed's 0.9"
    assert fedavg.rounds_to_target == (2, None)
    assert fedavg.final_text() == "0.8000 ± 0.0000 (1/2 seeds diverged)"
    assert fedmut.diverged == (0, 1) and fedmut.final_text() == "diverged (2/2 seeds)"
    markdown = (tmp_path / "out/results.md").read_text()
    assert "| fedmut | 2 | diverged (2/2 seeds) | not reached |" in markdown
    with (tmp_path / "out/results.csv").open() as file:
        table = {r["method"]: r for r in csv.DictReader(file)}
    assert (
        table["fedmut"]["final_accuracy_mean"] == "" and table["fedmut"]["seeds_diverged"] == "0 1"
    )
    with (tmp_path / "out/runs.csv").open() as file:
        per_run = list(csv.DictReader(file))
    assert [r["final_accuracy"] for r in per_run] == ["0.8000", "diverged", "diverged", "diverged"]
    assert per_run[1]["stop_reason"] == reason


def test_the_report_draws_again_from_its_csvs_alone(tmp_path):
    """curves.csv and runs.csv hold every run's curve and timings: the plots need no run folder."""
    settings = [write_setting(tmp_path / f"{name}.toml") for name in ("skewed", "iid")]
    runs = plan_runs(settings, ["fedavg", "fedmut"], [0, 1], {}, DEFAULTS, tmp_path / "out")
    for i, run in enumerate(runs):
        # values the CSVs' four decimals hold exactly
        fake_finished_run(run, [0.125, 0.25 + i / 16, 0.375 + i / 16], wall=2.0 + i)
    _, paths = write_report(tmp_path / "out", runs, target=None)
    out = tmp_path / "out"
    assert {out / "curves.csv", out / "overview.png", out / "skewed.png", out / "iid.png"} <= set(
        paths
    )
    assert (out / "overview.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = results_from_csv(out / "runs.csv", out / "curves.csv")
    assert again == [load_result(run) for run in runs]
    assert summarize_runs(again, None) == summarize_runs([load_result(r) for r in runs], None)


def test_every_method_keeps_one_style_in_every_plot():
    """Built-ins declare fixed, distinct styles; FedAvg and FedProx differ in colour and line."""
    builtin = [v.name for m in builtin_methods() for v in m.comparison_variants]
    assert all(v.style for m in builtin_methods() for v in m.comparison_variants)
    styles = {m: method_style(m) for m in builtin}
    colours = [s["color"] for s in styles.values()]
    assert len(set(colours)) == len(colours)
    assert styles["fedavg"]["linestyle"] != styles["fedprox"]["linestyle"]
    other = method_style("someone-elses-method")
    assert other == method_style("someone-elses-method")  # the same in every figure
    assert other["color"] not in colours


# --------------------------------------------------------------------------- provenance


def test_each_run_records_the_commit_of_the_app_that_ran_it(tmp_path):
    from fedx.compare.runner import app_commit

    assert app_commit(tmp_path) == ""  # not a git checkout: nothing to claim
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    subprocess.run([*git, "add", "pyproject.toml"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "app"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "outputs").mkdir()  # untracked output is not a change to the code
    (tmp_path / "outputs/x").write_text("")
    assert app_commit(tmp_path) == head
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert app_commit(tmp_path) == f"{head}-dirty"

    # The commit travels from run.json into runs.csv and back.
    setting = write_setting(tmp_path / "g.toml")
    (run,) = plan_runs([setting], ["fedavg"], [0], {}, DEFAULTS, tmp_path / "out")
    fake_finished_run(run, [0.1, 0.5], 1.0)
    record = json.loads((run.directory / RUN_RECORD).read_text())
    (run.directory / RUN_RECORD).write_text(json.dumps({**record, "app-commit": head}))
    write_report(tmp_path / "out", [run], None)
    (result,) = results_from_csv(tmp_path / "out/runs.csv", tmp_path / "out/curves.csv")
    assert result.commit == head


# --------------------------------------------------------------------------- progress


class FakeClock:
    """Monotonic seconds that a test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def write_rounds(run, accuracies: list[float]) -> None:
    """A running run's metrics.json: round 0 and one row per round done so far."""
    run.directory.mkdir(parents=True, exist_ok=True)
    rows = [{"round": r, "accuracy": a} for r, a in enumerate(accuracies)]
    (run.directory / METRICS_FILE).write_text(json.dumps({"rounds": rows}))


def two_runs(tmp_path, rounds: int = 4):
    setting = write_setting(tmp_path / "g.toml", **{"num-server-rounds": rounds})
    return plan_runs([setting], ["fedavg", "fedmr"], [0], {}, DEFAULTS, tmp_path / "out")


def test_progress_goes_into_a_log_as_plain_lines_at_most_every_interval(tmp_path):
    runs = two_runs(tmp_path)
    clock, log = FakeClock(), io.StringIO()
    progress = GridProgress(runs, log, interval=10.0, clock=clock)
    progress.start(0)
    clock.now = 5.0
    progress.watch()  # no round yet: nothing to say in a log
    write_rounds(runs[0], [0.1, 0.5])
    clock.now = 20.0
    progress.watch()
    # 20 s for 1 round; 7 of the grid's 8 rounds are left.
    first = "[1/2] g · fedavg · seed 0: round 1/4, accuracy 0.5000, 0:20 in this run; grid 0:20, about 2:20 left\n"
    assert log.getvalue() == first
    clock.now = 25.0
    progress.watch()  # the same round: no new line
    write_rounds(runs[0], [0.1, 0.5, 0.6])
    os.utime(runs[0].directory / METRICS_FILE, ns=(1, 2))  # a new stamp, however fast the disk
    clock.now = 28.0
    progress.watch()  # a new round, but only 8 s after the last line
    assert log.getvalue() == first
    clock.now = 31.0
    progress.watch()
    assert log.getvalue().splitlines()[-1] == (
        "[1/2] g · fedavg · seed 0: round 2/4, accuracy 0.6000, 0:31 in this run; grid 0:31, about 1:33 left"
    )
    write_rounds(runs[0], [0.1, 0.5, 0.6, 0.7, 0.8])  # the run's last rounds came unseen
    clock.now = 40.0
    progress.finish(0)
    progress.start(1)
    clock.now = 40.0
    # 40 s for 4 rounds: the second run's 4 rounds, about 40 s.
    assert progress.seconds_left(40.0) == pytest.approx(40.0)
    assert progress.line(52.0).endswith("0:12 in this run; grid 0:52, about 0:28 left")


def test_progress_on_a_terminal_is_one_line_rewritten_in_place(tmp_path):
    runs = two_runs(tmp_path)
    clock, terminal = FakeClock(), Terminal()
    progress = GridProgress(runs, terminal, clock=clock, width=200)
    progress.skipped(0)  # done before: counts for nothing
    progress.start(1)
    clock.now = 3.0
    progress.watch()
    assert (
        terminal.getvalue()
        == "\r[2/2] g · fedmr · seed 0: starting, round 0/4, 0:03 in this run; grid 0:03\x1b[K"
    )
    write_rounds(runs[1], [0.1, 0.3])
    clock.now = 13.0
    progress.watch()
    last = terminal.getvalue().split("\r")[-1]
    assert (
        last
        == "[2/2] g · fedmr · seed 0: round 1/4, accuracy 0.3000, 0:13 in this run; grid 0:13, about 0:39 left\x1b[K"
    )
    assert "\n" not in terminal.getvalue()
    narrow = GridProgress(runs, Terminal(), clock=clock, width=40)
    narrow.start(1)
    narrow.watch()  # cut to the terminal: a wrapped line could not be rewritten
    assert narrow.stream.getvalue() == "\r" + narrow.line(clock.now)[:39] + "\x1b[K"
    progress.finish(1)
    assert terminal.getvalue().endswith("\r\x1b[K")  # the run's own line comes next


def test_the_runner_watches_a_run_while_it_goes_and_stops_one_past_its_timeout(tmp_path):
    from fedx.compare.runner import ComparisonRunner

    (run,) = two_runs(tmp_path, rounds=3)[:1]
    run.directory.mkdir(parents=True)
    writer = (
        "import json, sys, time\n"
        "rows = [{'round': 0, 'accuracy': 0.1}]\n"
        "for r in (1, 2, 3):\n"
        "    time.sleep(0.4)\n"
        "    rows.append({'round': r, 'accuracy': 0.1 + 0.2 * r})\n"
        "    open(sys.argv[1] + '.tmp', 'w').write(json.dumps({'rounds': rows}))\n"
        "    __import__('os').replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    )
    log = io.StringIO()
    progress = GridProgress([run], log, interval=0.0, poll=0.05)
    runner = ComparisonRunner(tmp_path, tmp_path / "state", "", run_timeout=60.0)
    progress.start(0)
    process = subprocess.Popen([sys.executable, "-c", writer, str(run.directory / METRICS_FILE)])
    assert runner._wait(process, time.perf_counter(), progress) is False  # pylint: disable=protected-access
    assert process.returncode == 0
    shown = [int(line.split("round ")[1].split("/")[0]) for line in log.getvalue().splitlines()]
    assert shown and shown == sorted(set(shown)) and shown[-1] >= 2, log.getvalue()

    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    slow = ComparisonRunner(tmp_path, tmp_path / "state", "", run_timeout=0.5)
    started = time.perf_counter()
    assert slow._wait(hung, started, None) is True  # pylint: disable=protected-access
    assert hung.returncode is not None and time.perf_counter() - started < 30
