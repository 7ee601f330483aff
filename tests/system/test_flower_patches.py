"""The fixes of Flower's bugs as patches for Flower (patches/flower/): they apply to the installed
Flower, and their reproduction tests fail without the fixes and pass with them.

Flower's own sources are those installed (flwr 1.41 and 1.42 have the same
SuperNode loop), laid out as in Flower's repository; each test run is Flower's
test file in a pytest of its own, with that copy first on ``PYTHONPATH``.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import flwr

from tests.support.helpers import REPO

# No system starts here, but two runs of Flower's tests, each importing Flower's SuperNode
# afresh, are too slow for the inner loop: with the system tests.

PATCHES = sorted((REPO / "patches" / "flower").glob("*.patch"))
TEST = "framework/py/flwr/supernode/start_client_internal_stopped_run_test.py"
LOOP = "framework/py/flwr/supernode/start_client_internal.py"


def _git(folder: Path, *arguments: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=fedx", "-c", "user.email=fedx@example.invalid", *arguments],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _flowers_tests(folder: Path) -> dict[str, int]:
    """Flower's reproduction tests, run on the copy in ``folder``: counts of passed and failed."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-o", "addopts=", TEST],
        cwd=folder, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(folder / "framework" / "py")},
    )  # fmt: skip
    counts = dict.fromkeys(("passed", "failed"), 0)
    for count, outcome in re.findall(r"(\d+) (passed|failed)", done.stdout.splitlines()[-1]):
        counts[outcome] = int(count)
    assert counts["passed"] + counts["failed"] == 3, done.stdout[-3000:] + done.stderr[-3000:]
    return counts


def test_the_patches_apply_and_their_tests_show_the_bugs_and_the_fixes(tmp_path):
    assert [p.name[:5] for p in PATCHES] == ["0001-", "0002-"]
    shutil.copytree(
        Path(flwr.__file__).parent,
        tmp_path / "framework" / "py" / "flwr",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "framework")
    _git(tmp_path, "commit", "-qm", "Flower as installed")
    _git(tmp_path, "am", *map(str, PATCHES))
    assert _flowers_tests(tmp_path) == {"passed": 3, "failed": 0}
    # The same tests on Flower's own loop: the two bugs.
    _git(tmp_path, "checkout", "HEAD~2", "--", LOOP)
    assert _flowers_tests(tmp_path) == {"passed": 1, "failed": 2}
