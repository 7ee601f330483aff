"""Draw the figures of docs/results.md from the CSV files beside this script.

The digits grid's ``runs.csv`` and ``curves.csv`` are what ``fedx-compare``
wrote; this script draws them again with fedx-compare's own plotting code
(:mod:`fedx.compare.report`: one colour per method in every figure), so the
figures change only with the numbers or with that code::

    python docs/results/figures.py

It also prints the summary table of docs/results.md (final accuracy and
rounds to the target, per method and setting) for checking the page
against the CSVs.
"""

import argparse
import statistics
import sys
from pathlib import Path

from fedx.compare.report import (
    CURVES_CSV,
    RUNS_CSV,
    plot_overview,
    plot_setting,
    results_from_csv,
    summarize_runs,
)

HERE = Path(__file__).resolve().parent
#: The settings in the order the page shows them.
SETTINGS = ("digits-cnn-dir0.1", "digits-cnn-dir0.5", "digits-cnn-dir1.0", "digits-cnn-iid")


def main(argv: list[str] | None = None) -> int:
    # No options; parsed so that `--help` says what the script does instead of drawing.
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    results = results_from_csv(HERE / RUNS_CSV, HERE / CURVES_CSV)
    results.sort(key=lambda r: (SETTINGS.index(r.setting), r.method, r.seed))
    plot_overview(HERE / "overview.png", results)
    for setting in SETTINGS:
        if any(r.setting == setting for r in results):
            plot_setting(HERE / f"{setting}.png", setting, results)
    rows = summarize_runs(results, target=None)
    methods = list(dict.fromkeys(row.method for row in rows))
    print("| method | " + " | ".join(SETTINGS) + " |")
    print("|---" * (len(SETTINGS) + 1) + "|")
    for method in methods:
        cells = []
        for setting in SETTINGS:
            row = next((r for r in rows if r.method == method and r.setting == setting), None)
            if row is None:
                cells.append("")
                continue
            rounds = f"{statistics.fmean(row.reached):.0f}" if row.reached else "–"
            cells.append(f"{row.final_mean:.3f} ({rounds})")
        print(f"| {method} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
