"""Deployment files checked without starting anything: credentials, commands, compose, Dockerfile.

No Docker engine runs here, so the compose files and the Dockerfile are
validated statically: parsed, merged the way `docker compose -f a -f b`
merges them, and every command-line flag checked against the `--help` of
the installed Flower (whose version the image tags must match).
"""

import importlib.util
import re
import socket
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key
from flwr.cli.supernode.register import try_load_public_key

from fedx.deploy.cli import main as deploy_main
from fedx.deploy.credentials import TlsFiles, write_supernode_keys, write_tls_certificates
from fedx.deploy.local import FederationSpec
from fedx.flower import CHECKED_FLWR
from tests.support.deployment import deploy_up_faked
from tests.support.helpers import flags, help_flags

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: The compose files' Flower: FEDX_FLWR_VERSION, the newest release fedx checked by default.
COMPOSE_FLWR = f"${{FEDX_FLWR_VERSION:-{CHECKED_FLWR[-1]}}}"
# The checkout's version, which tags the superexec image: fedx need not be installed (on a GPU
# machine it is this checkout on PYTHONPATH, without the metadata importlib reads).
FEDX_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COMPOSE_FILES = [
    "docker-compose.yml",
    "docker-compose.auth.yml",
    "docker-compose.gpu.yml",
    "docker-compose.insecure.yml",
]


# ----------------------------------------------------------------------
# Credentials
# ----------------------------------------------------------------------


def test_certificates_chain_to_the_ca_and_name_the_hosts(tmp_path):
    files = write_tls_certificates(tmp_path, ["localhost", "127.0.0.1", "superlink"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "superlink"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in (tmp_path / "ca.key", files.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert TlsFiles.in_directory(tmp_path) == files
    files.server_key.unlink()
    with pytest.raises(FileNotFoundError, match="fedx.deploy certs"):
        TlsFiles.in_directory(tmp_path)


def test_supernode_keys_are_p384_pairs_that_flwr_accepts(tmp_path):
    pairs = write_supernode_keys(tmp_path, 2)
    assert [p.name for pair in pairs for p in pair] == [
        "supernode-1.key",
        "supernode-1.pub",
        "supernode-2.key",
        "supernode-2.pub",
    ]
    private = load_ssh_private_key(pairs[0][0].read_bytes(), None)
    public = load_ssh_public_key(pairs[0][1].read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()
    assert try_load_public_key(pairs[1][1])  # what `flwr supernode register` reads
    assert stat.S_IMODE(pairs[0][0].stat().st_mode) == 0o600


def test_the_deploy_command_writes_credentials_and_refuses_to_guess(tmp_path, capsys):
    assert deploy_main(["certs", "--out", str(tmp_path / "c"), "--host", "example.org"]) == 0
    assert deploy_main(["keys", "--out", str(tmp_path / "k"), "--supernodes", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "ca.crt",
        "ca.key",
        "server.key",
        "server.pem",
    ]
    assert len(list((tmp_path / "k").iterdir())) == 4
    with pytest.raises(SystemExit):  # neither --certificates nor --insecure
        deploy_main(["up", "--supernodes", "2"])
    assert "one of the arguments --certificates --insecure is required" in capsys.readouterr().err
    assert deploy_main(["up", "--certificates", str(tmp_path / "none")]) == 1
    assert "create the certificates" in capsys.readouterr().err
    assert deploy_main(["up", "--insecure", "--auth-keys", str(tmp_path / "k")]) == 1
    assert "SuperNode authentication needs TLS" in capsys.readouterr().err


# ----------------------------------------------------------------------
# Local processes
# ----------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path) -> TlsFiles:
    return write_tls_certificates(tmp_path / "certificates")


def test_local_commands_use_only_flags_the_installed_flwr_has(tmp_path, tls):
    specs = [
        FederationSpec(3, tmp_path, insecure=True),
        FederationSpec(3, tmp_path, tls=tls),
        FederationSpec(3, tmp_path, tls=tls, auth_keys=tmp_path / "keys"),
    ]
    for spec in specs:
        assert set(flags(spec.superlink_command())) <= help_flags("flower-superlink")
        for index in range(3):
            assert set(flags(spec.supernode_command(index))) <= help_flags("flower-supernode")


def test_local_commands_wire_addresses_partitions_and_security(tmp_path, tls):
    spec = FederationSpec(
        3,
        tmp_path,
        port=8123,
        supernode_ports=[9101, 9102, 9103],
        tls=tls,
        auth_keys=tmp_path / "keys",
    )
    superlink = spec.superlink_command()
    assert "--enable-supernode-auth" in superlink and "--insecure" not in superlink
    assert superlink[superlink.index("--port") + 1] == "8123"
    assert superlink[superlink.index("--ssl-certfile") + 1] == str(tls.server_cert)
    assert "--disable-runtime-dependency-installation" in superlink
    for index in range(3):
        node = spec.supernode_command(index)
        assert node[node.index("--superlink") + 1] == "127.0.0.1:8123"
        assert node[node.index("--port") + 1] == str(9101 + index)
        assert node[node.index("--node-config") + 1] == f"partition-id={index} num-partitions=3"
        assert node[node.index("--root-certificates") + 1] == str(tls.ca_cert)
        assert node[node.index("--auth-supernode-private-key") + 1].endswith(
            f"supernode-{index + 1}.key"
        )
    connection = tomllib.loads(spec.config_toml())["superlink"]
    assert connection["default"] == "fedx-local"
    assert connection["fedx-local"] == {
        "address": "127.0.0.1:8123",
        "root-certificates": str(tls.ca_cert.resolve()),
    }
    assert spec.environment()["FLWR_HOME"] == str(spec.flwr_home.resolve())


def test_the_superlink_keeps_its_state_in_a_file_unless_asked_for_memory(tmp_path):
    kept = FederationSpec(2, tmp_path, insecure=True).superlink_command()
    assert kept[kept.index("--database") + 1] == str((tmp_path / "superlink.db").resolve())
    in_memory = FederationSpec(2, tmp_path, insecure=True, superlink_database="memory")
    assert "--database" not in in_memory.superlink_command()  # Flower's default: in memory
    with pytest.raises(ValueError, match="superlink_database must be"):
        FederationSpec(2, tmp_path, insecure=True, superlink_database="postgres")


def test_grpc_transport_commands_for_flower_136(tmp_path):
    spec = FederationSpec(
        2, tmp_path, insecure=True, transport="grpc", fleet_port=9192, control_port=9193, port=9191
    )
    superlink = spec.superlink_command()
    assert superlink[superlink.index("--fleet-api-address") + 1] == "127.0.0.1:9192"
    assert superlink[superlink.index("--control-api-address") + 1] == "127.0.0.1:9193"
    node = spec.supernode_command(1)
    assert node[node.index("--superlink") + 1] == "127.0.0.1:9192"
    assert tomllib.loads(spec.config_toml())["superlink"]["fedx-local"] == {
        "address": "127.0.0.1:9193",
        "insecure": True,
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "ask for insecure=True explicitly"),
        ({"insecure": True, "auth_keys": Path("keys")}, "needs TLS"),
        ({"insecure": True, "supernode_ports": [1]}, "one Runtime API port per SuperNode"),
        ({"insecure": True, "transport": "grpc"}, "needs fleet_port and control_port"),
    ],
)
def test_local_spec_refuses_unsafe_or_incomplete_settings(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        FederationSpec(2, tmp_path, **kwargs)


# ----------------------------------------------------------------------
# Containers
# ----------------------------------------------------------------------


def load_compose(*names: str) -> dict:
    """The compose files merged like `docker compose -f a -f b ...` merges them."""
    merged: dict = {"services": {}}
    for name in names:
        document = yaml.safe_load((REPO / name).read_text())
        for service, settings in document["services"].items():
            target = merged["services"].setdefault(service, {})
            for key, value in settings.items():
                if key == "volumes" and key in target:  # merged by container path
                    by_target = {v.split(":")[1]: v for v in target[key] + value}
                    target[key] = list(by_target.values())
                else:
                    target[key] = value  # command, image, build, deploy: replaced
    return merged["services"]


ENTRYPOINTS = {
    "superlink": "flower-superlink",
    "supernode": "fedx-supernode",  # Flower's, on which a stopped run leaves nothing behind
    "superexec": "flower-superexec",
}
TOOLS = ["flwr", "fedx-deploy"]


def executable_of(service: str) -> str:
    return ENTRYPOINTS[service.split("-")[0]]


def option(command: list[str], name: str) -> str:
    values = [part.split("=", 1)[1] for part in command if part.startswith(f"{name}=")]
    assert len(values) == 1, (name, command)
    return values[0]


NUM_NODES = 3
SUPERNODES = [f"supernode-{i}" for i in range(1, NUM_NODES + 1)]
CLIENT_EXECS = [f"superexec-clientapp-{i}" for i in range(1, NUM_NODES + 1)]
FEDERATION = ["superlink", "superexec-serverapp", *SUPERNODES, *CLIENT_EXECS]


@pytest.mark.parametrize(
    "variant",
    [
        (),
        ("docker-compose.auth.yml",),
        ("docker-compose.gpu.yml",),
        ("docker-compose.insecure.yml",),
    ],
)
def test_compose_services_use_flags_the_installed_flwr_has(variant):
    services = load_compose("docker-compose.yml", *variant)
    assert set(services) == {*FEDERATION, *TOOLS}
    for name in FEDERATION:
        assert set(flags(services[name]["command"])) <= help_flags(executable_of(name)), name
    for name in TOOLS:  # started only by `compose run`, never by `up`
        assert services[name]["profiles"] == ["tools"] and services[name]["restart"] == "no"


def build_of(service: dict) -> dict:
    return service["build"]


@pytest.mark.parametrize(
    "variant",
    [
        (),
        ("docker-compose.auth.yml",),
        ("docker-compose.gpu.yml",),
        ("docker-compose.insecure.yml",),
    ],
)
def test_every_container_of_the_federation_runs_its_program_under_an_init(variant):
    """Flower's SuperLink and SuperNode install no SIGTERM handler, and the kernel drops a
    signal that a container's PID 1 has no handler for: `stop` and `down` then waited out the
    grace period and killed them (exit 137). Under an init, SIGTERM ends them
    (tests/system/test_containers.py stops every container and times it)."""
    services = load_compose("docker-compose.yml", *variant)
    for name in FEDERATION:
        assert services[name].get("init") is True, name
        assert services[name]["restart"] == "unless-stopped", name  # a crash is restarted


def test_compose_builds_each_image_once_from_the_dockerfile_for_a_checked_flwr():
    services = load_compose("docker-compose.yml")
    builders = {name: s for name, s in services.items() if "build" in s}
    targets = {name: build_of(s)["target"] for name, s in builders.items()}
    assert targets == {
        "superlink": "superlink",
        "supernode-1": "supernode",
        "superexec-serverapp": "superexec",
    }
    images = {build_of(s)["target"]: s["image"] for s in builders.values()}
    assert images == {
        "superlink": f"fedx/superlink:{COMPOSE_FLWR}",
        "supernode": f"fedx/supernode:{COMPOSE_FLWR}",
        "superexec": f"fedx/superexec:{FEDX_VERSION}",
    }
    for name, service in services.items():  # the others use the images built
        role = "superexec" if name.startswith("superexec") or name in TOOLS else name.split("-")[0]
        assert service["image"] == images[role], name
    for service in builders.values():
        build = build_of(service)
        assert (build["context"], build["dockerfile"]) == (".", "docker/Dockerfile")
        assert build["args"]["FLWR_VERSION"] == COMPOSE_FLWR
        assert (
            build["args"]["BASE_IMAGE"] == "${FEDX_BASE_IMAGE:-docker.io/library/python:3.11-slim}"
        )
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.findall(r"^FROM (\S+) AS (\S+)", dockerfile, re.M) == [
        ("${BASE_IMAGE}", "flower"),
        ("flower", "superlink"),
        ("flower", "fedx"),
        ("flower", "supernode"),
        ("flower", "requirements"),
        ("flower", "superexec"),
    ]
    assert f"ARG FLWR_VERSION={CHECKED_FLWR[-1]}" in dockerfile
    assert "ARG BASE_IMAGE=docker.io/library/python:3.11-slim" in dockerfile
    for role in ENTRYPOINTS:
        assert f'ENTRYPOINT ["fedx-entrypoint", "{ENTRYPOINTS[role]}"]' in dockerfile
    # Every pip install reads the wheels a cache mount keeps; nothing is installed around it.
    runs = re.findall(r"^RUN (.*?)(?<!\\)$", dockerfile, re.M | re.S)
    installs = [run for run in runs if "pip install" in run]
    assert len(installs) == 4  # Flower; fedx's dependencies; fedx in the superexec and supernode
    assert all(
        r.startswith("--mount=type=cache,target=/var/cache/fedx-wheels") and "--no-index" in r
        for r in installs
    )


def test_the_superexec_image_gets_every_fedx_dependency_but_flwr():
    """docker/Dockerfile's requirements stage, run on pyproject.toml."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    script = re.search(r'RUN python3 -c "(.*?)" > /tmp/requirements.txt', dockerfile).group(1)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dependencies = project["dependencies"] + project["optional-dependencies"]["app"]
    done = subprocess.run(
        [sys.executable, "-c", script.replace("/tmp/pyproject.toml", str(REPO / "pyproject.toml"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = done.stdout.split()
    assert listed == [d for d in dependencies if not d.startswith(("flwr[", "flwr>"))]
    assert len(listed) == len(dependencies) - 2 and any(d.startswith("torch") for d in listed)


def test_the_build_context_holds_only_what_the_images_copy():
    ignore = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert ignore[0] == "*"
    kept = sorted(line[1:].rstrip("/") for line in ignore if line.startswith("!"))
    copies = re.findall(r"^COPY (.+) \S+$", (REPO / "docker" / "Dockerfile").read_text(), re.M)
    sources = sorted(
        {
            s
            for line in copies
            if "--from=" not in line
            for s in line.split()
            if not s.startswith("--")
        }
    )
    assert kept == sources == ["LICENSE", "docker/entrypoint.py", "fedx", "pyproject.toml"]


def test_compose_wires_addresses_partitions_and_volumes():
    services = load_compose("docker-compose.yml")
    superlink = services["superlink"]["command"]
    port = option(superlink, "--port")
    assert services["superlink"]["ports"] == [
        f"${{FEDX_SUPERLINK_PUBLISH:-127.0.0.1:{port}}}:{port}"
    ]
    assert (
        option(superlink, "--isolation") == "process"
    )  # the ServerApp runs in superexec-serverapp
    assert (
        option(services["superexec-serverapp"]["command"], "--runtime-api-address")
        == f"superlink:{port}"
    )
    partitions = set()
    for node, executor in zip(SUPERNODES, CLIENT_EXECS, strict=True):
        command = services[node]["command"]
        assert option(command, "--superlink") == f"superlink:{port}"
        assert option(command, "--isolation") == "process"
        assert option(command, "--host") == "0.0.0.0"
        assert (
            option(services[executor]["command"], "--runtime-api-address")
            == f"{node}:{option(command, '--port')}"
        )
        config = dict(item.split("=") for item in option(command, "--node-config").split())
        assert config["num-partitions"] == str(NUM_NODES)
        partitions.add(int(config["partition-id"]))
        assert "/app/data" in {v.split(":")[1] for v in services[executor]["volumes"]}
        assert services[executor]["depends_on"] == [node]
        # fedx's warm executor; its ClientApps get a share of the host's cores, as
        # many as the SuperNodes that share them, unless FEDX_CLIENTAPP_THREADS says.
        assert services[executor]["entrypoint"] == ["fedx-entrypoint", "fedx-superexec"]
        environment = services[executor]["environment"]
        assert environment["FEDX_SUPERNODES_PER_MACHINE"] == str(NUM_NODES)
        assert environment["FEDX_CLIENTAPP_THREADS"] == "${FEDX_CLIENTAPP_THREADS:-}"
        assert "OMP_NUM_THREADS" not in environment  # fedx-superexec sets it from the share
    assert partitions == set(range(NUM_NODES))
    server = services["superexec-serverapp"]
    server_volumes = {v.split(":")[1]: v for v in server["volumes"]}
    assert server_volumes["/app/outputs"] == "./outputs:/app/outputs"  # writable: checkpoints
    assert server_volumes["/app/data"].endswith(":ro")
    assert server["environment"]["FEDX_WRITABLE_DIRS"] == "/app/outputs"
    assert "./state:/app/state" in services["superlink"]["volumes"]
    # The flwr tool: this folder is the app, its connections are docker/flwr-config.toml.
    flwr = services["flwr"]
    assert (
        flwr["entrypoint"] == ["fedx-entrypoint", "flwr"] and flwr["working_dir"] == "/app/project"
    )
    assert ".:/app/project:ro" in flwr["volumes"]
    config = tomllib.loads((REPO / "docker" / "flwr-config.toml").read_text())["superlink"]
    assert (
        f"./docker/flwr-config.toml:{flwr['environment']['FLWR_HOME']}/config.toml:ro"
        in flwr["volumes"]
    )
    assert config[config["default"]] == {
        "address": f"superlink:{port}",
        "root-certificates": "/app/certificates/ca.crt",
    }
    assert config["fedx-compose-insecure"] == {"address": f"superlink:{port}", "insecure": True}
    assert services["fedx-deploy"]["entrypoint"] == ["fedx-deploy"]
    assert (
        "./certificates:/app/certificates" in services["fedx-deploy"]["volumes"]
    )  # writable: it makes them
    # podman-compose: a container per service on the network, not one pod.
    assert yaml.safe_load((REPO / "docker-compose.yml").read_text())["x-podman"] == {
        "in_pod": False
    }


def test_compose_is_tls_by_default_auth_and_insecure_only_when_asked():
    base = load_compose("docker-compose.yml")
    for name in FEDERATION:
        command = base[name]["command"]
        assert "--insecure" not in command, name
        for part in command:  # every certificate path is mounted into the container
            if part.split("=")[0] in (
                "--ssl-certfile",
                "--ssl-keyfile",
                "--ssl-ca-certfile",
                "--root-certificates",
            ):
                assert part.split("=", 1)[1].startswith("/app/certificates/"), name
                assert "./certificates:/app/certificates:ro" in base[name]["volumes"], name
        if name != "superlink":
            assert option(command, "--root-certificates") == "/app/certificates/ca.crt"
    assert "--enable-supernode-auth" not in base["superlink"]["command"]

    auth = load_compose("docker-compose.yml", "docker-compose.auth.yml")
    assert "--enable-supernode-auth" in auth["superlink"]["command"]
    assert flags(auth["superlink"]["command"]).count("--ssl-certfile") == 1
    for index, node in enumerate(SUPERNODES, start=1):
        key = option(auth[node]["command"], "--auth-supernode-private-key")
        assert f"./keys/supernode-{index}.key:{key}:ro" in auth[node]["volumes"]
        assert "./certificates:/app/certificates:ro" in auth[node]["volumes"]
        assert "--root-certificates" in flags(auth[node]["command"])

    insecure = load_compose("docker-compose.yml", "docker-compose.insecure.yml")
    for name in FEDERATION:
        assert "--insecure" in insecure[name]["command"], name
        assert not {"--ssl-certfile", "--root-certificates"} & set(
            flags(insecure[name]["command"])
        ), name


def test_gpu_variant_reserves_a_gpu_for_every_clientapp_container():
    services = load_compose("docker-compose.yml", "docker-compose.gpu.yml")
    base = load_compose("docker-compose.yml")
    for name in CLIENT_EXECS:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        assert services[name]["image"] == f"fedx/superexec:{FEDX_VERSION}-gpu"
        assert services[name]["command"] == base[name]["command"]
    build = build_of(services["superexec-clientapp-1"])
    assert (build["target"], build["args"]["TORCH_INDEX_URL"]) == (
        "superexec",
        "https://pypi.org/simple",
    )
    assert build["args"]["FLWR_VERSION"] == COMPOSE_FLWR
    assert all(
        "deploy" not in services[n] for n in ["superlink", "superexec-serverapp", *SUPERNODES]
    )


# ----------------------------------------------------------------------
# The containers' entrypoint (docker/entrypoint.py) without an engine
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def entrypoint():
    spec = importlib.util.spec_from_file_location(
        "fedx_entrypoint", REPO / "docker" / "entrypoint.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_entrypoint_reads_flags_and_matches_names(entrypoint):
    assert entrypoint.option_values(["--a=1", "--b", "2", "--c", "--d"]) == {"--a": "1", "--b": "2"}
    assert entrypoint.names_host(["superlink", "127.0.0.1"], "superlink")
    assert entrypoint.names_host(["SuperLink."], "superlink")
    assert entrypoint.names_host(["*.example.org"], "node.example.org")
    assert not entrypoint.names_host(["*.example.org"], "a.node.example.org")
    assert entrypoint.names_host(["::1"], "0:0::1") and not entrypoint.names_host(
        ["localhost"], "127.0.0.1"
    )
    assert not entrypoint.names_host(["supernode-1"], "supernode-2")


def test_entrypoint_refuses_missing_unnamed_foreign_certificates_and_unwritable_folders(
    entrypoint, tmp_path, monkeypatch
):
    failed = entrypoint.CheckFailed
    certificates = tmp_path / "certificates"
    node = [
        "--superlink=superlink:8000",
        f"--root-certificates={certificates / 'ca.crt'}",
        "--port=9094",
    ]
    with pytest.raises(failed, match="ca.crt does not exist: make the certificates first"):
        entrypoint.check("flower-supernode", node)
    write_tls_certificates(certificates, ["localhost", "127.0.0.1"])
    with pytest.raises(
        failed, match=r"server.pem does not name 'superlink'.*\(it names localhost, 127.0.0.1\)"
    ):
        entrypoint.check("flower-supernode", node)
    entrypoint.check("flower-supernode", ["--insecure", *node])  # no TLS: nothing to match
    write_tls_certificates(certificates, ["superlink", "supernode-1"])
    entrypoint.check("flower-supernode", node)
    entrypoint.check(
        "flower-superexec",
        [
            "--runtime-api-address",
            "supernode-1:9094",
            "--root-certificates",
            str(certificates / "ca.crt"),
        ],
    )
    other = write_tls_certificates(tmp_path / "other", ["superlink"])
    (certificates / "server.pem").write_bytes(other.server_cert.read_bytes())
    with pytest.raises(failed, match="server.pem is not signed by .*ca.crt"):
        entrypoint.check("flower-supernode", node)

    monkeypatch.setenv("FEDX_WRITABLE_DIRS", f"{tmp_path}:{tmp_path / 'missing'}")
    with pytest.raises(failed, match="missing \\(written by this container\\) is not a folder"):
        entrypoint.check("flower-superexec", [])
    monkeypatch.delenv("FEDX_WRITABLE_DIRS")
    entrypoint.check("flower-superlink", [f"--database={tmp_path / 'superlink.db'}"])

    def refuse(*args, **kwargs):  # what a folder of another owner answers (root writes anywhere)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(entrypoint.tempfile, "TemporaryFile", refuse)
    with pytest.raises(
        failed,
        match=r"\(the SuperLink's database\) is not writable by uid \d+ \(Permission denied\)",
    ):
        entrypoint.check("flower-superlink", [f"--database={tmp_path / 'superlink.db'}"])


def test_entrypoint_gives_clientapp_superexecs_their_share_of_the_cores(entrypoint, monkeypatch):
    from fedx.deploy import cores  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    for name in ("FEDX_SUPERNODES_PER_MACHINE", "FEDX_CLIENTAPP_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert entrypoint.clientapp_threads("flower-superexec") == {}  # the ServerApp's: untouched
    monkeypatch.setenv("FEDX_SUPERNODES_PER_MACHINE", "3")  # compose's ClientApp SuperExecs
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "")
    expected = dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), "2")
    assert entrypoint.clientapp_threads("/opt/venv/bin/flower-superexec") == expected
    assert entrypoint.clientapp_threads("fedx-superexec") == expected
    assert entrypoint.clientapp_threads("flower-supernode") == {}
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "1")
    assert entrypoint.clientapp_threads("flower-superexec")["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "all")
    with pytest.raises(entrypoint.CheckFailed, match="FEDX_CLIENTAPP_THREADS must be a whole"):
        entrypoint.clientapp_threads("flower-superexec")


def test_entrypoint_checks_the_connection_flwr_run_uses(entrypoint, tmp_path, monkeypatch):
    write_tls_certificates(tmp_path / "certificates", ["localhost"])
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        (REPO / "docker" / "flwr-config.toml")
        .read_text()
        .replace("/app/certificates", str(tmp_path / "certificates"))
    )
    monkeypatch.setenv("FLWR_HOME", str(home))
    with pytest.raises(entrypoint.CheckFailed, match="does not name 'superlink'"):
        entrypoint.check("flwr", ["run", ".", "--stream", "--run-config", "num-server-rounds=1"])
    entrypoint.check(
        "flwr", ["run", ".", "fedx-compose-insecure", "--stream"]
    )  # plain text: nothing to check
    entrypoint.check("flwr", ["ls"])
    # main(): one line on stderr, status 78, and the program never starts.
    monkeypatch.setattr(entrypoint.os, "execvp", lambda *a: pytest.fail("must not start"))
    assert entrypoint.main(["flwr", "run", "."]) == entrypoint.EX_CONFIG


def test_entrypoint_waits_for_the_superlink_of_flwr_commands(
    entrypoint, tmp_path, monkeypatch, capsys
):
    """`compose up -d` returns before the SuperLink listens: flwr commands wait for it, bounded."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    up, down = listening.getsockname()[1], closed.getsockname()[1]
    closed.close()  # nothing listens there: connections are refused
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "up"\n'
        f'[superlink.up]\naddress = "127.0.0.1:{up}"\ninsecure = true\n'
        f'[superlink.down]\naddress = "127.0.0.1:{down}"\ninsecure = true\n'
    )
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.setenv("FEDX_SUPERLINK_WAIT", "1")
    assert entrypoint.flwr_superlink(["run", ".", "down", "--stream"])["address"].endswith(
        f":{down}"
    )
    assert entrypoint.flwr_superlink(["stop", "123"])["address"].endswith(f":{up}")
    assert entrypoint.flwr_superlink(["--help"]) is None
    started = []
    monkeypatch.setattr(entrypoint.os, "execvp", lambda program, argv: started.append(argv))
    with listening:
        assert entrypoint.main(["flwr", "ls"]) == 0 and started == [["flwr", "ls"]]
        begun = time.monotonic()
        assert entrypoint.main(["flwr", "run", ".", "down"]) == entrypoint.EX_CONFIG
        assert 1.0 <= time.monotonic() - begun < 10
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"fedx: flwr: the SuperLink at 127.0.0.1:{down} accepted no connection")
    assert "\n" not in line and len(started) == 1
    assert entrypoint.main(["flwr", "--help"]) == 0 and len(started) == 2  # no SuperLink needed


def test_up_starts_the_federation_and_runs_the_app_once(tmp_path, monkeypatch, capsys):
    """`fedx-deploy up --run`: the spec it builds and the `flwr run` it makes (processes faked)."""
    code, started = deploy_up_faked(
        monkeypatch,
        tmp_path,
        "--insecure --supernodes 2 --port 8123 --supernode-port 9200 --state-dir state "
        "--run some/app --run-config num-server-rounds=2",
    )
    assert code == 0 and started["started"] and started["stopped"]
    spec = started["spec"]
    assert (spec.num_supernodes, spec.port, spec.supernode_ports) == (2, 8123, [9200, 9201])
    assert spec.insecure and spec.tls is None and spec.workdir == tmp_path
    assert spec.state_dir == tmp_path / "state"
    assert started["command"][1:] == [
        "run",
        "some/app",
        "fedx-local",
        "--stream",
        "--run-config",
        "num-server-rounds=2",
    ]
    assert started["env"]["FLWR_HOME"] == str(tmp_path / "state" / "flwr-home")
    assert "SuperNodes [100, 101]" in capsys.readouterr().out
