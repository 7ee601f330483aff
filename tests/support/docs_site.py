"""The documentation site built by Sphinx, as the docs tests check it."""

import subprocess
import sys
import time
from pathlib import Path

from tests.support.helpers import REPO


def build_site(out: Path) -> Path:
    """The site built from scratch into ``out`` (an incremental build would not repeat old
    warnings); its HTML folder.

    One process: about 15 s of CPU; two (``-j 2``) cost more CPU and, beside
    the suite's other workers, more wall time too.
    """
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(REPO / "docs"), str(out / "html")],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr.strip(), (
        f"sphinx-build -W failed ({done.returncode}) after {time.monotonic() - started:.0f} s:\n"
        f"{done.stderr[-6000:]}"
    )
    return out / "html"
