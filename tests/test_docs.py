"""The documentation site: built by Sphinx without a warning, and read in a real browser.

One build for the module (Sphinx's ``-W``: a broken reference, a link to a
missing page or heading, a docstring that does not parse fails it), into a
temporary folder; the run-config page is checked against the method registry
it is generated from. Then ``docs/check_site.py`` opens every page of the
built site in Debian's headless Chromium and follows every internal link,
and is itself shown to fail on a copy of the site with a broken page link, a
broken anchor, a missing image and an error in the console. The front page's
screenshot stays in the module's temporary folder (``front-page.png``).
"""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedx.config import APP_KEYS
from fedx.reference import _toml  # pylint: disable=protected-access
from fedx.registry import builtin_methods
from tests.helpers import REPO, skip_unless_ci, skip_unless_importable

CHECK = REPO / "docs" / "check_site.py"
BROWSER = ("/usr/bin/chromium", "/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built from scratch (an incremental build would not repeat old warnings).

    One process: about 15 s of CPU; two (``-j 2``) cost more CPU and, beside
    the suite's other workers, more wall time too.
    """
    skip_unless_importable("sphinx")
    out = tmp_path_factory.mktemp("docs")
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


def _cells(html: str) -> dict[str, list[str]]:
    """Table rows of a built page, by the text of their first cell: each row's cells' text."""
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S):
        cells = [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        if cells:
            rows[cells[0]] = cells
    return rows


def test_the_site_builds_without_a_warning_and_has_every_page(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    sources = {
        p.relative_to(REPO / "docs").with_suffix(".html").as_posix()
        for p in (REPO / "docs").rglob("*.md")
        if "_build" not in p.parts
    }
    assert sources and sources <= pages
    assert {"api/strategies.html", "api/ops.html", "gpu.html", "flower-changes.html"} <= pages
    strategies = (site / "api" / "strategies.html").read_text()
    # autodoc and napoleon turned the numpy-style docstrings into fields, not text.
    assert 'id="fedx.strategies.FedMR"' in strategies
    assert "Parameters" in strategies and ".. py:" not in strategies


def test_the_run_config_page_is_the_registrys(site):
    rows = _cells((site / "run-config.html").read_text())
    declared = [*APP_KEYS, *(key for method in builtin_methods() for key in method.keys)]
    assert {key.name for key in declared} <= set(rows)
    for key in declared:
        assert rows[key.name][1] == _toml(key.default).replace('"', "&quot;"), key.name
        assert rows[key.name][2], key.name
    # A placeholder in a cell is shown as text, not swallowed as an HTML tag.
    assert "fixed:&lt;name&gt;" in rows["fedme-initial-architecture"][2]


def _check(site: Path, screenshot: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), str(site), "--screenshot", str(screenshot)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    missing = [tool for tool in BROWSER if not Path(tool).exists()]
    if missing:
        skip_unless_ci(
            f"no browser check: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        )


def test_every_page_opens_in_chromium_without_a_problem(site, browser):
    screenshot = site.parent / "front-page.png"
    done = _check(site, screenshot)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert re.search(r"check_site: \d{2,} pages, \d{3,} internal links .*: 0 problems", done.stdout)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_the_check_fails_on_a_broken_link_a_broken_anchor_a_missing_image_and_a_console_error(
    site, browser, tmp_path
):
    broken = tmp_path / "html"
    shutil.copytree(site, broken)

    def edit(page: str, old: str, new: str) -> None:
        path = broken / page
        text = path.read_text()
        assert old in text, (page, old)
        path.write_text(text.replace(old, new, 1))

    # One link in the page's text (not its head's rel="next"), and one anchor.
    edit(
        "index.html",
        '<a class="reference internal" href="getting-started.html">',
        '<a href="getting-startd.html">',
    )
    edit(
        "methods.html",
        'href="run-config.html#run-config-fedmr"',
        'href="run-config.html#run-config-fedmx"',
    )
    edit("compare.html", "</body>", '<script>console.error("injected by the test")</script></body>')
    (broken / "_images" / "digits-cnn-dir0.1.png").unlink()

    done = _check(broken, tmp_path / "front-page.png")
    assert done.returncode == 1, done.stdout[-6000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "/index.html: broken link to /getting-startd.html (HTTP 404)" in lines
    assert (
        "/methods.html: broken link to /run-config.html#run-config-fedmx (no such anchor)" in lines
    )
    assert any(
        line.startswith("/compare.html: browser console:") and "injected by the test" in line
        for line in lines
    )
    assert "/results.html: /_images/digits-cnn-dir0.1.png not served (HTTP 404)" in lines
    # Nothing else is reported: the rest of the copy is the site that passed.
    pages = {line.split(":")[0] for line in lines[:-1]}
    assert pages == {"/index.html", "/methods.html", "/compare.html", "/results.html"}, lines
