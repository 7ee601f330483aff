"""ruff (lint and format) over the tree and mypy over fedx/ops, fedx/strategies and fedx/strategy_core, as configured in pyproject.toml."""

import subprocess

from tests.helpers import REPO, skip_unless_installed


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
