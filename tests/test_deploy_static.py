"""Deployment files checked without starting anything: credentials, commands, compose, Dockerfile.

No Docker engine runs here, so the compose files and the Dockerfile are
validated statically: parsed, merged the way `docker compose -f a -f b`
merges them, and every command-line flag checked against the `--help` of
the installed Flower (whose version the image tags must match).
"""

import functools
import re
import stat
import subprocess
import sys
import tomllib
from importlib.metadata import version
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
from tests.deployment import deploy_up_faked

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FLWR_VERSION = version("flwr")
COMPOSE_FILES = [
    "docker-compose.yml",
    "docker-compose.auth.yml",
    "docker-compose.gpu.yml",
    "docker-compose.insecure.yml",
]


@functools.cache
def help_flags(executable: str) -> frozenset[str]:
    """The ``--flags`` an installed Flower executable documents in ``--help``."""
    done = subprocess.run(
        [str(BIN / executable), "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout))


def flags(command: list[str]) -> list[str]:
    return [part.split("=", 1)[0] for part in command if part.startswith("--")]


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
    "supernode": "flower-supernode",
    "superexec": "flower-superexec",
}


def executable_of(service: str) -> str:
    return ENTRYPOINTS[service.split("-")[0]]


def option(command: list[str], name: str) -> str:
    values = [part.split("=", 1)[1] for part in command if part.startswith(f"{name}=")]
    assert len(values) == 1, (name, command)
    return values[0]


NUM_NODES = 3
SUPERNODES = [f"supernode-{i}" for i in range(1, NUM_NODES + 1)]
CLIENT_EXECS = [f"superexec-clientapp-{i}" for i in range(1, NUM_NODES + 1)]


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
    assert set(services) == {"superlink", "superexec-serverapp", *SUPERNODES, *CLIENT_EXECS}
    for name, service in services.items():
        assert set(flags(service["command"])) <= help_flags(executable_of(name)), name


def test_compose_images_match_the_installed_flwr():
    services = load_compose("docker-compose.yml")
    assert services["superlink"]["image"] == f"flwr/superlink:{FLWR_VERSION}"
    assert all(services[n]["image"] == f"flwr/supernode:{FLWR_VERSION}" for n in SUPERNODES)
    built = [n for n, s in services.items() if "build" in s]
    assert sorted(built) == sorted(["superexec-serverapp", *CLIENT_EXECS])
    dockerfile = (REPO / services["superexec-serverapp"]["build"]["dockerfile"]).read_text()
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == [f"flwr/superexec:{FLWR_VERSION}"]
    assert 'ENTRYPOINT ["flower-superexec"]' in dockerfile


def test_dockerfile_installs_fedx_without_replacing_the_images_flwr():
    dockerfile = (REPO / "docker" / "superexec.Dockerfile").read_text()
    assert "COPY --chown=49999:49999 pyproject.toml README.md ./" in dockerfile
    assert "COPY --chown=49999:49999 fedx ./fedx" in dockerfile
    pattern = re.search(r"sed -i 's/(.*?)//' pyproject.toml", dockerfile).group(
        1
    )  # sed BRE: \[ is a literal [ in Python too
    pyproject = (REPO / "pyproject.toml").read_text()
    edited = "\n".join(line for line in pyproject.splitlines() if not re.search(pattern, line))
    dependencies = tomllib.loads(edited)["project"]["dependencies"]
    assert not any(d.startswith("flwr[") or d.startswith("flwr>") for d in dependencies)
    assert (
        any(d.startswith("torch") for d in dependencies)
        and len(dependencies) == len(tomllib.loads(pyproject)["project"]["dependencies"]) - 1
    )


def test_compose_wires_addresses_partitions_and_volumes():
    services = load_compose("docker-compose.yml")
    superlink = services["superlink"]["command"]
    port = option(superlink, "--port")
    assert services["superlink"]["ports"] == [f"{port}:{port}"]
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
        assert services[executor]["depends_on"] == [node]  # it serves that SuperNode's ClientApps
    assert partitions == set(range(NUM_NODES))
    server_volumes = {v.split(":")[1]: v for v in services["superexec-serverapp"]["volumes"]}
    assert server_volumes["/app/outputs"] == "./outputs:/app/outputs"  # writable: checkpoints
    assert server_volumes["/app/data"].endswith(":ro")
    assert "./state:/app/state" in services["superlink"]["volumes"]


def test_compose_is_tls_by_default_auth_and_insecure_only_when_asked():
    base = load_compose("docker-compose.yml")
    for name, service in base.items():
        command = service["command"]
        assert "--insecure" not in command, name
        for part in command:  # every certificate path is mounted into the container
            if part.split("=")[0] in (
                "--ssl-certfile",
                "--ssl-keyfile",
                "--ssl-ca-certfile",
                "--root-certificates",
            ):
                assert part.split("=", 1)[1].startswith("/app/certificates/"), name
                assert "./certificates:/app/certificates:ro" in service["volumes"], name
        if name != "superlink":
            assert option(command, "--root-certificates") == "/app/certificates/ca.crt"
    assert "--enable-supernode-auth" not in base["superlink"]["command"]

    auth = load_compose("docker-compose.yml", "docker-compose.auth.yml")
    assert "--enable-supernode-auth" in auth["superlink"]["command"]
    assert flags(auth["superlink"]["command"]).count("--ssl-certfile") == 1
    for index, node in enumerate(SUPERNODES, start=1):
        key = option(auth[node]["command"], "--auth-supernode-private-key")
        assert f"./keys/supernode-{index}.key:{key}:ro" in auth[node]["volumes"]
        assert "--root-certificates" in flags(auth[node]["command"])

    insecure = load_compose("docker-compose.yml", "docker-compose.insecure.yml")
    for name, service in insecure.items():
        assert "--insecure" in service["command"], name
        assert not {"--ssl-certfile", "--root-certificates"} & set(flags(service["command"])), name


def test_gpu_variant_reserves_a_gpu_for_every_clientapp_container():
    services = load_compose("docker-compose.yml", "docker-compose.gpu.yml")
    for name in CLIENT_EXECS:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        assert services[name]["build"]["args"]["TORCH_INDEX_URL"] == "https://pypi.org/simple"
        assert services[name]["command"] == load_compose("docker-compose.yml")[name]["command"]
    assert all(
        "deploy" not in services[n] for n in ["superlink", "superexec-serverapp", *SUPERNODES]
    )


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
