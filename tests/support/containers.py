"""Helpers of the container tests: fedx's compose files run by podman-compose on this machine's podman.

A :class:`ComposeProject` is a copy of the repository's deployment files in a
folder of its own (its ``certificates/``, ``outputs/``, ``state/``), run
under a project name of its own, so tests never touch the checkout's folders
nor another project's containers. The images are shared: they are built once
from the checkout and rebuilt only when a file they are built from changes
(:func:`ensure_images`; the key lives outside the clone, next to podman's
own layer cache).
"""

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedx.deploy.local import free_port
from tests.support.helpers import in_ci, skip_unless_ci

REPO = Path(__file__).resolve().parents[2]
# What the images are built from (docker/Dockerfile, its COPY lines, the build context rules).
BUILD_INPUTS = [
    "docker/Dockerfile",
    "docker/entrypoint.py",
    "fedx",
    "pyproject.toml",
    "LICENSE",
    ".dockerignore",
]
# What a project folder needs: the build inputs, the compose files, the test app.
PROJECT_FILES = [
    *BUILD_INPUTS,
    "docker/flwr-config.toml",
    "docker-compose.yml",
    "docker-compose.auth.yml",
    "docker-compose.insecure.yml",
    "docker-compose.gpu.yml",
    "tests/wire_app",
]
LOCAL_BASE = "localhost/fedx-base:bookworm"
SUPERNODES = ["supernode-1", "supernode-2", "supernode-3"]
#: The hosts the certificates name: the SuperLink's and the SuperNodes' services.
HOSTS = ["superlink", *SUPERNODES]
APP_UID = 49999  # Flower's user "app" in every image
#: Seconds a container has to stop on SIGTERM: compose's default stop_grace_period.
STOP_GRACE = 10
#: The exit code of a container killed after its grace period (128 + SIGKILL).
KILLED = 137
NODE_ID = re.compile(r"SuperNode ID: (\d+)")
STAMP = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "fedx"
    / "container-images.json"
)


def _run(
    command: list[str], timeout: float, check: bool, **popen: Any
) -> subprocess.CompletedProcess:
    """``command``'s outcome, its output captured; with ``check``, a failure is an AssertionError."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **popen
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} failed ({done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def podman_compose() -> list[str]:
    """The podman-compose command of this environment (the dev extra installs it)."""
    beside = Path(sys.executable).with_name("podman-compose")
    found = str(beside) if beside.exists() else shutil.which("podman-compose")
    return [found] if found else []


def engine_problem() -> str | None:
    """Why no container can run here (one line), or None when podman and podman-compose work."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs it with apt-get)"
    if not podman_compose():
        return "podman-compose is not installed (pip install -e '.[dev]')"
    done = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Path}}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        # A missing OCI runtime (runc, which .ci/run configures) is reported here.
        return f"podman cannot run here: {(done.stderr.strip().splitlines() or ['podman info failed'])[-1]}"
    name, _, path = done.stdout.strip().partition(" ")
    if path and not Path(path).exists():
        return f"podman's OCI runtime {name} is not installed ({path} is missing)"
    return None


def base_image_problem(environment: dict[str, str]) -> str | None:
    """Why the images' base image cannot be had here (one line), or None.

    A base image already in podman's store is used as it is. One named
    ``localhost/...`` is made from Debian packages by
    docker/build-local-base.sh, which needs root and debootstrap; any other
    name is pulled by the build, which this check does not try.
    """
    base = environment["FEDX_BASE_IMAGE"]
    if not base.startswith("localhost/") or _image_id(base) is not None:
        return None
    if shutil.which("debootstrap") is None:
        return (
            f"the base image {base} is not in podman's store, and debootstrap, with which "
            "docker/build-local-base.sh makes it, is not installed"
        )
    if os.geteuid() != 0:
        return f"the base image {base} is not in podman's store, and docker/build-local-base.sh needs root to make it"
    return None


@functools.cache
def container_problem() -> str | None:
    """What this machine lacks to run fedx's containers (one line), or None (asked once)."""
    return engine_problem() or base_image_problem(build_environment())


def skip_module_without_containers() -> None:
    """Where containers cannot run, skip the calling test module in one line, at its import.

    Before any fixture starts (a session fixture such as a simulation run
    would otherwise start first). Under CI the fixture :func:`images` fails
    instead.
    """
    problem = container_problem()
    if problem is not None and not in_ci():
        pytest.skip(f"no container tests: {problem}", allow_module_level=True)


def build_environment() -> dict[str, str]:
    """Compose's build settings for this machine: the local base, torch from PyPI.

    No image registry is reachable here, so the base image is the one
    docker/build-local-base.sh makes from Debian packages, and torch comes
    from PyPI (PyTorch's CPU index is not reachable either). Both can be
    overridden from the environment.
    """
    return {
        "FEDX_BASE_IMAGE": os.environ.get("FEDX_BASE_IMAGE", LOCAL_BASE),
        "FEDX_TORCH_INDEX_URL": os.environ.get("FEDX_TORCH_INDEX_URL", "https://pypi.org/simple"),
        # The images' Flower is the one these tests run on (fedx checks 1.41 and 1.42).
        "FEDX_FLWR_VERSION": os.environ.get("FEDX_FLWR_VERSION", version("flwr")),
    }


def _substituted(text: str, environment: dict[str, str]) -> str:
    """``text`` with compose's ``${NAME:-default}`` replaced as compose replaces it."""
    return re.sub(
        r"\$\{(\w+):-([^}]*)\}", lambda m: environment.get(m.group(1)) or m.group(2), text
    )


def built_images() -> list[str]:
    """The images docker-compose.yml builds, by name (with :func:`build_environment`'s settings)."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    environment = build_environment()
    return sorted(_substituted(s["image"], environment) for s in services.values() if "build" in s)


def _image_id(image: str) -> str | None:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def inputs_key(environment: dict[str, str]) -> str:
    """A hash of every file the images are built from, the build settings and the base image."""
    digest = hashlib.sha256()
    for top in BUILD_INPUTS:
        path = REPO / top
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes() + b"\0")
    for name in sorted(environment):
        digest.update(f"{name}={environment[name]}\0".encode())
    digest.update((_image_id(environment["FEDX_BASE_IMAGE"]) or "").encode())
    return digest.hexdigest()


def make_local_base(environment: dict[str, str], timeout: float = 1800) -> str | None:
    """Make the ``localhost/...`` base image if it is missing; why it could not be made, or None.

    docker/build-local-base.sh takes a few minutes and needs Debian's mirror.
    """
    base = environment["FEDX_BASE_IMAGE"]
    if not base.startswith("localhost/") or _image_id(base) is not None:
        return None
    done = subprocess.run(
        [str(REPO / "docker" / "build-local-base.sh")],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"the base image {base} could not be made: {last}"
    return None


@contextmanager
def build_lock() -> Iterator[None]:
    """One builder of the images at a time (two container modules may start together)."""
    STAMP.parent.mkdir(parents=True, exist_ok=True)
    with open(STAMP.parent / "container-images.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_images(project: "ComposeProject", timeout: float = 3600) -> str:
    """Build the images unless the ones built last from the same inputs still exist.

    Returns what happened ("cached", or "built in N s"). The base image must
    be there already (:func:`make_local_base`).
    """
    environment = build_environment()
    key = inputs_key(environment)
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        stamp = {}
    images = built_images()
    if stamp.get("key") == key and all(
        stamp.get("images", {}).get(i) == _image_id(i) is not None for i in images
    ):
        return "cached"
    started = time.monotonic()
    # One image at a time: they share their first layers.
    project.compose("--parallel", "1", "build", timeout=timeout)
    built = {i: _image_id(i) for i in images}
    STAMP.parent.mkdir(parents=True, exist_ok=True)
    STAMP.write_text(json.dumps({"key": key, "images": built}))
    # The images these tests built before, now untagged: their layers would
    # pile up with every edit of fedx (podman refuses while a container uses one).
    for old in set(stamp.get("images", {}).values()) - set(built.values()):
        if old:
            subprocess.run(["podman", "rmi", old], capture_output=True, timeout=120, check=False)
    return f"built in {time.monotonic() - started:.0f} s"


def project_containers(name: str) -> list[str]:
    """The ids of compose project ``name``'s containers, running or not."""
    return subprocess.run(
        ["podman", "ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={name}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.split()


def remove_project(name: str, timeout: float = 240) -> list[str]:
    """Remove the containers (dependents with them) and the network of compose project ``name``.

    Again, after a pause, until none is left or ``timeout`` has passed: a
    ``podman rm`` can fail for a moment (a container that its restart policy
    or another test's podman holds), and a failure was once left there.
    Returns what podman said when it failed (empty when all went at once).
    """
    said = []
    deadline = time.monotonic() + timeout
    while (containers := project_containers(name)) and time.monotonic() < deadline:
        # --depend: a SuperLink goes after the containers started with a dependency
        # on it; --ignore: a container listed here but already gone as another's
        # dependent is no error (without it podman stops there, leaving the rest).
        done = subprocess.run(
            ["podman", "rm", "-f", "--depend", "--ignore", "-t", "0", *containers],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0 or project_containers(name):
            said.append(done.stderr.strip() or f"podman rm left {project_containers(name)}")
            time.sleep(2.0)
    subprocess.run(
        ["podman", "network", "rm", "-f", f"{name}_default"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return said


# Project names of these tests: a prefix and the pid of the pytest that made them.
PROJECT_NAME = re.compile(r"^fedx(?:test|auth|bad|build)(\d+)$")


def remove_stale_projects() -> list[str]:
    """Remove the projects of earlier runs of these tests whose pytest is gone (killed, timed out).

    Only projects named by :data:`PROJECT_NAME` whose pid no longer runs: a
    project of a test running beside this one is left alone.
    """
    listed = subprocess.run(
        ["podman", "ps", "-a", "--format", '{{index .Labels "io.podman.compose.project"}}'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.split()
    stale = []
    for name in sorted(set(listed)):
        match = PROJECT_NAME.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            remove_project(name)
            stale.append(name)
    return stale


class ComposeProject:
    """A compose project in ``directory`` under the name ``name``.

    Parameters
    ----------
    directory : Path
        Receives the deployment files (:data:`PROJECT_FILES`) and the
        folders the containers mount, owned by the containers' user.
    name : str
        The compose project name; containers are ``<name>_<service>_1``.
    files : tuple of str
        The compose files, in ``-f`` order.
    """

    def __init__(self, directory: Path, name: str, files=("docker-compose.yml",)) -> None:
        self.directory = directory
        self.name = name
        self.files = list(files)
        self.environment = {
            **os.environ,
            **build_environment(),
            "FEDX_SUPERLINK_PUBLISH": f"127.0.0.1:{free_port()}",
        }

    def prepare(self, folders=("certificates", "outputs", "state", "keys", "data")) -> None:
        """Copy the deployment files and make the folders the containers write to."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)  # the flwr service reads the app from here as uid 49999
        for name in PROJECT_FILES:
            source, target = REPO / name, self.directory / name
            if source.is_dir():
                shutil.copytree(
                    source,
                    target,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        for folder in folders:
            (self.directory / folder).mkdir(exist_ok=True)
            os.chown(self.directory / folder, APP_UID, APP_UID)

    # ------------------------------------------------------------------

    def compose_command(self) -> list[str]:
        """``podman-compose -p NAME -f FILE ...``, to run in the project folder."""
        command = [*podman_compose(), "-p", self.name]
        for file in self.files:
            command += ["-f", file]
        return command

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess:
        """``podman-compose -p NAME -f ... ARGS`` in the project folder."""
        return _run(
            [*self.compose_command(), *args],
            timeout,
            check,
            cwd=self.directory,
            env=self.environment,
        )

    def run_tool(
        self, service: str, *args: str, timeout: float = 300, entrypoint: str | None = None
    ) -> subprocess.CompletedProcess:
        """``compose run --rm`` a tool service (``flwr``, ``fedx-deploy``); returns what it did.

        ``entrypoint`` replaces the image's (``sh``: several commands in one
        start). On a timeout the tool's container is removed before the error
        goes on: killing podman-compose alone would leave it running.
        """
        try:
            return self.compose(
                "--profile",
                "tools",
                "run",
                "--rm",
                "-T",
                *(["--entrypoint", entrypoint] if entrypoint else []),
                service,
                *args,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.remove_tool_containers(service)
            raise

    def remove_tool_containers(self, service: str) -> None:
        """Remove the containers ``compose run`` made for ``service`` (``<project>_<service>_tmp<n>``)."""
        prefix = f"{self.name}_{service}_tmp"
        for name in self.container_names():
            if name.startswith(prefix):
                self.podman("rm", "-f", "-t", "2", name, check=False)

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def podman(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        return _run(["podman", *args], timeout, check)

    def logs(self, service: str) -> str:
        done = self.podman("logs", self.container(service), check=False)
        return done.stdout + done.stderr

    def count_in_log(self, service: str, pattern: str) -> int:
        return len(re.findall(pattern, self.logs(service)))

    def node_id(self, service: str) -> int | None:
        """The node id a SuperNode container last reported, if any."""
        found = NODE_ID.findall(self.logs(service))
        return int(found[-1]) if found else None

    @contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        """On a failed check inside, keep every container's log (a folder named in the failure)."""
        try:
            yield
        except AssertionError as err:
            folder = Path(tempfile.mkdtemp(prefix=f"{self.name}-logs-"))
            for name in self.container_names():
                done = self.podman("logs", "-t", name, check=False)
                (folder / f"{name}.log").write_text(done.stdout + done.stderr)
                done = self.podman("top", name, "pid", "ppid", "etime", "args", check=False)
                (folder / f"{name}.processes").write_text(done.stdout + done.stderr)
            for log in self.directory.glob("*.log"):  # what the tests' flwr runs printed
                shutil.copy2(log, folder / log.name)
            err.args = (f"{err.args[0] if err.args else ''}\n(the containers' logs: {folder})",)
            raise

    def state(self, service: str) -> str:
        done = self.podman(
            "inspect", "--format", "{{.State.Status}}", self.container(service), check=False
        )
        return done.stdout.strip()

    def addresses(self, service: str) -> list[str]:
        """The container's IP addresses on its networks."""
        done = self.podman(
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            self.container(service),
        )
        return done.stdout.split()

    @property
    def network(self) -> str:
        return f"{self.name}_default"

    def container_names(self) -> list[str]:
        """Names of this project's containers, running or not."""
        done = self.podman(
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=io.podman.compose.project={self.name}",
            check=False,
        )
        return done.stdout.split()

    def leftovers(self) -> list[str]:
        """Containers and the network of this project that still exist."""
        network = self.podman("network", "exists", self.network, check=False).returncode == 0
        return self.container_names() + ([self.network] if network else [])

    def down(self) -> list[str]:
        """``down`` as docs/deployment/containers.md types it; what it left behind.

        ``compose --profile tools down --remove-orphans`` stops every
        container with SIGTERM (each its grace period), then removes it, a
        ``compose run`` tool container that was left behind included, and the
        network. Whatever it leaves is returned, and then removed, so that a
        failing ``down`` fails the test and still leaves nothing running.
        """
        self.compose("--profile", "tools", "down", "--remove-orphans", timeout=300, check=False)
        left = self.leftovers()
        if left:
            remove_project(self.name)
        return left

    def stop_each(self, grace: int = STOP_GRACE) -> dict[str, tuple[float, int]]:
        """Stop every running container of the project at once, as ``stop``/``down`` do (SIGTERM,
        SIGKILL after ``grace`` s); per container, the seconds its stop took and its exit code."""
        running = self.podman(
            "ps",
            "--format",
            "{{.Names}}",
            "--filter",
            f"label=io.podman.compose.project={self.name}",
            check=False,
        ).stdout.split()
        stopped: dict[str, tuple[float, int]] = {}

        def stop(name: str) -> None:
            started = time.monotonic()
            self.podman("stop", "-t", str(grace), name, timeout=grace + 120, check=False)
            seconds = time.monotonic() - started
            code = self.podman("inspect", "--format", "{{.State.ExitCode}}", name, check=False)
            stopped[name] = (seconds, int(code.stdout.strip() or -1))

        threads = [threading.Thread(target=stop, args=(name,)) for name in running]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return stopped


def certs_arguments(hosts=HOSTS) -> list[str]:
    """``fedx-deploy``'s arguments for certificates naming ``hosts``, as docs/deployment/containers.md gives them."""
    args = ["certs", "--out", "certificates"]
    for host in hosts:
        args += ["--host", host]
    return args


# ----------------------------------------------------------------------
# The container modules' fixtures (tests/conftest.py makes them everyone's)
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def container_workdir():
    """The projects' folders: not under pytest's basetemp, which another pytest
    run of the same user may delete while the containers still mount it."""
    directory = Path(tempfile.mkdtemp(prefix="fedx-containers-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def images(container_workdir) -> str:
    """The images, built unless the last build from the same files still exists.

    Under CI (.ci/run installs podman, runc and debootstrap) a missing tool
    fails the test; elsewhere its module was skipped when it was imported
    (:func:`skip_module_without_containers`). First, whatever an earlier run
    of these tests left behind when it was killed (its pytest is gone) is
    removed: its containers hold ports and memory.
    """
    problem = container_problem()
    if problem is not None:
        skip_unless_ci(f"no container tests: {problem}")
    with build_lock():
        problem = make_local_base(build_environment())
        if problem is not None:
            skip_unless_ci(f"no container tests: {problem}")
        remove_stale_projects()
        project = ComposeProject(container_workdir / "build", f"fedxbuild{os.getpid()}")
        project.prepare()
        return ensure_images(project)
