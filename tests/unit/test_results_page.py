"""docs/results.md shows this release's runs: its tables and figures come from the CSV files beside it.

``docs/results/figures.py --check`` compares every generated table of the
page with what the CSV files give, and every figure's source (the digest
of the CSV rows it was drawn from and their commit, in its PNG metadata)
with the CSV files; it refuses runs of several commits, or of a commit
with uncommitted changes, in one table.
"""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path("docs/results/figures.py")


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_pages_tables_and_figures_are_drawn_from_the_csv_files():
    result = check(REPO)
    assert result.returncode == 0, result.stderr


def test_the_first_table_and_figure_name_the_commit_of_their_runs():
    page = (REPO / "docs/results.md").read_text()
    with (REPO / "docs/results/digits/runs.csv").open() as file:
        commits = {row["commit"] for row in csv.DictReader(file)}
    assert len(commits) == 1
    (commit,) = commits
    first_figure = page.index("![")
    first_table = page.index("<!-- table: accuracy -->")
    assert (
        first_figure < first_table < page.index("\n## ", first_table)
    )  # both in the first section
    assert f"`{commit[:7]}`" in page[first_table : page.index("<!-- end table -->", first_table)]


def test_the_check_fails_when_a_run_changes_or_comes_from_another_commit(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    shutil.copytree(REPO / "docs/results", root / "docs/results")
    shutil.copy(REPO / "docs/results.md", root / "docs/results.md")
    assert check(root).returncode == 0

    curves_csv = root / "docs/results/digits/curves.csv"
    lines = curves_csv.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("digits-cnn-dir0.1,fedavg,0,"))
    *key, accuracy = lines[last].split(",")
    lines[last] = ",".join([*key, f"{float(accuracy) - 0.1:.4f}"])  # one run's last round, changed
    curves_csv.write_text("\n".join(lines) + "\n")
    result = check(root)
    assert result.returncode == 1
    assert "a table differs" in result.stderr and "overview.png was drawn from" in result.stderr
    shutil.copy(REPO / "docs/results/digits/curves.csv", curves_csv)

    runs_csv = root / "docs/results/digits/runs.csv"
    original = runs_csv.read_text()
    rows = original.splitlines()
    header, first = rows[0].split(","), rows[1].split(",")
    column = header.index("final_accuracy")
    first[column] = f"{float(first[column]) - 0.1:.4f}"  # one run's final accuracy, changed
    runs_csv.write_text("\n".join([rows[0], ",".join(first), *rows[2:]]) + "\n")
    result = check(root)
    assert result.returncode == 1 and "overview.png was drawn from" in result.stderr

    first = rows[1].split(",")
    first[header.index("commit")] = "0" * 40  # one run of another commit
    runs_csv.write_text("\n".join([rows[0], ",".join(first), *rows[2:]]) + "\n")
    result = check(root)
    assert result.returncode != 0 and "not one clean commit" in result.stderr
