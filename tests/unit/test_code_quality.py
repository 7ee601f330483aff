"""ruff (lint and format) over the tree and mypy over fedx/ops, fedx/strategies and fedx/strategy_core, as configured in pyproject.toml."""

import ast
import subprocess

from tests.support.helpers import REPO, skip_unless_installed


def run(*command: str) -> subprocess.CompletedProcess:
    """Run a development tool; skip where it is not installed (the GPU machine), fail under CI."""
    return subprocess.run(
        [str(skip_unless_installed(command[0])), *command[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ruff_finds_nothing():
    done = run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_tree_is_formatted():
    done = run("ruff", "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing():
    done = run("mypy")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


#: The longest a module of fedx/ may be, and a class's docstring (issue 43, item 4):
#: a longer module does more than one job; a longer docstring belongs on a docs page.
MAX_FILE_LINES = 500
MAX_CLASS_DOCSTRING_LINES = 60


def test_no_module_of_fedx_is_over_500_lines():
    long = {
        path.relative_to(REPO).as_posix(): lines
        for path in sorted((REPO / "fedx").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}, "split these modules by job"


def test_no_class_docstring_of_fedx_is_over_60_lines():
    long = {}
    for path in sorted((REPO / "fedx").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            docstring = isinstance(node, ast.ClassDef) and ast.get_docstring(node, clean=False)
            if docstring and len(docstring.splitlines()) > MAX_CLASS_DOCSTRING_LINES:
                long[f"{path.relative_to(REPO).as_posix()}: {node.name}"] = len(
                    docstring.splitlines()
                )
    assert long == {}, "move the rest of these docstrings to docs/"
