"""TLS certificates and SuperNode authentication keys for local deployments.

Flower 1.41 serves the SuperLink's Fleet, Control and Runtime APIs over
HTTPS with one certificate (``--ssl-certfile``/``--ssl-keyfile``/
``--ssl-ca-certfile``); SuperNodes, SuperExecs and the ``flwr`` CLI verify it
against the CA (``--root-certificates``, ``root-certificates`` in
``config.toml``). The certificate must name every host the SuperLink is
reached by, so :func:`write_tls_certificates` takes the names: ``localhost``
and ``127.0.0.1`` for processes on one machine, the compose service names
(``superlink``, ``supernode-1`` ...) for containers.

SuperNode authentication uses an EC key pair per SuperNode (a NIST curve;
P-384 here): the SuperNode signs its requests with the private key
(``--auth-supernode-private-key``, OpenSSH format) and the SuperLink, started
with ``--enable-supernode-auth``, accepts only nodes whose public key
(OpenSSH format) was registered with ``flwr supernode register``.

These files are for local and test use: the CA key sits next to the
certificates, unencrypted.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1", "superlink")
VALID_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    """Where :func:`write_tls_certificates` put its files."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> "TlsFiles":
        """The files of a certificate directory, checked to exist.

        Raises
        ------
        FileNotFoundError
            When a file is missing; the message says how to create them.
        """
        files = cls(directory / CA_CERT, directory / SERVER_CERT, directory / SERVER_KEY)
        for path in (files.ca_cert, files.server_cert, files.server_key):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: create the certificates with "
                    f"`python -m fedx.deploy certs --out {directory}`"
                )
        return files


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    path.write_bytes(data)
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedx local deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _subject_alternative_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def write_tls_certificates(directory: Path, hosts: list[str] | None = None) -> TlsFiles:
    """Create a local CA and a server certificate signed by it.

    Parameters
    ----------
    directory : Path
        Created if missing; receives ``ca.crt``, ``ca.key``, ``server.pem``
        and ``server.key`` (PEM).
    hosts : list[str], optional
        DNS names and IP addresses the server certificate is valid for
        (default: ``localhost``, ``127.0.0.1``, ``::1``, ``superlink``).

    Returns
    -------
    TlsFiles
        The CA certificate and the server's certificate and key.
    """
    hosts = list(hosts or DEFAULT_HOSTS)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = (
        now - datetime.timedelta(minutes=5),
        now + datetime.timedelta(days=VALID_DAYS),
    )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = _name("fedx local CA")
    ca_cert = (
        _certificate(ca_name, ca_name, ca_key.public_key(), not_before, not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage("digital_signature", "key_cert_sign", "crl_sign"), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = (
        _certificate(_name(hosts[0]), ca_name, server_key.public_key(), not_before, not_after)
        .add_extension(_subject_alternative_names(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage("digital_signature", "key_encipherment"), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    unencrypted = serialization.NoEncryption()
    traditional = serialization.PrivateFormat.TraditionalOpenSSL
    (directory / CA_CERT).write_bytes(ca_cert.public_bytes(pem))
    _write_private(directory / CA_KEY, ca_key.private_bytes(pem, traditional, unencrypted))
    (directory / SERVER_CERT).write_bytes(server_cert.public_bytes(pem))
    _write_private(directory / SERVER_KEY, server_key.private_bytes(pem, traditional, unencrypted))
    return TlsFiles(directory / CA_CERT, directory / SERVER_CERT, directory / SERVER_KEY)


#: The arguments of ``x509.KeyUsage``, each whether the key may be used so.
_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """A KeyUsage extension that allows exactly the ``allowed`` uses (names from ``_KEY_USAGES``)."""
    unknown = set(allowed) - set(_KEY_USAGES)
    assert not unknown, f"not key usages: {sorted(unknown)}"
    return x509.KeyUsage(**{usage: usage in allowed for usage in _KEY_USAGES})


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: rsa.RSAPublicKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.CertificateBuilder:
    """A certificate of ``subject``'s ``public_key`` by ``issuer``, with a random serial number."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def supernode_key_paths(directory: Path, index: int) -> tuple[Path, Path]:
    """``(private, public)`` key files of SuperNode ``index`` (from 1)."""
    return directory / f"supernode-{index}.key", directory / f"supernode-{index}.pub"


def write_supernode_keys(directory: Path, count: int) -> list[tuple[Path, Path]]:
    """Create ``count`` SuperNode authentication key pairs (EC P-384, OpenSSH format).

    Returns
    -------
    list[tuple[Path, Path]]
        ``(private, public)`` key files of SuperNodes 1 to ``count``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(1, count + 1):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = supernode_key_paths(directory, index)
        _write_private(
            private,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            ),
        )
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            + f" fedx-supernode-{index}\n".encode()
        )
        paths.append((private, public))
    return paths
