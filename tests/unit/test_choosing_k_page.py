"""docs/choosing-k.md's K sweep is the one in docs/choosing-k/k-sweep.csv.

The CSV holds every round's global test accuracy of the sweep's runs (the
curves fedx-compare wrote, one row per K, method, seed and round); the
page's table and its sentence on seed 1 are computed from it here.
"""

import csv
import re
from collections import defaultdict

from tests.support.helpers import REPO

PAGE = REPO / "docs" / "choosing-k.md"
DATA = REPO / "docs" / "choosing-k" / "k-sweep.csv"
NAMES = {"FedMR": "fedmr", "FedMut": "fedmut", "FedCross": "fedcross"}


def _curves() -> dict[tuple[int, str, int], list[tuple[int, float]]]:
    curves = defaultdict(list)
    with DATA.open() as file:
        for row in csv.DictReader(file):
            key = (int(row["k"]), row["method"], int(row["seed"]))
            curves[key].append((int(row["round"]), float(row["accuracy"])))
    return curves


def test_the_pages_table_is_the_csvs_runs():
    curves = _curves()
    rows = re.findall(
        r"^\| (FedMR|FedMut|FedCross) \| (\d+) \| ([\d.]+) \| (\d+|never) \| (\d+|never) \|$",
        PAGE.read_text(),
        re.MULTILINE,
    )
    assert len(rows) == 9
    for method, k, final, first, trainings in rows:
        curve = sorted(curves[(int(k), NAMES[method], 0)])
        assert curve[-1][0] == 40 and final == f"{curve[-1][1]:.3f}", (method, k)
        reached = [r for r, accuracy in curve if accuracy >= 0.90]
        expected = str(reached[0]) if reached else "never"
        assert first == expected, (method, k)
        assert trainings == (str(int(k) * reached[0]) if reached else "never"), (method, k)


def test_the_pages_seed_1_at_k_2_is_the_csvs():
    curves = _curves()
    text = " ".join(PAGE.read_text().split())
    for method in ("FedMR", "FedCross"):
        (last_round, accuracy) = sorted(curves[(2, NAMES[method], 1)])[-1]
        assert last_round == 40 and re.search(rf"{method} (ended )?at {accuracy:.3f}\b", text)
        assert max(a for _, a in curves[(2, NAMES[method], 1)]) < 0.90  # neither reaching 0.90
    # FedMut was stopped as diverged after round 39.
    assert sorted(curves[(2, "fedmut", 1)])[-1][0] == 39
    assert "FedMut was stopped as diverged after round 39" in text
