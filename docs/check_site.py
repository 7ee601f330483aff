"""Open every page of the built documentation in headless Chromium and check it.

    python docs/check_site.py docs/_build/html [--screenshot docs/_build/front-page.png]

The built site is served on 127.0.0.1 (a free port) and every HTML page of
it is opened in Debian's Chromium (``/usr/bin/chromium``), driven by Selenium
through Debian's ``/usr/bin/chromedriver``: nothing is downloaded. Every
internal link of every page is followed. The check fails (exit status 1, one
line per problem) on:

- a page or file that an internal link names and the site does not serve;
- a link to ``page#anchor`` where the page, once loaded, has no element with
  that id (or an ``<a name>``);
- a resource a page loads (style sheet, script, image, font) that is not
  served;
- an error in the browser's console: an uncaught exception, a
  ``console.error``, a resource that failed to load;
- a page that does not load within :data:`LOAD_TIMEOUT` seconds.

A page is read once its document is the page's and has loaded
(:func:`page_facts`), whenever ChromeDriver returns from ``get``.

Links to other sites are not followed (the site must read the same offline,
and the check runs where there is no network). A screenshot of the front
page is kept (``--screenshot``, by default ``front-page.png`` beside the
built folder).
"""

import argparse
import http.server
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# A browser with nothing of its own going on: no sandbox (the check may run as
# root), no GPU, no network of its own, a fresh profile (added per run).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)
# What a loaded page tells the check: which document it is and whether it has
# loaded, its element ids, the targets of its links (<a>, and <link> in the
# head: next, previous, style sheets), and the resources it asked for.
PAGE_FACTS = """
return {
  url: location.href,
  state: document.readyState,
  ids: Array.from(document.querySelectorAll("[id]"), e => e.id).concat(
    Array.from(document.querySelectorAll("a[name]"), e => e.name)),
  links: Array.from(document.querySelectorAll("a[href], link[href]"), a => a.href),
  resources: Array.from(performance.getEntriesByType("resource"), r => r.name),
};
"""
#: Seconds a page may take to load, after ``driver.get`` returned, before it is a problem.
LOAD_TIMEOUT = 120.0


@dataclass
class Report:
    """What the check saw, and what is wrong."""

    pages: int = 0
    links: int = 0
    anchors: int = 0
    resources: int = 0
    problems: list[str] = field(default_factory=list)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the site quietly and records every request's status."""

    statuses: dict[str, int]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.statuses[urlsplit(self.path).path] = int(code)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A browser that drops a connection (a cancelled request) is not an error of the site."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serve(root: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """Serve ``root`` on 127.0.0.1; yields the base URL and the requests' statuses by path."""
    statuses: dict[str, int] = {}
    handler = type("Handler", (_Handler,), {"statuses": statuses})

    def make(*args: object) -> _Handler:
        return handler(*args, directory=str(root))

    server = _Server(("127.0.0.1", 0), make)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", statuses
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def chromium() -> Iterator["object"]:
    """A headless Chromium with a fresh profile, driven by Debian's chromedriver."""
    from selenium import webdriver  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory(prefix="fedx-docs-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = webdriver.ChromeService(executable_path=CHROMEDRIVER, port=_free_port())
        driver = webdriver.Chrome(options=options, service=service)
        try:
            yield driver
        finally:
            driver.quit()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(url: str) -> int:
    """The HTTP status the site's server gives ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _page_path(url: str) -> str:
    """The path of a page's URL, a folder's ``index.html`` for a folder."""
    path = urlsplit(url).path
    return path + "index.html" if path.endswith("/") else path


def page_facts(driver: "object", url: str, timeout: float = LOAD_TIMEOUT) -> dict | None:
    """Open ``url`` and return its :data:`PAGE_FACTS` once it has loaded; ``None`` if it never did.

    ChromeDriver's ``get`` waits for the page's load, but on a busy machine
    it was seen to return early: the facts then came from the page before
    (another URL) or from a page still being parsed (``readyState``
    "loading"), and every anchor past that point of it looked broken. So the
    facts count only once they are the URL's and it is complete.
    """
    driver.get(url)  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        facts = driver.execute_script(PAGE_FACTS)  # type: ignore[attr-defined]
        if facts["url"] == url and facts["state"] == "complete":
            return facts
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def check(root: Path, screenshot: Path | None = None) -> Report:
    """Open every page under ``root`` (a built HTML site) and report what is wrong."""
    report = Report()
    with serve(root) as (base, statuses), chromium() as driver:
        origin = urlsplit(base).netloc
        # Every page the build wrote, the front page first; pages only links name come later.
        paths = sorted(
            "/" + p.relative_to(root).as_posix()
            for p in root.rglob("*.html")
            if not p.relative_to(root).parts[0].startswith("_")
        )
        queue = deque(["/index.html", *(p for p in paths if p != "/index.html")])
        queued = set(queue)
        ids: dict[str, set[str]] = {}
        wanted: list[tuple[str, str, str]] = []  # (linking page, page, anchor)
        checked: dict[str, int] = {}

        def target(page: str, url: str) -> None:
            """Note one internal link of ``page`` to ``url``."""
            path = _page_path(url)
            if path not in checked:
                checked[path] = _status(urljoin(base, path))
            report.links += 1
            if checked[path] != 200:
                report.problems.append(f"{page}: broken link to {path} (HTTP {checked[path]})")
                return
            if path.endswith(".html") and path not in queued:
                queue.append(path)
                queued.add(path)
            anchor = unquote(urlsplit(url).fragment)
            if anchor and path.endswith(".html"):
                wanted.append((page, path, anchor))

        while queue:
            page = queue.popleft()
            statuses.clear()
            facts = page_facts(driver, urljoin(base, page))
            report.pages += 1
            if facts is None:
                report.problems.append(f"{page}: did not load in {LOAD_TIMEOUT:g} s")
                continue
            ids[page] = set(facts["ids"])
            for entry in driver.get_log("browser"):
                if entry["level"] == "SEVERE":
                    report.problems.append(f"{page}: browser console: {entry['message']}")
            for path, status in sorted(statuses.items()):
                if status >= 400:
                    report.problems.append(f"{page}: {path} not served (HTTP {status})")
            report.resources += len(facts["resources"])
            for url in facts["links"]:
                parts = urlsplit(url)
                if parts.scheme in ("http", "https") and parts.netloc == origin:
                    target(page, url)
            if page == "/index.html" and screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(screenshot))
        for page, path, anchor in wanted:
            report.anchors += 1
            if anchor not in ids.get(path, set()):
                report.problems.append(f"{page}: broken link to {path}#{anchor} (no such anchor)")
    report.problems = sorted(set(report.problems))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", type=Path, help="the built HTML folder (docs/_build/html)")
    parser.add_argument(
        "--screenshot",
        type=Path,
        help="where the front page's screenshot goes (default: front-page.png beside SITE)",
    )
    args = parser.parse_args(argv)
    site = args.site.resolve()
    if not (site / "index.html").is_file():
        print(f"check_site: {site} has no index.html: build the site first", file=sys.stderr)
        return 2
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists():
            print(f"check_site: {tool} is missing (apt-get install chromium chromium-driver)")
            return 2
    screenshot = args.screenshot or site.parent / "front-page.png"
    report = check(site, screenshot)
    for problem in report.problems:
        print(problem)
    print(
        f"check_site: {report.pages} pages, {report.links} internal links "
        f"({report.anchors} to anchors), {report.resources} resources loaded: "
        f"{len(report.problems)} problem{'' if len(report.problems) == 1 else 's'}; front page: {screenshot}"
    )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
