#!/opt/venv/bin/python
"""Check what a Flower process in a fedx container needs, then become that process.

``fedx-entrypoint PROGRAM [ARGS...]`` (the ENTRYPOINT of fedx's images) runs
PROGRAM (flower-superlink, fedx-supernode, flower-superexec or flwr) with
ARGS after checking, in this order:

1. every file a flag names (certificates, keys, secrets) exists and is
   readable by this user;
2. when the process connects over TLS (``--root-certificates`` with
   ``--superlink`` or ``--runtime-api-address``; for ``flwr``, the default
   connection of ``$FLWR_HOME/config.toml``) and the server's certificate
   lies next to the CA (``server.pem``, as ``fedx-deploy certs`` writes
   them), that certificate is signed by the CA, still valid, and names the
   host the process connects to;
3. the folders in ``$FEDX_WRITABLE_DIRS`` (colon-separated) and the folder of
   ``--database`` are writable;
4. for a ``flwr`` command that talks to the SuperLink, the SuperLink of its
   connection accepts connections, waiting up to ``$FEDX_SUPERLINK_WAIT``
   seconds (default 120) for it: ``compose up -d`` returns before the
   SuperLink listens, and the flwr CLI fails at once when it does not.

A SuperExec that runs ClientApps (``$FEDX_SUPERNODES_PER_MACHINE`` or
``$FEDX_CLIENTAPP_THREADS`` set) starts with ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to the ClientApps' share
of the cores (:mod:`fedx.deploy.cores`; ``$FEDX_CLIENTAPP_THREADS`` changes
it, as with ``fedx-deploy``, whatever those variables said): Flower's
``flower-superexec`` starts a ``flwr-clientapp`` per message with this
environment, and torch reads them as it loads (``fedx-superexec`` applies
the same share itself). A count that is not a whole number of at least 1
fails the checks.

A failed check prints one line naming the problem and how to fix it, and
exits with status 78 (EX_CONFIG), after ``$FEDX_FAILURE_DELAY`` seconds
(default 0: long-running services set it, so that a restart policy does not
restart a misconfigured container in a tight loop). Without the checks,
Flower's processes retry unreachable or untrusted peers for ever, which
looks like a hang.

Standard library only, plus ``cryptography`` (a Flower dependency), and
fedx in the SuperExec and SuperNode images.
"""

import datetime
import ipaddress
import os
import socket
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

EX_CONFIG = 78
README = "see README.md, 'Containers'"
FILE_FLAGS = {
    "--ssl-certfile": "certificate",
    "--ssl-keyfile": "certificate",
    "--ssl-ca-certfile": "certificate",
    "--root-certificates": "certificate",
    "--auth-supernode-private-key": "key",
    "--superexec-auth-secret-file": "secret",
}
TARGET_FLAGS = ("--superlink", "--runtime-api-address")
SERVER_CERT = "server.pem"


class CheckFailed(Exception):
    """A check failed; the message is the one line to print."""


def option_values(args: list[str]) -> dict[str, str]:
    """``--flag value`` and ``--flag=value`` pairs of a command line (last one wins)."""
    values = {}
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
            values[name] = value
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            values[arg] = args[index + 1]
    return values


def check_readable(flag: str, path: str, kind: str) -> None:
    what = {
        "certificate": "make the certificates first (fedx-deploy certs)",
        "key": "make the SuperNode keys first (fedx-deploy keys)",
        "secret": "write the secret file first",
    }[kind]
    if not Path(path).is_file():
        raise CheckFailed(f"{flag} {path} does not exist: {what}; {README}")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise CheckFailed(
            f"{flag} {path} is not readable by uid {os.getuid()} ({err.strerror}): "
            f"make it readable by that user on the host; {README}"
        ) from None


def certificate_names(certificate) -> list[str]:
    """The DNS names and IP addresses a certificate's subjectAltName lists."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [
        *names.get_values_for_type(x509.DNSName),
        *map(str, names.get_values_for_type(x509.IPAddress)),
    ]


def names_host(names: list[str], host: str) -> bool:
    """Whether ``host`` matches one of the names (a ``*.`` wildcard covers one label)."""
    try:
        address = ipaddress.ip_address(host)
        return any(name == str(address) for name in names)
    except ValueError:
        pass
    host = host.lower().rstrip(".")
    for name in (n.lower().rstrip(".") for n in names):
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def check_server_certificate(ca_file: str, address: str) -> None:
    """The certificate next to ``ca_file`` is the CA's, valid now, and names ``address``'s host."""
    server_file = Path(ca_file).with_name(SERVER_CERT)
    if not server_file.is_file():
        return  # the server's certificate lives elsewhere: TLS itself will check it
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        ca = x509.load_pem_x509_certificate(Path(ca_file).read_bytes())
        server = x509.load_pem_x509_certificate(server_file.read_bytes())
    except (OSError, ValueError) as err:
        raise CheckFailed(
            f"cannot read {ca_file} or {server_file} as PEM certificates ({err}); {README}"
        ) from None
    try:
        server.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as err:
        raise CheckFailed(
            f"{server_file} is not signed by {ca_file} ({type(err).__name__}): "
            f"make both with one `fedx-deploy certs`; {README}"
        ) from None
    now = datetime.datetime.now(datetime.UTC)
    if not server.not_valid_before_utc <= now <= server.not_valid_after_utc:
        raise CheckFailed(
            f"{server_file} is valid from {server.not_valid_before_utc:%Y-%m-%d} to "
            f"{server.not_valid_after_utc:%Y-%m-%d}, not now: make new certificates; {README}"
        )
    names = certificate_names(server)
    if not names_host(names, host):
        raise CheckFailed(
            f"{server_file} does not name '{host}', the host this container connects to "
            f"(it names {', '.join(names) or 'nothing'}): make the certificates with "
            f"`fedx-deploy certs --host {host} ...` naming every service; {README}"
        )


# Options of `flwr run` that take a value (the others are flags).
FLWR_RUN_VALUE_OPTIONS = {"--run-config", "-c", "--federation-config", "--federation", "--format"}


# flwr subcommands that talk to the SuperLink.
FLWR_SUPERLINK_COMMANDS = {"run", "ls", "stop", "log", "pull", "supernode"}


def flwr_superlink(args: list[str]) -> dict | None:
    """The SuperLink connection (config.toml table) the flwr command ``args`` uses, if any.

    ``args`` are flwr's arguments (``run APP [CONNECTION] ...``, ``ls
    [CONNECTION]``, ...): the connection is the last positional argument that
    names one in ``$FLWR_HOME/config.toml``, else the default one.
    """
    if args[:1] == [] or args[0] not in FLWR_SUPERLINK_COMMANDS:
        return None
    positional, skip = [], False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg in FLWR_RUN_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            positional.append(arg)
    config = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr")) / "config.toml"
    try:
        superlink = tomllib.loads(config.read_text())["superlink"]
        named = [name for name in positional if isinstance(superlink.get(name), dict)]
        connection = superlink[named[-1] if named else superlink["default"]]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return None  # flwr reports its own configuration errors
    return connection if isinstance(connection, dict) and "address" in connection else None


def flwr_connection(args: list[str]) -> tuple[str, str] | None:
    """``(address, root-certificates)`` of the connection ``flwr run`` uses, if it uses TLS."""
    connection = flwr_superlink(args) if args[:1] == ["run"] else None
    if connection is None or connection.get("insecure") or "root-certificates" not in connection:
        return None
    return connection["address"], connection["root-certificates"]


def wait_for_superlink(address: str, seconds: float) -> None:
    """Return once ``address`` (host:port) accepts a TCP connection; fail after ``seconds``."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                return
        except (OSError, ValueError) as err:
            if time.monotonic() >= deadline:
                reason = getattr(err, "strerror", None) or str(err)
                raise CheckFailed(
                    f"the SuperLink at {address} accepted no connection within {seconds:.0f} s "
                    f"({reason}): start the federation first (`compose up -d`) and see its "
                    f"log (`compose logs superlink`); {README}"
                ) from None
        time.sleep(0.5)


def check_writable(directory: str, why: str) -> None:
    path = Path(directory)
    if not path.is_dir():
        raise CheckFailed(f"{directory} ({why}) is not a folder: mount one there; {README}")
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise CheckFailed(
            f"{directory} ({why}) is not writable by uid {os.getuid()} ({err.strerror}): "
            f"on the host, `chown {os.getuid()}:{os.getgid()}` the folder mounted there; {README}"
        ) from None


def check(program: str, args: list[str]) -> None:
    """Run every check for ``program args``; raise :class:`CheckFailed` on the first failure."""
    values = option_values(args)
    for flag, kind in FILE_FLAGS.items():
        if flag in values:
            check_readable(flag, values[flag], kind)
    if "--root-certificates" in values and "--insecure" not in args:
        for flag in TARGET_FLAGS:
            if flag in values:
                check_server_certificate(values["--root-certificates"], values[flag])
    if Path(program).name == "flwr" and args[:1] == ["run"]:
        connection = flwr_connection(args)
        if connection is not None:
            address, ca_file = connection
            check_readable("root-certificates", ca_file, "certificate")
            check_server_certificate(ca_file, address)
    for directory in filter(None, os.environ.get("FEDX_WRITABLE_DIRS", "").split(":")):
        check_writable(directory, "written by this container")
    database = values.get("--database")
    if database and database != ":memory:":
        check_writable(str(Path(database).parent), "the SuperLink's database")


#: What says that a SuperExec runs ClientApps that share the machine's cores.
CLIENTAPP_VARIABLES = ("FEDX_SUPERNODES_PER_MACHINE", "FEDX_CLIENTAPP_THREADS")
SUPEREXECS = ("flower-superexec", "fedx-superexec")


def clientapp_threads(program: str) -> dict[str, str]:
    """The thread variables for a ClientApp SuperExec's share of the cores (none for others)."""
    if Path(program).name not in SUPEREXECS or not any(
        os.environ.get(name) for name in CLIENTAPP_VARIABLES
    ):
        return {}
    # pylint: disable=import-outside-toplevel
    from fedx.deploy.cores import ClientAppCores, thread_environment

    try:
        threads = ClientAppCores.resolve().threads
    except ValueError as err:
        raise CheckFailed(f"{err}; {README}") from None
    return thread_environment(threads)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: fedx-entrypoint PROGRAM [ARGS...]", file=sys.stderr)
        return 64
    program, args = argv[0], argv[1:]
    try:
        check(program, args)
        os.environ.update(clientapp_threads(program))
        if Path(program).name == "flwr" and (connection := flwr_superlink(args)) is not None:
            wait_for_superlink(
                connection["address"], float(os.environ.get("FEDX_SUPERLINK_WAIT", "120"))
            )
    except CheckFailed as err:
        print(f"fedx: {Path(program).name}: {err}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("FEDX_FAILURE_DELAY", "0")))
        return EX_CONFIG
    os.execvp(program, [program, *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
