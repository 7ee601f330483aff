"""The documentation site in a real browser, and two builds of one commit.

``docs/check_site.py`` opens every page of the built site (the session's
build: tests/conftest.py) in Debian's headless Chromium and follows every
internal link, and is itself shown to fail on a copy of the site with a
broken page link, a broken anchor, a missing image and an error in the
console. The front page's screenshot stays beside the site
(``front-page.png``). The build's own checks: tests/unit/test_docs.py.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_site import build_site
from tests.support.helpers import REPO, skip_unless_ci

pytestmark = pytest.mark.cost(2)

CHECK = REPO / "docs" / "check_site.py"
BROWSER = ("/usr/bin/chromium", "/usr/bin/chromedriver")


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
        'href="run-config.html#fedmr"',
        'href="run-config.html#fedmx"',
    )
    edit("compare.html", "</body>", '<script>console.error("injected by the test")</script></body>')
    (broken / "_images" / "digits-cnn-dir0.1.png").unlink()

    done = _check(broken, tmp_path / "front-page.png")
    assert done.returncode == 1, done.stdout[-6000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "/index.html: broken link to /getting-startd.html (HTTP 404)" in lines
    assert "/methods.html: broken link to /run-config.html#fedmx (no such anchor)" in lines
    assert any(
        line.startswith("/compare.html: browser console:") and "injected by the test" in line
        for line in lines
    )
    assert "/results.html: /_images/digits-cnn-dir0.1.png not served (HTTP 404)" in lines
    # Nothing else is reported: the rest of the copy is the site that passed.
    pages = {line.split(":")[0] for line in lines[:-1]}
    assert pages == {"/index.html", "/methods.html", "/compare.html", "/results.html"}, lines


# a second build: another 15 s of CPU
def test_two_builds_of_one_commit_are_the_same(site, tmp_path):
    """Byte for byte, every file: the site the module's tests check is the site of the commit.

    (A browser check once found, in one build, anchors that another build of
    the same commit had: the builds were the same; the check had read a page
    before the browser had loaded it: tests/unit/test_docs.py.)
    """
    again = build_site(tmp_path)
    ours = sorted(p.relative_to(site) for p in site.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert ours == theirs
    differ = [str(p) for p in ours if (site / p).read_bytes() != (again / p).read_bytes()]
    assert differ == []
