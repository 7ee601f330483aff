"""Tables and learning curves from a comparison's finished runs.

Each run's ``metrics.json`` gives its curve (test accuracy of the global
model after each evaluated round; for personalized methods the mean over
clients of each client's model on its own test split). Per setting and
method the report gives the final accuracy as mean ± sample standard
deviation over seeds, the rounds needed to reach a target accuracy, and
the wall time of a run. A run that the app stopped because it diverged
(``stop-reason`` in its ``metrics.json``) is reported as diverged, never as
a number: the means, targets and curves are those of the other seeds.
"""

import csv
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

from fedx.compare.plan import DONE, RUN_RECORD, PlannedRun  # noqa: E402
from fedx.outputs import METRICS_FILE  # noqa: E402

SUMMARY_CSV = "results.csv"
RUNS_CSV = "runs.csv"
SUMMARY_MARKDOWN = "results.md"
#: Without an explicit target, a setting's target is this share of the best
#: method's mean final accuracy: how fast each method gets close to the best.
DEFAULT_TARGET_SHARE = 0.95


@dataclass(frozen=True)
class RunResult:
    """The curve and timings of one finished run."""

    setting: str
    method: str
    seed: int
    metric: str
    curve: tuple[tuple[int, float], ...]
    wall_seconds: float
    round_seconds: float
    #: Why the app stopped the run early (it diverged); ``None`` when it ran all its rounds.
    stop_reason: str | None = None

    @property
    def diverged(self) -> bool:
        """Whether the run diverged (its accuracy means nothing)."""
        return self.stop_reason is not None

    @property
    def final_accuracy(self) -> float:
        """Accuracy after the last round."""
        return self.curve[-1][1]

    def rounds_to(self, target: float) -> int | None:
        """The first evaluated round with accuracy >= ``target`` (``None``: never, or diverged)."""
        if self.diverged:
            return None
        return next((r for r, accuracy in self.curve if r > 0 and accuracy >= target), None)


def load_result(run: PlannedRun) -> RunResult | None:
    """Read a run's curve, or ``None`` when it has neither finished nor diverged."""
    try:
        record = json.loads((run.directory / RUN_RECORD).read_text())
        metrics = json.loads((run.directory / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if record.get("status") not in DONE:
        return None
    rows = metrics["rounds"]
    metric = "accuracy" if any("accuracy" in row for row in rows) else "personalized-accuracy"
    curve = tuple((row["round"], float(row[metric])) for row in rows if metric in row)
    return RunResult(
        run.setting,
        run.method,
        run.seed,
        metric,
        curve,
        wall_seconds=float(record["wall-seconds"]),
        round_seconds=float(metrics["timings"]["mean-round-seconds"] or 0.0),
        stop_reason=metrics.get("stop-reason") or record.get("stop-reason"),
    )


@dataclass(frozen=True)
class MethodSummary:
    """One row of the results table: a method on a setting over its seeds."""

    setting: str
    method: str
    metric: str
    seeds: tuple[int, ...]
    final_mean: float
    final_std: float
    target: float
    rounds_to_target: tuple[int | None, ...]
    wall_seconds: float
    round_seconds: float
    #: The seeds whose runs diverged (left out of the mean and std).
    diverged: tuple[int, ...] = ()

    def final_text(self) -> str:
        """Mean ± std of the final accuracy, or ``diverged``, with how many seeds diverged."""
        share = f"{len(self.diverged)}/{len(self.seeds)} seeds"
        if len(self.diverged) == len(self.seeds):
            return f"diverged ({share})"
        text = f"{self.final_mean:.4f} ± {self.final_std:.4f}"
        return f"{text} ({share} diverged)" if self.diverged else text

    @property
    def reached(self) -> list[int]:
        """Rounds to target of the seeds that reached it."""
        return [r for r in self.rounds_to_target if r is not None]

    def rounds_text(self) -> str:
        """Mean rounds to target, with how many seeds reached it when not all did."""
        reached = self.reached
        if not reached:
            return "not reached"
        text = f"{statistics.fmean(reached):.1f}"
        if len(reached) < len(self.rounds_to_target):
            text += f" ({len(reached)}/{len(self.rounds_to_target)} seeds)"
        return text


def _number(value: float) -> str:
    """A mean or std for a CSV cell: empty when there is none (every seed diverged)."""
    return "" if math.isnan(value) else f"{value:.4f}"


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize_runs(results: list[RunResult], target: float | None) -> list[MethodSummary]:
    """Group results by setting and method (in the order they come) into table rows."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for result in results:
        groups.setdefault((result.setting, result.method), []).append(result)
    best: dict[str, float] = {}
    for (setting, _), group in groups.items():
        finals = [r.final_accuracy for r in group if not r.diverged]
        if finals:
            best[setting] = max(best.get(setting, 0.0), statistics.fmean(finals))
    rows = []
    for (setting, method), group in groups.items():
        finals = [r.final_accuracy for r in group if not r.diverged]
        setting_target = (
            target
            if target is not None
            else round(DEFAULT_TARGET_SHARE * best.get(setting, math.nan), 3)
        )
        rows.append(
            MethodSummary(
                setting,
                method,
                group[0].metric,
                tuple(r.seed for r in group),
                statistics.fmean(finals) if finals else math.nan,
                _std(finals) if finals else math.nan,
                setting_target,
                tuple(r.rounds_to(setting_target) for r in group),
                statistics.fmean(r.wall_seconds for r in group),
                statistics.fmean(r.round_seconds for r in group),
                tuple(r.seed for r in group if r.diverged),
            )
        )
    return rows


def _write_csv(path: Path, header: str, rows: Iterable[list[object]]) -> None:
    """A CSV file: the space-separated column names of ``header``, then ``rows``."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header.split())
        writer.writerows(rows)


def write_csv(path: Path, rows: list[MethodSummary]) -> None:
    """One line per setting and method."""
    _write_csv(
        path,
        "setting method metric seeds final_accuracy_mean final_accuracy_std target "
        "rounds_to_target_mean seeds_reaching_target wall_seconds_mean round_seconds_mean "
        "seeds_diverged",
        (
            [row.setting, row.method, row.metric, " ".join(map(str, row.seeds)),
             _number(row.final_mean), _number(row.final_std), f"{row.target:.3f}",
             f"{statistics.fmean(row.reached):.2f}" if row.reached else "",
             len(row.reached), f"{row.wall_seconds:.1f}", f"{row.round_seconds:.3f}",
             " ".join(map(str, row.diverged))]
            for row in rows
        ),
    )  # fmt: skip


def write_runs_csv(path: Path, results: list[RunResult]) -> None:
    """One line per run: its final accuracy and wall time."""
    _write_csv(
        path,
        "setting method seed metric rounds final_accuracy wall_seconds round_seconds stop_reason",
        (
            [r.setting, r.method, r.seed, r.metric, r.curve[-1][0],
             "diverged" if r.diverged else f"{r.final_accuracy:.4f}",
             f"{r.wall_seconds:.1f}", f"{r.round_seconds:.3f}", r.stop_reason or ""]
            for r in results
        ),
    )  # fmt: skip


def markdown_table(rows: list[MethodSummary]) -> str:
    """The rows of one setting as a Markdown table."""
    target = rows[0].target
    lines = [
        f"| Method | Seeds | Final accuracy (mean ± std) | Rounds to {target:.3f} "
        "| Run wall time (s) | Round (s) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        personalized = " (personalized)" if row.metric != "accuracy" else ""
        lines.append(
            f"| {row.method}{personalized} | {len(row.seeds)} "
            f"| {row.final_text()} "
            f"| {row.rounds_text()} | {row.wall_seconds:.0f} | {row.round_seconds:.2f} |"
        )
    return "\n".join(lines)


def write_markdown(path: Path, rows: list[MethodSummary], results: list[RunResult]) -> None:
    """Every setting's table, with its seeds, rounds and target."""
    sections = ["# Comparison results", ""]
    for setting in dict.fromkeys(row.setting for row in rows):
        setting_rows = [row for row in rows if row.setting == setting]
        rounds = max(r.curve[-1][0] for r in results if r.setting == setting)
        seeds = sorted({s for row in setting_rows for s in row.seeds})
        sections += [
            f"## {setting}",
            "",
            f"Seeds {', '.join(map(str, seeds))}; {rounds} rounds; target accuracy "
            f"{setting_rows[0].target:.3f}; plot: `{setting}.png`.",
            "",
            markdown_table(setting_rows),
            "",
        ]
    path.write_text("\n".join(sections))


def plot_setting(path: Path, setting: str, results: list[RunResult]) -> None:
    """Mean accuracy per round of every method on one setting, ± one std over seeds."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    methods = dict.fromkeys(r.method for r in results if r.setting == setting)
    for method in methods:
        runs = [r for r in results if r.setting == setting and r.method == method]
        group = [r for r in runs if not r.diverged]
        if not group:
            continue  # a diverged run's curve is no learning curve
        rounds = sorted(set.intersection(*(set(dict(r.curve)) for r in group)))
        values = np.array([[dict(r.curve)[x] for x in rounds] for r in group])
        mean, std = values.mean(axis=0), values.std(axis=0, ddof=1 if len(group) > 1 else 0)
        seeds = f"{len(group)} seed" if len(group) == 1 else f"{len(group)} seeds"
        if len(group) < len(runs):
            seeds += f", {len(runs) - len(group)} diverged"
        (line,) = axes.plot(rounds, mean, label=f"{method} ({seeds})")
        axes.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    axes.set_xlabel("round")
    axes.set_ylabel("test accuracy")
    axes.set_title(setting)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    out_dir: Path, runs: list[PlannedRun], target: float | None
) -> tuple[list[MethodSummary], list[Path]]:
    """Write results.md, results.csv, runs.csv and one plot per setting.

    Returns the table rows and the files written; runs that have not
    finished are left out.
    """
    results = [result for run in runs if (result := load_result(run)) is not None]
    if not results:
        return [], []
    rows = summarize_runs(results, target)
    paths = [out_dir / SUMMARY_MARKDOWN, out_dir / SUMMARY_CSV, out_dir / RUNS_CSV]
    write_markdown(paths[0], rows, results)
    write_csv(paths[1], rows)
    write_runs_csv(paths[2], results)
    for setting in dict.fromkeys(r.setting for r in results):
        paths.append(out_dir / f"{setting}.png")
        plot_setting(paths[-1], setting, results)
    return rows, paths
