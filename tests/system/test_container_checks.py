"""fedx's compose files on podman beside the module's federation: the auth variant and bad input.

The auth variant (docker-compose.auth.yml): a registered SuperNode container
gets in, an unregistered one is refused. Bad input (no certificates,
certificates that do not name the hosts, an unwritable outputs/) stops a
container with one line. Each in a compose project of its own; everything
started is removed at the end. The federation that runs jobs:
tests/system/test_containers.py (a module of its own: another worker runs this one
meanwhile). The images: tests/support/containers.py.
"""

import os
import time
from pathlib import Path

import pytest

from fedx.deploy.credentials import write_tls_certificates
from tests.support.containers import (
    APP_UID,
    HOSTS,
    ComposeProject,
    certs_arguments,
    skip_module_without_containers,
)
from tests.support.deployment import wait_for

skip_module_without_containers()

pytestmark = pytest.mark.cost(2)

EX_CONFIG = 78


# ----------------------------------------------------------------------
# SuperNode authentication
# ----------------------------------------------------------------------


def register(project: ComposeProject, public_key: str):
    """``flwr supernode register`` through the flwr tool container, once the SuperLink answers."""
    done = project.run_tool("flwr", "supernode", "register", public_key)
    return done if done.returncode == 0 else None


def test_auth_variant_lets_registered_supernode_containers_in_and_refuses_others(
    images, container_workdir
):
    del images
    project = ComposeProject(
        container_workdir / "auth",
        f"fedxauth{os.getpid()}",
        files=("docker-compose.yml", "docker-compose.auth.yml"),
    )
    project.prepare()
    try:
        # The certificates and the keys from one start of the tool container.
        credentials = project.run_tool(
            "fedx-deploy",
            "-c",
            f"fedx-deploy {' '.join(certs_arguments())} && "
            "fedx-deploy keys --out keys --supernodes 2",
            entrypoint="sh",
        )
        assert credentials.returncode == 0, credentials.stdout + credentials.stderr
        project.compose("up", "-d", "superlink", timeout=300)
        # Only supernode-1's key is registered; supernode-2's never is.
        registered = wait_for(
            lambda: register(project, "/app/keys/supernode-1.pub"),
            180,
            "the SuperLink to register a key",
            interval=1.0,
        )
        assert "registered" in registered.stdout + registered.stderr
        project.compose("up", "-d", "--no-deps", "supernode-1", timeout=300)
        wait_for(lambda: project.node_id("supernode-1"), 180, "the registered SuperNode to connect")
        refused = project.compose(
            "run", "--rm", "-T", "--no-deps", "supernode-2", timeout=300, check=False
        )
        output = refused.stdout + refused.stderr
        assert refused.returncode != 0, output[-3000:]
        assert "Failed to activate SuperNode" in output, output[-3000:]
        assert "SuperNode ID:" not in output
    finally:
        left = project.down()  # docs/deployment/containers.md's, with the auth file
    assert left == [] and project.leftovers() == []


# ----------------------------------------------------------------------
# Bad input: one line and an exit, never a hang
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def unprepared(images, container_workdir):
    """A project folder of its own, for breaking its certificates and folders."""
    del images
    project = ComposeProject(container_workdir / "bad", f"fedxbad{os.getpid()}")
    project.prepare()
    yield project
    left = project.down()
    assert left == [] and project.leftovers() == []


def one_line_error(project: ComposeProject, service: str, *args: str) -> str:
    """Start ``service`` alone as compose would; it must exit at once with status 78 and one line."""
    started = time.monotonic()
    done = project.compose(
        "run",
        "--rm",
        "-T",
        "--no-deps",
        "-e",
        "FEDX_FAILURE_DELAY=0",
        service,
        *args,
        timeout=120,
        check=False,
    )
    lines = [
        line
        for line in done.stderr.splitlines() + done.stdout.splitlines()
        if line.startswith("fedx: ")
    ]
    assert done.returncode == EX_CONFIG, done.stdout + done.stderr
    assert len(lines) == 1, done.stdout + done.stderr
    assert time.monotonic() - started < 60
    return lines[0]


def write_app_certificates(folder: Path, hosts: list[str]) -> None:
    """Certificates naming ``hosts`` in ``folder``, owned by the containers' user."""
    write_tls_certificates(folder, hosts)
    for path in folder.iterdir():
        os.chown(path, APP_UID, APP_UID)


def test_bad_certificates_and_folders_stop_the_containers_with_one_line(unprepared):
    certificates = unprepared.directory / "certificates"
    line = one_line_error(unprepared, "superlink")
    assert (
        "--ssl-certfile /app/certificates/server.pem does not exist: make the certificates first"
        in line
    )
    assert "does not exist" in one_line_error(unprepared, "supernode-1")

    # Certificates for processes on one machine: they do not name the service hosts.
    write_app_certificates(certificates, ["localhost", "127.0.0.1"])
    line = one_line_error(unprepared, "supernode-1")
    assert (
        "server.pem does not name 'superlink'" in line and "it names localhost, 127.0.0.1" in line
    )
    assert "does not name 'supernode-2'" in one_line_error(unprepared, "superexec-clientapp-2")
    flwr = unprepared.run_tool("flwr", "run", ".", "--stream", timeout=120)
    assert flwr.returncode == EX_CONFIG and "does not name 'superlink'" in flwr.stderr, flwr.stderr

    # Right certificates (written here as `fedx-deploy certs` writes them: the
    # federation's fixture runs the tool), but an outputs/ the ServerApp's user cannot write.
    write_app_certificates(certificates, HOSTS)
    os.chown(unprepared.directory / "outputs", 0, 0)
    line = one_line_error(unprepared, "superexec-serverapp")
    assert "/app/outputs (written by this container) is not writable by uid 49999" in line
    flwr = unprepared.run_tool("flwr", "run", ".", "--stream", timeout=120)
    assert flwr.returncode == EX_CONFIG and "is not writable by uid 49999" in flwr.stderr, (
        flwr.stderr
    )
