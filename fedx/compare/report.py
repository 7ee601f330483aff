"""Tables and learning curves from a comparison's finished runs.

Each run's ``metrics.json`` gives its curve (test accuracy of the global
model after each evaluated round; for personalized methods the mean over
clients of each client's model on its own test split). Per setting and
method the report gives the final accuracy as mean ± sample standard
deviation over seeds, the rounds needed to reach a target accuracy, and
the wall time of a run. A run that the app stopped because it diverged
(``stop-reason`` in its ``metrics.json``) is reported as diverged, never as
a number: the means, targets and curves are those of the other seeds.

A method has one colour and line style in every plot (:func:`method_style`),
and the legends sit beside the axes, not on the curves. The report's CSV
files hold everything the plots and tables are made of: a report can be
drawn again from them alone (:func:`results_from_csv`), without the runs'
folders.
"""

import csv
import json
import math
import statistics
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
from matplotlib.ticker import MaxNLocator  # noqa: E402  pylint: disable=wrong-import-position

from fedx.compare.plan import DONE, RUN_RECORD, PlannedRun, comparison_methods  # noqa: E402
from fedx.outputs import METRICS_FILE  # noqa: E402

SUMMARY_CSV = "results.csv"
RUNS_CSV = "runs.csv"
CURVES_CSV = "curves.csv"
SUMMARY_MARKDOWN = "results.md"
OVERVIEW_PLOT = "overview.png"
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
    #: The git commit of the app that ran it (``""``: not known).
    commit: str = ""

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
        commit=record.get("app-commit", ""),
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
        "setting method seed metric rounds final_accuracy wall_seconds round_seconds stop_reason "
        "commit",
        (
            [r.setting, r.method, r.seed, r.metric, r.curve[-1][0],
             "diverged" if r.diverged else f"{r.final_accuracy:.4f}",
             f"{r.wall_seconds:.1f}", f"{r.round_seconds:.3f}", r.stop_reason or "", r.commit]
            for r in results
        ),
    )  # fmt: skip


def write_curves_csv(path: Path, results: list[RunResult]) -> None:
    """One line per run and evaluated round: the learning curves the plots draw."""
    _write_csv(
        path,
        "setting method seed round accuracy",
        ([r.setting, r.method, r.seed, x, f"{a:.4f}"] for r in results for x, a in r.curve),
    )


def results_from_csv(runs_csv: Path, curves_csv: Path) -> list[RunResult]:
    """The runs of a report, read back from its ``runs.csv`` and ``curves.csv``.

    What :func:`write_report` wrote, for drawing the plots or the tables
    again without the runs' folders (the metric is the runs' own).
    """
    curves: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    with curves_csv.open() as file:
        for row in csv.DictReader(file):
            key = (row["setting"], row["method"], int(row["seed"]))
            curves.setdefault(key, []).append((int(row["round"]), float(row["accuracy"])))
    results = []
    with runs_csv.open() as file:
        for row in csv.DictReader(file):
            key = (row["setting"], row["method"], int(row["seed"]))
            results.append(
                RunResult(
                    *key,
                    metric=row["metric"],
                    curve=tuple(sorted(curves[key])),
                    wall_seconds=float(row["wall_seconds"]),
                    round_seconds=float(row["round_seconds"]),
                    stop_reason=row.get("stop_reason") or None,
                    commit=row.get("commit") or "",
                )
            )
    return results


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


#: Colours for methods that declare no style, chosen by name (so a method
#: keeps its colour from plot to plot); none is a built-in's.
_OTHER_COLOURS = ("#7f3c8d", "#a5aa99", "#11a579", "#3969ac", "#f2b701", "#e73f74", "#80ba5a")


def _declared_styles() -> dict[str, dict[str, Any]]:
    """The plot style each registered method's variants declare, in registry order."""
    return {
        name: dict(variant.style)
        for name, (_, variant) in comparison_methods().items()
        if variant.style
    }


def method_style(method: str) -> dict[str, Any]:
    """The colour and line style of ``method`` in every plot: as declared, else by its name."""
    declared = _declared_styles().get(method)
    if declared is not None:
        return declared
    colour = _OTHER_COLOURS[zlib.crc32(method.encode()) % len(_OTHER_COLOURS)]
    return {"color": colour, "linestyle": (0, (1, 1))}


def _method_order(methods: Iterable[str]) -> list[str]:
    """Methods with a declared style in registry order (baselines first), then the others as they come."""
    methods = list(dict.fromkeys(methods))
    known = [m for m in _declared_styles() if m in methods]
    return known + [m for m in methods if m not in known]


def _draw_curves(axes: Any, setting: str, results: list[RunResult], methods: list[str]) -> None:
    """Each method's mean accuracy per round on ``setting``, ± one std over seeds."""
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
        style = method_style(method)
        axes.plot(rounds, mean, label=f"{method} ({seeds})", linewidth=1.8, **style)
        axes.fill_between(rounds, mean - std, mean + std, color=style["color"], alpha=0.12)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole
    axes.set_xlabel("round")
    axes.set_ylabel("test accuracy")
    axes.set_title(setting)
    axes.grid(alpha=0.3)


def plot_setting(
    path: Path, setting: str, results: list[RunResult], metadata: dict[str, str] | None = None
) -> None:
    """Mean accuracy per round of every method on one setting, ± one std over seeds.

    The legend sits to the right of the axes; ``metadata`` goes into the
    PNG file's text chunks (for example where its numbers came from).
    """
    methods = _method_order(r.method for r in results if r.setting == setting)
    figure, axes = plt.subplots(figsize=(8.5, 4.5))
    _draw_curves(axes, setting, results, methods)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata=metadata)
    plt.close(figure)


def plot_overview(
    path: Path, results: list[RunResult], metadata: dict[str, str] | None = None
) -> None:
    """Every setting's curves side by side (two a row), with one legend below them.

    ``metadata`` goes into the PNG file's text chunks.
    """
    settings = list(dict.fromkeys(r.setting for r in results))
    methods = _method_order(r.method for r in results)
    rows = math.ceil(len(settings) / 2)
    columns = 1 if len(settings) == 1 else 2
    figure, grid = plt.subplots(
        rows,
        columns,
        figsize=(5.2 * columns, 3.3 * rows + 0.6),
        squeeze=False,
        layout="constrained",
    )
    for axes, setting in zip(grid.flat, settings, strict=False):
        _draw_curves(axes, setting, results, methods)
    for axes in grid.flat[len(settings) :]:
        axes.set_visible(False)
    handles: dict[str, Any] = {}
    for axes in grid.flat[: len(settings)]:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            handles.setdefault(label.split(" (")[0], handle)
    shown = [m for m in methods if m in handles]
    figure.legend(
        [handles[m] for m in shown],
        shown,
        loc="outside lower center",
        ncol=min(len(shown), 5),
        frameon=False,
    )
    figure.savefig(path, dpi=110, metadata=metadata)
    plt.close(figure)


def write_report(
    out_dir: Path, runs: list[PlannedRun], target: float | None
) -> tuple[list[MethodSummary], list[Path]]:
    """Write results.md, results.csv, runs.csv, curves.csv and the plots.

    One plot per setting, and with two settings or more ``overview.png``
    with all of them. Returns the table rows and the files written; runs
    that have not finished are left out.
    """
    results = [result for run in runs if (result := load_result(run)) is not None]
    if not results:
        return [], []
    rows = summarize_runs(results, target)
    paths = [
        out_dir / SUMMARY_MARKDOWN,
        out_dir / SUMMARY_CSV,
        out_dir / RUNS_CSV,
        out_dir / CURVES_CSV,
    ]
    write_markdown(paths[0], rows, results)
    write_csv(paths[1], rows)
    write_runs_csv(paths[2], results)
    write_curves_csv(paths[3], results)
    paths += write_plots(out_dir, results)
    return rows, paths


def write_plots(out_dir: Path, results: list[RunResult]) -> list[Path]:
    """One plot per setting, and ``overview.png`` when there are several settings."""
    paths = []
    settings = list(dict.fromkeys(r.setting for r in results))
    for setting in settings:
        paths.append(out_dir / f"{setting}.png")
        plot_setting(paths[-1], setting, results)
    if len(settings) > 1:
        paths.append(out_dir / OVERVIEW_PLOT)
        plot_overview(paths[-1], results)
    return paths
