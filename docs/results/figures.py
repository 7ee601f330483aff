"""Draw the figures and write the tables of docs/results.md from the CSV files beside this script.

Each folder here holds what one ``fedx-compare`` command wrote (its
``runs.csv`` and ``curves.csv``, one line a run and one a run and round, with
the commit of fedx that made each run); ``authors.csv`` holds the runs of the
authors' own round loops (``docs/results/authors_loops.py``) on the same
settings, seeds, partitions and initial models. This script draws the
figures with fedx-compare's own plotting code (:mod:`fedx.compare.report`:
one colour per method in every figure) and writes every generated table
into docs/results.md, between the markers ``<!-- table: NAME -->`` and
``<!-- end table -->``::

    python docs/results/figures.py           # draw the figures, rewrite the tables
    python docs/results/figures.py --check   # exit 1 when the page or a figure is out of date

A figure carries, in its PNG metadata, the digest of the CSV rows it was
drawn from and their commit; ``--check`` compares both with the CSV files,
and the page's tables with what the CSV files give now (the check
``tests/unit/test_results_page.py`` runs).
"""

import argparse
import csv
import dataclasses
import hashlib
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fedx.compare.report import (
    CURVES_CSV,
    RUNS_CSV,
    RunResult,
    plot_overview,
    plot_setting,
    results_from_csv,
    summarize_runs,
)

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "results.md"
#: The settings in the order the page shows them, with their names on the page.
SETTINGS = {
    "digits-cnn-dir0.1": "Dirichlet 0.1",
    "digits-cnn-dir0.5": "Dirichlet 0.5",
    "digits-cnn-dir1.0": "Dirichlet 1.0",
    "digits-cnn-iid": "IID",
}
#: The methods in the order the page lists them: the baselines, then the
#: methods of one paper together (others after these, by name).
METHODS = (
    "fedavg",
    "fedprox",
    "fedmr",
    "fedmr-two-stage",
    "fedindep",
    "fedmut",
    "fedcross",
    "fedme",
)


def _method_rank(method: str) -> tuple[int, str]:
    return (METHODS.index(method) if method in METHODS else len(METHODS), method)


#: What each folder holds: one fedx-compare command's runs.
GRID = HERE / "digits"  # every method, every setting, seeds 0-2, 40 rounds
LONG = HERE / "digits-dir0.1-150-rounds"  # Dirichlet 0.1 over 150 rounds
FEDCROSS_LAYER_PAIRS = HERE / "fedcross-layer-pairs"  # FedCross with the authors' similarity
FEDME = HERE / "digits-fedme"  # FedMe, every setting, seeds 0-2, 40 rounds, personalized
AUTHORS = HERE / "authors.csv"
#: The authors' table's row of FedCross run with the authors' similarity.
LAYER_PAIRS_ROW = "fedcross, layer pairs"
#: PNG metadata key of a figure's source: ``sha256=<digest of its CSV rows> commit=<commit>``.
SOURCE_KEY = "Source"
#: Quantiles of Student's t for two-sided 95% intervals, by degrees of freedom.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}  # fmt: skip


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Runs:
    """The runs of one fedx-compare command, and what identifies them."""

    results: list[RunResult]
    digest: str
    commit: str

    @classmethod
    def load(cls, folder: Path) -> "Runs":
        runs_csv, curves_csv = folder / RUNS_CSV, folder / CURVES_CSV
        results = results_from_csv(runs_csv, curves_csv)
        results.sort(
            key=lambda r: (list(SETTINGS).index(r.setting), _method_rank(r.method), r.seed)
        )
        commits = {r.commit for r in results}
        if len(commits) != 1 or "" in commits or any(c.endswith("-dirty") for c in commits):
            raise ValueError(
                f"{folder}: the runs come from {sorted(commits)}, not one clean commit"
            )
        digest = hashlib.sha256(runs_csv.read_bytes() + curves_csv.read_bytes()).hexdigest()
        return cls(results, digest, commits.pop())

    @property
    def source(self) -> str:
        return f"sha256={self.digest} commit={self.commit}"

    def short_commit(self) -> str:
        return self.commit[:7]


@dataclass(frozen=True)
class AuthorsRun:
    setting: str
    method: str
    seed: int
    final_accuracy: float


def load_authors(path: Path) -> list[AuthorsRun]:
    with path.open() as file:
        return [
            AuthorsRun(
                row["setting"], row["method"], int(row["seed"]), float(row["final_accuracy"])
            )
            for row in csv.DictReader(file)
        ]


# ----------------------------------------------------------------------------- tables


def _cell(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}"


def _rounds(row) -> str:
    reached = row.reached
    if not reached:
        return "–"
    text = f"{statistics.fmean(reached):.0f}"
    if len(reached) < len(row.rounds_to_target):
        text += f", {len(reached)}/{len(row.rounds_to_target)} seeds"
    return text


def accuracy_table(grid: Runs) -> str:
    """Method × setting: final accuracy, mean ± std over the seeds, and rounds to the target."""
    rows = summarize_runs(grid.results, target=None)
    methods = list(dict.fromkeys(r.method for r in rows))
    settings = [s for s in SETTINGS if any(r.setting == s for r in rows)]
    lines = [
        "| method | " + " | ".join(SETTINGS[s] for s in settings) + " |",
        "|---" * (len(settings) + 1) + "|",
    ]
    for method in methods:
        cells = []
        for setting in settings:
            row = next(r for r in rows if r.method == method and r.setting == setting)
            cells.append(f"{_cell(row.final_mean, row.final_std)} ({_rounds(row)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    seeds = sorted({r.seed for r in grid.results})
    rounds = sorted({r.curve[-1][0] for r in grid.results})
    targets = ", ".join(
        f"{SETTINGS[s]}: {next(r.target for r in rows if r.setting == s):.3f}" for s in settings
    )
    lines += [
        "",
        f"Final test accuracy after {'/'.join(map(str, rounds))} rounds, mean ± std over "
        f"seeds {', '.join(map(str, seeds))}, and in brackets the mean number of rounds to "
        f'reach 95% of the best method\'s mean in the setting ({targets}; "–": not reached). '
        f"fedx at commit `{grid.short_commit()}`, {len(grid.results)} runs.",
    ]
    return "\n".join(lines)


def fedme_table(fedme: Runs) -> str:
    """FedMe per setting: its personalized accuracy, mean ± std and each seed's."""
    settings = [s for s in SETTINGS if any(r.setting == s for r in fedme.results)]
    lines = ["| setting | personalized accuracy | seeds |", "|---|---|---|"]
    for setting in settings:
        finals = [r.final_accuracy for r in fedme.results if r.setting == setting]
        each = ", ".join(f"{value:.3f}" for value in finals)
        lines.append(
            f"| {SETTINGS[setting]} | {_cell(statistics.mean(finals), _std(finals))} | {each} |"
        )
    (metric,) = {r.metric for r in fedme.results}
    seeds = sorted({r.seed for r in fedme.results})
    rounds = sorted({r.curve[-1][0] for r in fedme.results})
    lines += [
        "",
        f"`{metric}` after {'/'.join(map(str, rounds))} rounds, mean ± std over seeds "
        f"{', '.join(map(str, seeds))}, then each seed's. fedx at commit "
        f"`{fedme.short_commit()}`, {len(fedme.results)} runs.",
    ]
    return "\n".join(lines)


def long_table(long: Runs) -> str:
    """The 150-round runs: accuracy at round 40 (the grid's budget) and at the end."""
    rows = summarize_runs(long.results, target=None)
    last = max(r.curve[-1][0] for r in long.results)
    lines = [
        f"| method | round 40 | round {last} | best round | rounds to target |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        runs = [r for r in long.results if r.method == row.method]
        at_40 = [dict(r.curve)[40] for r in runs]
        best = [max(a for x, a in r.curve if x > 0) for r in runs]
        lines.append(
            f"| {row.method} | {_cell(statistics.fmean(at_40), _std(at_40))} | "
            f"{_cell(row.final_mean, row.final_std)} | {_cell(statistics.fmean(best), _std(best))} "
            f"| {_rounds(row)} |"
        )
    seeds = sorted({r.seed for r in long.results})
    lines += [
        "",
        f"Dirichlet 0.1, {last} rounds, mean ± std over seeds {', '.join(map(str, seeds))}; "
        f'"best round": each run\'s highest accuracy; target {rows[0].target:.3f} (95% of the '
        f"best mean at round {last}). fedx at commit `{long.short_commit()}`, "
        f"{len(long.results)} runs.",
    ]
    return "\n".join(lines)


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class Paired:
    """fedx against the authors' loop on one method and setting, seed by seed."""

    method: str
    setting: str
    fedx: list[float]
    authors: list[float]

    @property
    def differences(self) -> list[float]:
        return [f - a for f, a in zip(self.fedx, self.authors, strict=True)]

    def interval(self) -> tuple[float, float, float]:
        """Mean difference and its two-sided 95% t interval (``nan`` bounds for one pair)."""
        d = self.differences
        mean = statistics.fmean(d)
        if len(d) < 2:
            return mean, math.nan, math.nan
        half = T_975[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
        return mean, mean - half, mean + half


def paired_runs(fedx: Iterable[RunResult], authors: list[AuthorsRun]) -> list[Paired]:
    """Every (method, setting) the authors' loops ran, with the seeds both sides have."""
    ours = {(r.method, r.setting, r.seed): r.final_accuracy for r in fedx if not r.diverged}
    theirs = {(a.method, a.setting, a.seed): a.final_accuracy for a in authors}
    pairs = []
    for method in sorted({a.method for a in authors}, key=_method_rank):
        for setting in SETTINGS:
            seeds = sorted(s for (m, st, s) in theirs if m == method and st == setting)
            seeds = [s for s in seeds if (method, setting, s) in ours]
            if seeds:
                pairs.append(
                    Paired(
                        method,
                        setting,
                        [ours[method, setting, s] for s in seeds],
                        [theirs[method, setting, s] for s in seeds],
                    )
                )
    return pairs


def _signed(value: float) -> str:
    text = f"{value:+.3f}"
    if float(text) == 0.0:
        return "0.000"  # not "−0.000" for a mean that rounds to nothing
    return text.replace("-", "−")


def _interval_text(pair_or_diffs) -> str:
    mean, low, high = pair_or_diffs.interval()
    if math.isnan(low):
        return f"{_signed(mean)} (one seed)"
    return f"{_signed(mean)} [{_signed(low)}, {_signed(high)}]"


def authors_table(pairs: list[Paired]) -> str:
    """Per method: the paired difference fedx − authors in each setting, and over all of them."""
    settings = [s for s in SETTINGS if any(p.setting == s for p in pairs)]
    lines = [
        "| method | " + " | ".join(SETTINGS[s] for s in settings) + " | all settings |",
        "|---" * (len(settings) + 2) + "|",
    ]
    for method in dict.fromkeys(p.method for p in pairs):
        cells = []
        for setting in settings:
            pair = next((p for p in pairs if p.method == method and p.setting == setting), None)
            cells.append("" if pair is None else _interval_text(pair))
        mine = [p for p in pairs if p.method == method]
        pooled = Paired(
            method,
            "all",
            [v for p in mine for v in p.fedx],
            [v for p in mine for v in p.authors],
        )
        cells.append(f"{_interval_text(pooled)}, {len(pooled.fedx)} pairs")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def authors_finals_table(pairs: list[Paired]) -> str:
    """Per method and setting: both sides' final accuracy, mean ± std over the paired seeds."""
    lines = ["| method | setting | seeds | fedx | authors' loop |", "|---|---|---|---|---|"]
    for p in pairs:
        lines.append(
            f"| {p.method} | {SETTINGS[p.setting]} | {len(p.fedx)} | "
            f"{_cell(statistics.fmean(p.fedx), _std(p.fedx))} | "
            f"{_cell(statistics.fmean(p.authors), _std(p.authors))} |"
        )
    return "\n".join(lines)


def options_table(variants: dict[str, tuple[list[RunResult], str]]) -> str:
    """One method under several values of a key: final accuracy per setting, mean ± std.

    ``variants``: a row label -> the runs of that value and their commit.
    """
    settings = [
        s for s in SETTINGS if any(r.setting == s for runs, _ in variants.values() for r in runs)
    ]
    lines = [
        "| key | " + " | ".join(SETTINGS[s] for s in settings) + " |",
        "|---" * (len(settings) + 1) + "|",
    ]
    for label, (runs, _) in variants.items():
        cells = []
        for setting in settings:
            finals = [r.final_accuracy for r in runs if r.setting == setting]
            cells.append(_cell(statistics.fmean(finals), _std(finals)) if finals else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    commits = sorted({commit[:7] for _, commit in variants.values()})
    seeds = sorted({r.seed for runs, _ in variants.values() for r in runs})
    rounds = sorted({r.curve[-1][0] for runs, _ in variants.values() for r in runs})
    lines += [
        "",
        f"Final accuracy after {'/'.join(map(str, rounds))} rounds, mean ± std over seeds "
        f"{', '.join(map(str, seeds))}; fedx at commit {', '.join(f'`{c}`' for c in commits)}.",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the page


def tables() -> dict[str, str]:
    """Every generated table of the page, by its marker name."""
    grid = Runs.load(GRID)
    layer_pairs = Runs.load(FEDCROSS_LAYER_PAIRS)
    authors = load_authors(AUTHORS)
    # FedCross with the authors' similarity against their Training_FedCross.py,
    # as a row of its own beside fedx's default (the paper's cosine).
    layer_pair_pairs = [
        dataclasses.replace(p, method=LAYER_PAIRS_ROW)
        for p in paired_runs(layer_pairs.results, [a for a in authors if a.method == "fedcross"])
    ]
    pairs = paired_runs(grid.results, authors)
    after = max(i for i, p in enumerate(pairs) if p.method == "fedcross") + 1
    pairs[after:after] = layer_pair_pairs
    compared = {r.setting for r in layer_pairs.results}
    paper_cosine = [r for r in grid.results if r.method == "fedcross" and r.setting in compared]
    return {
        "accuracy": accuracy_table(grid),
        "long": long_table(Runs.load(LONG)),
        "fedme": fedme_table(Runs.load(FEDME)),
        "authors": authors_table(pairs),
        "authors-finals": authors_finals_table(pairs),
        "fedcross-similarity": options_table(
            {
                '`fedcross-similarity = "model"` (the paper\'s cosine; default)': (
                    paper_cosine,
                    grid.commit,
                ),
                '`fedcross-similarity = "layer-pairs"` (the authors\' code)': (
                    layer_pairs.results,
                    layer_pairs.commit,
                ),
            }
        ),
    }


MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def page_with(text: str, generated: dict[str, str]) -> str:
    """``text`` with each marked table replaced by its generated one (every marker must be known)."""
    names = [m["name"] for m in MARKER.finditer(text)]
    unknown = sorted(set(names) - set(generated))
    if unknown:
        raise ValueError(f"{PAGE}: no table is generated for the markers {unknown}")
    return MARKER.sub(lambda m: m[1] + generated[m["name"]] + "\n" + m[4], text)


#: The figures: file name -> (what they draw, the runs they draw).
def figures() -> dict[str, tuple[Callable[[Path, dict[str, str]], None], Runs]]:
    grid = Runs.load(GRID)
    long = Runs.load(LONG)
    drawn: dict[str, tuple[Callable[[Path, dict[str, str]], None], Runs]] = {
        "overview.png": (lambda path, meta: plot_overview(path, grid.results, meta), grid),
        "digits-cnn-dir0.1-150-rounds.png": (
            lambda path, meta: plot_setting(path, "digits-cnn-dir0.1", long.results, meta),
            long,
        ),
    }
    for setting in SETTINGS:
        drawn[f"{setting}.png"] = (
            lambda path, meta, setting=setting: plot_setting(path, setting, grid.results, meta),
            grid,
        )
    return drawn


def figure_source(path: Path) -> str | None:
    """The source a figure was drawn from (its PNG metadata), ``None`` when it has none."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    with Image.open(path) as image:
        return image.text.get(SOURCE_KEY)


def check() -> list[str]:
    """What is out of date: tables on the page, figures drawn from other rows."""
    problems = []
    text = PAGE.read_text()
    names = {m["name"] for m in MARKER.finditer(text)}
    generated = tables()
    for missing in sorted(set(generated) - names):
        problems.append(f"{PAGE.name} has no marked table {missing!r}")
    if page_with(text, generated) != text:
        problems.append(f"{PAGE.name}: a table differs from the CSV files (run figures.py)")
    for name, (_, runs) in figures().items():
        path = HERE / name
        source = figure_source(path) if path.is_file() else None
        if source != runs.source:
            problems.append(f"{name} was drawn from {source}, the CSV files are {runs.source}")
        elif f"results/{name}" not in text:
            problems.append(f"{PAGE.name} does not show {name}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when out of date")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for name, (draw, runs) in figures().items():
        draw(HERE / name, {SOURCE_KEY: runs.source})
    PAGE.write_text(page_with(PAGE.read_text(), tables()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
