"""Every command of README.md and docs/ runs as typed: checked against the code, page by page.

What is checked, and how, is in ``tests/support/doc_commands.py``. One test per
page, found when the suite is collected, so a page added later is checked
too; a failure lists each bad command with its page and line and what is
wrong. The checker is itself shown to fail on a copy of the README with a
flag that does not exist, a file that does not exist and a run with fewer
SuperNodes than its config waits for.
"""

from collections import Counter

import pytest

from tests.support.doc_commands import (
    Checker,
    HelpTexts,
    check_page,
    doc_pages,
    help_keys,
    page_commands,
)
from tests.support.helpers import REPO

pytestmark = pytest.mark.cost(1)

PAGES = doc_pages()


@pytest.fixture(scope="module")
def commands():
    """Every page's commands, by page (relative path)."""
    return {page.relative_to(REPO).as_posix(): page_commands(page) for page in PAGES}


@pytest.fixture(scope="module")
def checker(commands):
    """One checker, with every --help the pages need fetched at once (a few at a time)."""
    helps = HelpTexts()
    helps.prepare(help_keys(c for page in commands.values() for c in page))
    return Checker(helps)


@pytest.fixture(scope="module")
def problems(commands, checker):
    """Every page's problems, by page: each page is checked once for the module."""
    return {page: check_page(page_commands, checker) for page, page_commands in commands.items()}


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_command_of_the_page_is_right(page, problems):
    found = problems[page]
    assert not found, f"{len(found)} command(s) of {page} are wrong:\n" + "\n".join(found)


def test_every_kind_of_command_is_found_and_checked(commands, checker, problems):
    everything = [c for page in commands.values() for c in page]
    tools = Counter(c.tool for c in everything)
    checks = Counter(kind for c in everything for kind in set(c.checks))
    summary = (
        f"{len(commands)} pages, {len(everything)} commands "
        f"({sum(not c.inline for c in everything)} in shell blocks, "
        f"{sum(c.inline for c in everything)} inline); tools {dict(tools.most_common())}; "
        f"checks {dict(checks.most_common())}; {checker.helps.started} --help processes run"
    )
    print(summary)
    assert len(commands) >= 25 and len(everything) >= 100, summary
    assert {"flwr", "fedx-deploy", "fedx-compare", "pytest", "sphinx-build", "pip"} <= set(tools)
    expected = {"flwr's parser", "fedx-deploy's parser", "fedx-compare's parser", "--help"}
    assert expected | {"files", "run config", "SuperNodes", "compose service"} <= set(checks)
    # Every command of a fedx or Flower tool went through a parser or a --help.
    for command in everything:
        if command.tool.startswith(("fedx-", "flower-")) or command.tool == "flwr":
            assert command.checks, command.where()


BROKEN = {
    # A flag that does not exist.
    "flwr run . --stream --run-config 'strategy=": "flwr run . --streem --run-config 'strategy=",
    # A file that does not exist.
    "configs/digits-cnn-iid.toml": "configs/digits-cnn-iidd.toml",
    # A config that waits for 100 SuperNodes, run on 10.
    '"num-supernodes=100 client-resources-num-gpus': '"num-supernodes=10 client-resources-num-gpus',
    # An extra fedx does not have.
    'pip install -e ".[dev]"': 'pip install -e ".[devel]"',
}


def test_the_check_fails_on_a_page_with_broken_commands(tmp_path, checker):
    text = (REPO / "README.md").read_text()
    for old, new in BROKEN.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    copy = tmp_path / "README.md"
    copy.write_text(text)
    problems = check_page(page_commands(copy, root=tmp_path), checker)
    report = "\n".join(problems)
    assert "flwr run: No such option '--streem'" in report, report
    assert "configs/digits-cnn-iidd.toml does not exist" in report, report
    assert (
        "the run waits for min-available-nodes=100 SuperNodes, the federation has 10" in report
    ), report
    assert "fedx has no extra 'devel'" in report, report
    # Each problem names the page and the line of its command; nothing else is wrong.
    assert all(problem.startswith("README.md:") for problem in problems), report
    assert len({problem.split("\n")[0] for problem in problems}) == len(BROKEN), report
