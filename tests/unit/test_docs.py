"""The documentation site: built by Sphinx without a warning, and what its pages hold.

One build for the session (Sphinx's ``-W``: a broken reference, a link to a
missing page or heading, a docstring that does not parse fails it; the
``site`` fixture of tests/conftest.py), into a temporary folder; the
run-config page is checked against the method registry it is generated
from. The site in a real browser, and a second build of the commit:
tests/system/test_docs.py.
"""

import contextlib
import doctest
import html
import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from fedx.config import APP_KEYS
from fedx.reference import _toml  # pylint: disable=protected-access
from fedx.registry import ENTRY_POINT_GROUP, builtin_methods
from tests.support.doc_commands import _fences, doc_pages
from tests.support.helpers import REPO

pytestmark = pytest.mark.cost(1)

CHECK = REPO / "docs" / "check_site.py"
#: The pages written for people who write code against fedx: every fedx name
#: their prose gives is something to import, and the API reference documents it.
CODE_PAGES = ("README.md", "docs/own-project.md", "docs/own-method.md",
              "docs/secure-recombination.md", "docs/tutorial.md")  # fmt: skip


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


def _resolve(name: str) -> Any:
    """The module or object a dotted ``fedx....`` name stands for (``None``: none)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
        return found
    return None


def imported_names() -> dict[str, str]:
    """What the pages tell users to import, by dotted name: where each is told.

    Every ``import``/``from ... import`` of fedx in a page's Python blocks
    and code spans, and every ``fedx.`` name in the code spans of
    :data:`CODE_PAGES` (``fedx.simulation.install()`` is an instruction to
    import it).
    """
    names: dict[str, str] = {}
    for page in doc_pages():
        relative = page.relative_to(REPO).as_posix()
        text = page.read_text()
        code = [c for _, _, language, c in _fences(text) if language == "python"]
        code += re.findall(r"`((?:from|import) fedx[^`]*)`", text)
        for snippet in code:
            for match in re.finditer(r"^\s*from (fedx[\w.]*) import \(?([\w, ]+)", snippet, re.M):
                names.setdefault(match.group(1), relative)
                for name in match.group(2).replace(" ", "").split(","):
                    if name:
                        names.setdefault(f"{match.group(1)}.{name}", relative)
            for match in re.finditer(r"^\s*import (fedx[\w.]*)", snippet, re.M):
                names.setdefault(match.group(1), relative)
        if relative in CODE_PAGES:
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text):
                if span.startswith(("python -m", "pip ")):
                    continue  # a tool, not an import
                for match in re.finditer(r"\b(fedx(?:\.\w+)+)", span):
                    if match.group(1) != ENTRY_POINT_GROUP:
                        names.setdefault(match.group(1), relative)
    return names


def _documented(site: Path) -> tuple[set[str], list[Any], str]:
    """The modules the API pages document, the objects they document, and their HTML."""
    text = "".join(page.read_text() for page in (site / "api").glob("*.html"))
    modules, objects = set(), []
    for anchor in re.findall(r'id="([\w.-]+)"', text):
        if anchor.startswith("module-fedx"):
            modules.add(anchor.removeprefix("module-"))
        elif anchor.startswith("fedx."):
            objects.append(_resolve(anchor))
    return modules, objects, text


def test_the_api_reference_covers_what_the_pages_tell_users_to_import(site):
    names = imported_names()
    assert {"fedx.secure.client", "fedx.protocol.fedme", "fedx.strategies.FedMR"} <= set(names)
    modules, objects, text = _documented(site)
    missing = []
    for name, page in sorted(names.items()):
        found = _resolve(name)
        assert found is not None, f"{page}: {name} is no module or object of fedx"
        if isinstance(found, ModuleType):
            covered = found.__name__ in modules
        elif isinstance(found, (str, int, float, bool, tuple)):  # a constant: by its name
            covered = f'id="{name}"' in text
        else:  # wherever it is documented: fedx.ops.Model is fedx.ops.model.Model
            covered = any(found is documented for documented in objects)
        if not covered:
            missing.append(f"{page}: {name}")
    assert not missing, "not in the API reference:\n" + "\n".join(missing)


def _section(page: str, anchor: str) -> str:
    """The HTML of one documented object: from its anchor to the next object of the page."""
    start = page.index(f'id="{anchor}"')
    following = re.search(r'<dl class="py (class|function|exception)', page[start + 1 :])
    return page[start : start + 1 + following.start()] if following else page[start:]


STRATEGIES = ("FedMR", "FedIndep", "FedMut", "FedCross", "FedMe", "FedAvgFT")


def test_the_strategy_pages_list_each_parameter_once(site):
    page = (site / "api" / "strategies.html").read_text()
    for name in STRATEGIES:
        section = _section(page, f"fedx.strategies.{name}")
        constructor_at = section.find(f'id="fedx.strategies.{name}.__init__"')
        if constructor_at >= 0:
            # The constructor shows its signature, not a second, undescribed list of parameters.
            constructor = section[constructor_at:]
            assert "Parameters" not in constructor[: constructor.index("</dl>")], name
            section = section[:constructor_at]
        fields = re.findall(r"<strong>([*\w]+)</strong>", section)
        assert len(fields) == len(set(fields)), (name, fields)
        # Documented once, by the class that introduces it: FedIndep's arguments are
        # MultiModelStrategy's, FedAvgFT's PerClientEvaluation's and FedAvg's.
        assert fields or name in ("FedIndep", "FedAvgFT"), name
    fedmr = html.unescape(re.sub(r"<[^>]+>", "", _section(page, "fedx.strategies.FedMR")))
    low = re.search(
        r"secure_min_layers \(int \(default: 2\)\) – (.*?)secure_max_layers", fedmr, re.S
    )
    high = re.search(r"secure_max_layers \(int \(default: 4\)\) – (.*?)Examples", fedmr, re.S)
    assert low and high and low.group(1).strip() != high.group(1).strip()


@pytest.mark.parametrize("name", STRATEGIES)
def test_each_strategy_class_has_an_example_that_runs(name):
    import fedx.strategies  # pylint: disable=import-outside-toplevel

    (test,) = doctest.DocTestFinder(recurse=False).find(
        getattr(fedx.strategies, name), name, globs={}
    )
    assert len(test.examples) >= 2, f"{name}'s docstring has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    output: list[str] = []
    result = runner.run(test, out=output.append)
    assert result.failed == 0, "".join(output)


def _load_check_site() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_site", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EarlyBrowser:
    """A browser whose ``get`` returns before the page has loaded, as ChromeDriver's did on a busy
    machine: the first look at each page sees the page before it, the second the page half
    parsed; only then the page. Facts are read from the served files (ids and links)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = self.previous = "data:,"
        self.looks = 0

    def get(self, url: str) -> None:
        self.previous, self.url, self.looks = self.url, url, 0

    def facts(self, url: str, fraction: float = 1.0, state: str = "complete") -> dict:
        path = urlsplit(url).path
        file = self.root / path.lstrip("/")
        text = file.read_text() if url.startswith("http") and file.is_file() else ""
        text = text[: int(len(text) * fraction)]
        return {
            "url": url,
            "state": state,
            "ids": re.findall(r'\bid="([^"]+)"', text),
            "links": [
                urljoin(url, html.unescape(href))
                for href in re.findall(r'<(?:a|link)\b[^>]*\bhref="([^"]*)"', text)
            ],
            "resources": [],
        }

    def execute_script(self, script: str) -> dict:
        self.looks += 1
        if self.looks == 1:
            return self.facts(self.previous)
        if self.looks == 2:
            return self.facts(self.url, 0.5, "interactive")
        return self.facts(self.url)

    def get_log(self, kind: str) -> list:
        return []

    def save_screenshot(self, path: str) -> None:
        Path(path).write_bytes(b"")


def test_the_check_reads_each_page_once_it_has_loaded(site, monkeypatch, tmp_path):
    check_site = _load_check_site()

    @contextlib.contextmanager
    def early_browser():
        yield EarlyBrowser(site)

    monkeypatch.setattr(check_site, "chromium", early_browser)
    report = check_site.check(site, tmp_path / "front-page.png")
    assert report.problems == []
    assert report.pages > 10 and report.anchors > 100
