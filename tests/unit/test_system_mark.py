"""The tiers: which commands start a system, an unmarked test that starts one errors
(tests/support/system_mark.py); the folders give the mark and the order (tests/support/tiers.py)."""

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.helpers import REPO
from tests.support.system_mark import system_start
from tests.support.tiers import in_system_tier, schedule


@pytest.mark.parametrize(
    "command",
    [
        ["/venv/bin/flower-superlink", "--insecure", "--simulation"],
        ["fedx-supernode", "--poll-interval", "0.1"],
        ["/venv/bin/flwr", "run", ".", "--stream"],
        ["flwr", "stop", "3"],
        ["fedx-deploy", "up", "--insecure", "--run", "."],
        ["fedx-compare", "grid.toml"],
        ["/usr/lib/ray/core/src/ray/gcs/gcs_server", "--gcs_server_port=0"],  # ray.init
        ["ray", "start", "--head"],
        "podman ps -a",
        ["podman-compose", "-p", "x", "up", "-d"],
        ["ip", "netns", "exec", "fx1", "sleep", "1"],
        ["tc", "qdisc", "add"],
        ["/usr/bin/python3", "docs/check_site.py", "_build/html"],
        ["/venv/bin/python", "-m", "pip", "install", "flwr==1.36.*"],
        ["/venv/bin/python3.11", "-m", "fedx.compare.cli", "grid.toml"],
        ["uv", "sync"],
    ],
)
def test_commands_that_start_a_system(command):
    assert system_start(command) is not None


@pytest.mark.parametrize(
    "command",
    [
        ["/venv/bin/flower-superlink", "--help"],  # what test_deploy_static reads of Flower
        ["fedx-superlink", "--version"],
        [
            sys.executable,
            "docs/check_site.py",
            "--help",
        ],  # what tests/support/doc_commands.py reads
        ["flwr", "new", "app"],
        ["fedx-deploy", "certs", "--out", "certificates"],
        [sys.executable, "-c", "import torch"],
        [sys.executable, "-m", "tests.support.cold_start", "{}"],
        [sys.executable, "-m", "sphinx", "-W", "docs", "_build"],
        # A local folder installed by pip: no package index.
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "examples/x"],
        "ruff check .",
        [],
    ],
)
def test_commands_that_do_not(command):
    assert system_start(command) is None


def test_an_unmarked_test_that_starts_a_system_errors_and_a_marked_one_passes(tmp_path):
    """A stand-in ``podman`` (a script that only exits) started by two tests, one of them marked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text("#!/bin/sh\nexit 0\n")
    podman.chmod(0o755)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "from tests.support.system_mark import pytest_runtest_setup, pytest_runtest_teardown  # noqa\n"
    )
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    system: starts a system\n")
    (suite / "test_it.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess
            import pytest

            @pytest.fixture(scope="module")
            def engine():
                subprocess.run([{str(podman)!r}, "info"], check=True)

            def test_unmarked(engine):
                pass

            @pytest.mark.system
            def test_marked():
                subprocess.run([{str(podman)!r}, "ps"], check=True)

            def test_unmarked_without_a_system():
                subprocess.run(["true"], check=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(suite)],
        cwd=suite,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    # The unmarked test's teardown errors, naming the command its fixture ran.
    assert "3 passed, 1 error" in output, output
    assert "ERROR at teardown of test_unmarked" in output, output
    assert (
        f"test_it.py::test_unmarked started a system but is not marked `system`:\n  {podman} info"
        in (output)
    )
    assert "PASSED test_it.py::test_marked" in output
    assert "PASSED test_it.py::test_unmarked_without_a_system" in output


# ----------------------------------------------------------------------
# The tiers as folders (tests/support/tiers.py)
# ----------------------------------------------------------------------

TESTS = REPO / "tests"


class Collected:
    """What :func:`schedule` reads of a collected test: its module's path and its cost mark."""

    def __init__(self, path: Path, cost: float | None = None) -> None:
        self.path = path
        self.cost = cost

    def get_closest_marker(self, name: str):
        if name == "cost" and self.cost is not None:
            return pytest.mark.cost(self.cost).mark
        return None


def test_a_module_is_a_system_test_exactly_when_it_lies_under_tests_system():
    assert in_system_tier(TESTS / "system" / "test_deployment.py")
    assert not in_system_tier(TESTS / "unit" / "test_ops_average.py")
    assert not in_system_tier(TESTS / "support" / "deployment.py")
    assert not in_system_tier(TESTS / "systems" / "test_x.py")  # a folder, not a prefix


def test_modules_start_costliest_first_then_system_before_unit_each_kept_whole():
    unit_a, unit_b = TESTS / "unit" / "test_a.py", TESTS / "unit" / "test_b.py"
    system_c, system_d = TESTS / "system" / "test_c.py", TESTS / "system" / "test_d.py"
    items = [
        Collected(unit_a),
        Collected(unit_a),
        Collected(system_c),
        Collected(unit_b, cost=2),
        Collected(unit_b, cost=2),
        Collected(system_d, cost=6),
    ]
    first_of_a = items[0]
    schedule(items)
    assert [item.path for item in items] == [system_d, unit_b, unit_b, system_c, unit_a, unit_a]
    assert items[4] is first_of_a  # a module's tests keep their order


def test_the_system_mark_is_the_folders_alone():
    """No test outside tests/system marks itself, nor does one inside: the folder says it."""
    marked = [
        path.relative_to(REPO).as_posix()
        for path in sorted(TESTS.rglob("*.py"))
        if re.search(r"pytest\.mark\.system\b", path.read_text())
        and path.parts[-2:] != ("unit", "test_system_mark.py")
        and path.parts[-2:] != ("support", "tiers.py")
    ]
    assert marked == []


def test_test_modules_live_in_a_tier_and_import_no_other_test_module():
    strays = [
        path.relative_to(REPO).as_posix()
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.parent not in (TESTS / "unit", TESTS / "system")
    ]
    assert strays == []
    imports = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if re.match(r"tests\.(unit|system)\.", name):
                    imports.append(f"{path.relative_to(REPO).as_posix()}: {name}")
    assert imports == []
