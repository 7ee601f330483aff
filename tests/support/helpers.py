"""What several test modules share (fixtures are in conftest.py): the app's defaults, models, runs."""

import ast
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

from fedx.ops import Model

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: ``[tool.flwr.app.config]`` of the app's pyproject.toml: what Flower gives the apps.
DEFAULTS: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"][
    "app"
]["config"]
# The tests that go through `flwr run` share one simulation SuperLink and one
# plain FedMR run: each Flower simulation costs a Ray start-up.
PLAIN_FEDMR = {"rounds": 3, "seed": 3}


def in_ci() -> bool:
    """Whether the suite runs in CI (``CI=true``), where .ci/run has installed the system tools."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_unless_ci(reason: str) -> NoReturn:
    """Skip the test for a system tool this machine lacks, naming what is missing.

    Under CI that is a failure: .ci/run installs podman, runc, debootstrap,
    iproute2 and chromium, so a missing one there is a broken CI script, not
    a machine that cannot run the test.
    """
    if in_ci():
        pytest.fail(f"{reason} (CI=true: .ci/run should have installed it)", pytrace=False)
    pytest.skip(reason)


def skip_unless_installed(tool: str, hint: str = "pip install -e '.[dev]'") -> Path:
    """``tool`` next to this interpreter (its ``bin`` folder); skip (under CI: fail) where it is not.

    The GPU machine's image has no development tools (ruff, mypy): there the
    tests that run them skip with one line that names the tool.
    """
    path = BIN / tool
    if not path.exists():
        skip_unless_ci(f"{tool} is not installed next to {sys.executable} ({hint})")
    return path


def skip_unless_importable(module: str, hint: str = "pip install -e '.[dev]'") -> None:
    """Skip (under CI: fail) where this interpreter cannot import ``module`` (Sphinx, ...)."""
    if importlib.util.find_spec(module) is None:
        skip_unless_ci(f"{module} is not importable by {sys.executable} ({hint})")


def skip_unless_package_index(package: str = "flwr") -> None:
    """Skip (under CI: fail) where pip reaches no package index that lists ``package``.

    Asks pip's own configuration (``pip index versions``, no retries), so the
    test names no index of its own.
    """
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package, "--retries", "0",
         "--timeout", "15", "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0 or "Available versions" not in done.stdout:
        skip_unless_ci(f"no package index reachable (pip index versions {package} failed)")


def _pip_index_options() -> list[str]:
    """pip's configured package sources as uv options: the same indexes, links and constraints.

    uv does not read pip's configuration files or ``PIP_*`` variables;
    ``pip config list`` shows both (``:env:`` keys for the variables, which win in pip).
    """
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    settings: dict[str, str] = {}
    for line in sorted(listed.splitlines(), key=lambda line: line.startswith(":env:")):
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    options = []
    for key, flag in (
        ("index-url", "--default-index"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("constraint", "--constraints"),
    ):
        for value in settings.get(key, "").split():
            options += [flag, value]
    # pip takes the best version from all its sources; uv's default stops at the first index.
    return [*options, "--index-strategy", "unsafe-best-match"]


def uv_pip_install(python: Path, *requirements: str, timeout: float, env: dict[str, str]) -> None:
    """``uv pip install`` of ``requirements`` into the environment of ``python``, from pip's sources.

    For an environment a test prepares, not the install it checks: uv
    unpacks each wheel once into its cache and hardlinks it from there, where
    pip unzips torch's and CUDA's gigabytes into every fresh environment. It
    byte-compiles, as pip does (on all cores): without that, a Ray node
    started in the environment compiles its modules in every process at once
    and can time out starting on a busy machine.
    """
    done = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--compile-bytecode",
         "--python", str(python), *_pip_index_options(), *requirements],
        capture_output=True, text=True, timeout=timeout, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, f"uv pip install {requirements}: {done.stderr[-3000:]}"


def environment_with_path(*folders: Path) -> dict[str, str]:
    """This process's environment with ``folders`` first on ``PYTHONPATH``, the rest kept.

    Where fedx and Flower are not installed but on ``PYTHONPATH`` (the GPU
    machine's wheels under ``--target``), a child process needs that too.
    """
    kept = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, folders), *kept])}


def run_python(code: str, *folders: Path) -> str:
    """What ``code`` prints in a fresh interpreter with ``folders`` first on its import path.

    A fresh interpreter, because what these checks are about (entry points
    read once per process, the modules an import loads) this one has already
    settled. The test fails with the end of the child's stderr when it exits
    non-zero.
    """
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=environment_with_path(*folders),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def copy_app(folder: Path) -> Path:
    """The fedx app, as `flwr run` needs it (pyproject.toml and the fedx package), in ``folder``.

    `flwr run <app>` reads every file under the app's folder before it packs
    the app: in a checkout with its virtual environment inside (``.venv``,
    as the README's Quickstart makes it) that is some 60,000 files and about
    5 s per run. The tests' runs use this copy instead.
    """
    shutil.copy2(REPO / "pyproject.toml", folder / "pyproject.toml")
    shutil.copytree(REPO / "fedx", folder / "fedx", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_config(overrides: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """The app's defaults with ``overrides`` (kebab-case keys) and ``more`` (keys without dashes)."""
    return {**DEFAULTS, **(overrides or {}), **more}


def make_model(rng: np.random.Generator, scale: float = 1.0) -> Model:
    """A small CNN-shaped state dict: conv, BatchNorm (with an int counter), linear."""
    return {
        "conv1.weight": (scale * rng.normal(size=(4, 1, 3, 3))).astype(np.float32),
        "conv1.bias": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.weight": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.bias": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.running_mean": (scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.running_var": np.abs(scale * rng.normal(size=(4,))).astype(np.float32),
        "bn1.num_batches_tracked": np.array(int(rng.integers(0, 100)), dtype=np.int64),
        "fc1.weight": (scale * rng.normal(size=(8, 16))).astype(np.float32),
        "fc1.bias": (scale * rng.normal(size=(8,))).astype(np.float32),
        "fc2.weight": (scale * rng.normal(size=(3, 8))).astype(np.float32),
        "fc2.bias": (scale * rng.normal(size=(3,))).astype(np.float32),
    }


def metrics_rows(directory: Path) -> dict[int, dict[str, Any]]:
    """The rows of a run's ``metrics.json``, by round."""
    metrics = json.loads((directory / "metrics.json").read_text())
    return {row["round"]: row for row in metrics["rounds"]}


def flwr_run_command(
    app: Path, run_config_text: str, *options: str, bin_dir: Path = BIN
) -> list[str]:
    """``flwr run <app> <options> --stream --run-config <run_config_text>``, ``flwr`` of ``bin_dir``."""
    flwr = str(bin_dir / "flwr")
    return [flwr, "run", str(app), *options, "--stream", "--run-config", run_config_text]


def flwr_run(
    env: dict[str, str],
    app: Path,
    run_config_text: str,
    *options: str,
    timeout: float = 300,
    bin_dir: Path = BIN,
) -> str:
    """``flwr run <app> <options> --stream --run-config ...`` to the end; everything it printed.

    ``env`` points ``flwr`` (of ``bin_dir``) at a SuperLink (``FLWR_HOME``);
    ``options`` are a connection name or ``--federation-config ...``.
    """
    done = subprocess.run(
        flwr_run_command(app, run_config_text, *options, bin_dir=bin_dir),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.stdout + done.stderr


class OneMessageGrid:
    """What ``fedx.messaging.send_and_collect`` uses of a Grid, for one message (:class:`PushedMessage`).

    Its push is accepted; each pull returns ``replies``: by default none, so
    the exchange pulls until its timeout.
    """

    def __init__(self, replies: list[Any] | None = None) -> None:
        self.replies = replies or []

    def push_messages(self, messages: Any) -> list[str]:
        return ["id-1"]

    def pull_messages(self, message_ids: Any) -> list[Any]:
        return self.replies


class PushedMessage:
    """What ``send_and_collect`` reads of a message it pushes: its id and destination node."""

    class metadata:  # pylint: disable=invalid-name
        message_id, dst_node_id = "id-1", 7


def undocumented_fields(metrics: dict[str, Any]) -> list[str]:
    """The fields of a run's ``metrics.json`` that docs/outputs.md's tables do not list.

    A table's first column names fields as code spans (several per cell,
    ``initial-<architecture>`` for a family); a row's ``clients`` object is
    one field.
    """
    page = (REPO / "docs" / "outputs.md").read_text()
    names = set()
    for line in page.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    patterns = [re.compile("^" + re.escape(n).replace("<architecture>", ".+") + "$") for n in names]

    def documented(field: str) -> bool:
        return any(pattern.match(field) for pattern in patterns)

    fields = set(metrics) | set(metrics["timings"]) | {f for row in metrics["rounds"] for f in row}
    return sorted(field for field in fields if not documented(field))


def install_example(example: Path, folder: Path) -> Path:
    """``example`` (a package under ``examples/``) installed by pip, entry points included,
    into ``folder/site`` (from a copy in ``folder/source``): no change to the environment.

    A process with the returned folder on its ``PYTHONPATH`` sees the
    package and its entry points, as if it were installed.
    """
    source = folder / "source" / example.name
    shutil.copytree(example, source, ignore=shutil.ignore_patterns("__pycache__"))
    target = folder / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


def modules_imported_by(
    modules: Sequence[str], prefix: str, already: Sequence[str] = ()
) -> list[str]:
    """The modules starting with ``prefix`` that importing ``modules`` loads, in a fresh
    interpreter that has imported ``already`` first (what those load does not count)."""
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in already)
        + "before = set(sys.modules)\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(sorted(m for m in set(sys.modules) - before if m.startswith({prefix!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return ast.literal_eval(done.stdout.strip())


@functools.cache
def help_flags(executable: str) -> frozenset[str]:
    """The ``--flags`` an installed Flower executable documents in ``--help``."""
    done = subprocess.run(
        [str(BIN / executable), "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout))


def flags(command: list[str]) -> list[str]:
    """The ``--flags`` a command line passes (a value after ``=`` left out)."""
    return [part.split("=", 1)[0] for part in command if part.startswith("--")]
