"""Change: a warm ClientApp task finds its installed FAB without unpacking it again.

What it changes
    In the process of a ClientApp task that fedx's warm executor forks
    (:mod:`fedx.deploy.warm_executor`), the module global ``install_from_fab``
    of ``flwr.supernode.runtime.run_clientapp`` is replaced by
    :func:`install_fab_once` (:func:`apply`, through
    :func:`fedx.flower.install`), and Flower's ``run_clientapp`` is called
    as the ``flwr-clientapp`` command calls it (:func:`run_clientapp_task`).
    Other processes, Flower's own ``flwr-clientapp`` included, keep Flower's
    function.

Why
    Flower's ``install_from_fab`` (``flwr.cli.install``) unpacks the FAB
    into a temporary folder and hashes every file before it finds the app
    installed and returns its path, in every task, and slower still when
    several tasks start at once on a few cores. :func:`install_fab_once`
    computes the path Flower installs a FAB to (``FLWR_HOME/apps/<publisher>.<name>.
    <version>.<hash prefix>``, from the FAB's ``pyproject.toml`` and its
    SHA-256) and returns it when that folder is there, which costs only a
    hash of the FAB (``benchmarks/message_timeline.py``'s "FAB install" step;
    docs/results-record.md, "Run 4: where a warm message's seconds went, and
    the fixed costs cut").

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    Flower installs a FAB only through ``install_from_fab``, with no setting
    to skip the unpacking of one it has installed.

Under another Flower
    Where this code is not the code checked, :func:`fedx.flower.install`
    makes none of the task's changes, with one warning in the task's log:
    Flower's ``install_from_fab`` unpacks every task's FAB, as always. A FAB
    not found where :func:`installed_fab_path` looks (Flower installs
    elsewhere, or not yet) goes through Flower's function too.
    ``fedx-superexec`` itself starts only on a Flower whose SuperExec it can
    change (:mod:`fedx.flower.superexec_executor`).
"""

import hashlib
import importlib
import io
import tomllib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from fedx.flower import replace
from fedx.flower._fingerprints import flower_code

if TYPE_CHECKING:
    from flwr.supercore.superexec.executor import ExecutionSpec

#: What a task's process runs besides the app: this module, Flower's
#: ``run_clientapp``, and ``httpcore``, which httpx imports (with trio, where it
#: is installed) only when ``run_clientapp`` builds its first client: imports
#: in every task, before its first request, when not imported ahead (the warm
#: interpreter imports them all ahead).
TASK_MODULES = (__name__, "flwr.supernode.runtime.run_clientapp", "httpcore")
#: Flower's ClientApp task, whose ``install_from_fab`` this replaces.
RUN_CLIENTAPP = "flwr.supernode.runtime.run_clientapp"

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supernode.runtime.run_clientapp:run_clientapp",
    "flwr.supernode.cli.flwr_clientapp:flwr_clientapp",
    "flwr.cli.install:install_from_fab",
    "flwr.cli.install:validate_and_install",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_clientapp still installs the task's FAB through the module global "
    "install_from_fab(fab_content, skip_prompt=True) and takes the arguments flwr-clientapp "
    "passes, and that install_from_fab installs to FLWR_HOME/apps/<publisher>.<name>."
    "<version>.<FAB_HASH_TRUNCATION hex digits of the FAB's SHA-256> and returns that path"
)


def installed_fab_path(fab: bytes) -> Path | None:
    """Where Flower installed this FAB, if it did; ``None`` when it is not installed.

    The path is ``install_from_fab``'s own, ``FLWR_HOME/apps/<publisher>.<name>.
    <version>.<hash prefix>``, from the FAB's ``pyproject.toml`` and its SHA-256.
    """
    # pylint: disable=import-outside-toplevel
    from flwr.common.config import get_metadata_from_config
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            config = tomllib.loads(archive.read("pyproject.toml").decode())
        fab_id, version = get_metadata_from_config(config)
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # Flower's install_from_fab says what is wrong with it
    publisher, project = fab_id.split("/")
    digest = hashlib.sha256(fab).hexdigest()[:FAB_HASH_TRUNCATION]
    path = get_flwr_home() / APP_DIR / f"{publisher}.{project}.{version}.{digest}"
    return path if path.is_dir() else None


def installed_fab_dir(fab_hash: str) -> Path | None:
    """Where Flower installed the FAB whose SHA-256 (hex) is ``fab_hash``; ``None`` when it has not.

    Flower's folder for it ends in the hash's first ``FAB_HASH_TRUNCATION``
    hex digits (:func:`installed_fab_path`); one folder only, or ``None``.
    """
    # pylint: disable=import-outside-toplevel
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    apps = get_flwr_home() / APP_DIR
    if not fab_hash or not apps.is_dir():
        return None
    found = [path for path in apps.glob(f"*.{fab_hash[:FAB_HASH_TRUNCATION]}") if path.is_dir()]
    return found[0] if len(found) == 1 else None


def install_fab_once(fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt=False):
    """Flower's ``install_from_fab``, without unpacking a FAB that is installed already.

    It returns the path Flower's returns; a FAB not installed yet goes
    through Flower's function.
    """
    # pylint: disable=import-outside-toplevel
    from flwr.cli.install import install_from_fab

    if isinstance(fab_file, bytes) and install_dir is None and skip_prompt:
        if (installed := installed_fab_path(fab_file)) is not None:
            return installed
    return install_from_fab(fab_file, install_dir, skip_prompt)


def apply():
    """In this task's process, make Flower's ``run_clientapp`` install FABs with :func:`install_fab_once`.

    Made by :func:`fedx.flower.install`; returns what undoes it.
    """
    return replace(importlib.import_module(RUN_CLIENTAPP), "install_from_fab", install_fab_once)


def run_clientapp_task(spec: "ExecutionSpec") -> None:
    """Flower's ``run_clientapp`` for one task, as ``flwr-clientapp`` calls it."""
    # pylint: disable=import-outside-toplevel
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime import run_clientapp as flower_task

    flower_task.run_clientapp(
        runtime_api_address=spec.runtime_api_address,
        token=spec.token,
        insecure=spec.insecure,
        certificates=validate_and_resolve_root_certificates(
            spec.root_certificates_path, spec.insecure
        ),
        parent_pid=spec.parent_pid,
        runtime_dependency_install=False,
    )
