"""The tiers' check (tests/support/system_mark.py): which commands start a system, and an unmarked test that
starts one errors."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.helpers import REPO
from tests.support.system_mark import system_start


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
