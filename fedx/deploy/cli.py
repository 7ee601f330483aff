"""``fedx-deploy`` (``python -m fedx.deploy``): certificates, keys, a local federation.

Examples
--------
Certificates for TLS and keys for SuperNode authentication::

    fedx-deploy certs --out certificates
    fedx-deploy keys --out keys --supernodes 3

A SuperLink and three SuperNodes with TLS and authentication; Ctrl-C (SIGINT,
even under ``nohup ... &``), SIGTERM or SIGHUP (unless ``nohup`` ignores it)
stops them, at any time, with every process they started
(:mod:`fedx.deploy.signals`)::

    fedx-deploy up --supernodes 3 --certificates certificates --auth-keys keys

The same with fedx's warm ClientApp executor (``fedx-superexec``: each
SuperNode imports the ClientApp once and forks it per message)::

    fedx-deploy up --supernodes 3 --certificates certificates --auth-keys keys --executor warm

The same, running the app once against them and stopping afterwards::

    fedx-deploy up --supernodes 3 --certificates certificates --run . \\
        --run-config 'num-server-rounds=5'

The SuperNodes share this machine's cores: each one's ClientApps get
``cores / N`` torch threads (at least 1), the ServerApp all of them;
``--clientapp-threads`` (else ``FEDX_CLIENTAPP_THREADS``) and
``--serverapp-threads`` (else ``FEDX_SERVERAPP_THREADS``) set them
(:mod:`fedx.deploy.cores`).
"""

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from fedx.deploy.credentials import (
    DEFAULT_HOSTS,
    TlsFiles,
    write_supernode_keys,
    write_tls_certificates,
)
from fedx.deploy.local import LocalFederation
from fedx.deploy.signals import StopRequested, stop_on_signals
from fedx.deploy.spec import DEFAULT_HOST, DEFAULT_PORT, FIRST_SUPERNODE_PORT, FederationSpec
from fedx.flower import IDLE_AFTER, SUPERNODE_IDLE_WAIT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedx-deploy", description="Run fedx on real Flower processes."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    certs = commands.add_parser("certs", help="write a local CA and a server certificate")
    certs.add_argument("--out", type=Path, default=Path("certificates"))
    certs.add_argument(
        "--host",
        action="append",
        dest="hosts",
        help=f"a name or IP the SuperLink is reached by (repeatable; default: {', '.join(DEFAULT_HOSTS)})",
    )

    keys = commands.add_parser("keys", help="write SuperNode authentication key pairs")
    keys.add_argument("--out", type=Path, default=Path("keys"))
    keys.add_argument("--supernodes", type=int, default=3)

    up = commands.add_parser("up", help="start a SuperLink and N SuperNodes on this machine")
    up.add_argument("--supernodes", type=int, default=3, help="N (default: %(default)s)")
    up.add_argument("--host", default=DEFAULT_HOST, help="SuperLink address (default: %(default)s)")
    up.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="SuperLink HTTP(S) port (default: %(default)s)",
    )
    up.add_argument(
        "--supernode-port",
        type=int,
        default=FIRST_SUPERNODE_PORT,
        help="Runtime API port of SuperNode 0; SuperNode i uses this + i (default: %(default)s)",
    )
    security = up.add_mutually_exclusive_group(required=True)
    security.add_argument(
        "--certificates", type=Path, help="directory written by `fedx-deploy certs`: TLS on"
    )
    security.add_argument("--insecure", action="store_true", help="plain text, no TLS")
    up.add_argument(
        "--auth-keys",
        type=Path,
        help="directory written by `fedx-deploy keys`: SuperNode authentication on (needs TLS)",
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".fedx-deploy"),
        help="logs, SuperLink database and FLWR_HOME (default: .fedx-deploy)",
    )
    up.add_argument(
        "--install-app-dependencies",
        action="store_true",
        help="let the SuperLink install each app's dependencies with uv (Flower's default)",
    )
    up.add_argument(
        "--executor",
        choices=("flower", "warm"),
        default="flower",
        help="how SuperNodes run ClientApps: a new process per message (flower, the default) "
        "or forked from a warm interpreter that imported the app once (warm, fedx-superexec)",
    )
    up.add_argument(
        "--poll-interval",
        type=float,
        metavar="SECONDS",
        help="idle poll of the SuperNodes (Flower: 3 s) and of their SuperExecs (Flower: 1 s) "
        "after a message; default: Flower's",
    )
    up.add_argument(
        "--idle-after",
        type=float,
        default=IDLE_AFTER,
        metavar="SECONDS",
        help="with --poll-interval: how long after its last message a SuperNode (after its last "
        "task, a SuperExec) keeps polling that often; then its waits grow up to "
        "--max-poll-interval (a SuperExec's to Flower's 1 s), so that an idle federation costs "
        "little (default: %(default)g; inf: never)",
    )
    up.add_argument(
        "--max-poll-interval",
        type=float,
        default=SUPERNODE_IDLE_WAIT,
        metavar="SECONDS",
        help="with --poll-interval: the longest idle wait of a SuperNode (default: Flower's "
        "%(default)g s)",
    )
    up.add_argument(
        "--superlink-database",
        choices=("file", "memory"),
        default="file",
        help="file: STATE_DIR/superlink.db, kept across SuperLink restarts (the default); "
        "memory: Flower's default, nothing kept, but each object of a message costs the "
        "SuperLink ~0.1 ms instead of ~20 ms",
    )
    up.add_argument(
        "--superlink",
        choices=("flower", "fedx"),
        default="flower",
        help="flower: flower-superlink as shipped (the default); fedx: fedx-superlink, the "
        "same SuperLink whose HTTP middleware runs only on the requests it acts on, for less "
        "CPU time per request (a model is one request per array)",
    )
    up.add_argument(
        "--objects-in-flight",
        type=int,
        metavar="N",
        help="objects of a message each SuperNode pulls or pushes at once (Flower: 2): for "
        "SuperNodes at distant sites, where each object costs a round trip",
    )
    up.add_argument(
        "--clientapp-threads",
        type=int,
        metavar="N",
        help="torch threads of each SuperNode's ClientApps (default: $FEDX_CLIENTAPP_THREADS, "
        "else this machine's cores divided by the SuperNodes, at least 1)",
    )
    up.add_argument(
        "--serverapp-threads",
        type=int,
        metavar="N",
        help="torch threads of the ServerApp (default: $FEDX_SERVERAPP_THREADS, else every core)",
    )
    up.add_argument("--run", metavar="APP", help="run this app with `flwr run`, then stop")
    up.add_argument("--run-config", help="passed to `flwr run --run-config`")
    return parser


def _spec(args: argparse.Namespace) -> FederationSpec:
    return FederationSpec(
        num_supernodes=args.supernodes,
        state_dir=args.state_dir.resolve(),
        host=args.host,
        port=args.port,
        supernode_ports=[args.supernode_port + i for i in range(args.supernodes)],
        tls=TlsFiles.in_directory(args.certificates.resolve()) if args.certificates else None,
        insecure=args.insecure,
        auth_keys=args.auth_keys.resolve() if args.auth_keys else None,
        install_app_dependencies=args.install_app_dependencies,
        workdir=Path.cwd(),  # the ServerApp writes outputs/ here
        executor=args.executor,
        poll_interval=args.poll_interval,
        idle_after=args.idle_after,
        max_poll_interval=args.max_poll_interval,
        superlink_database=args.superlink_database,
        superlink=args.superlink,
        objects_in_flight=args.objects_in_flight,
        clientapp_threads=args.clientapp_threads,
        serverapp_threads=args.serverapp_threads,
    )


def _up(args: argparse.Namespace) -> int:
    spec = _spec(args)
    with LocalFederation(spec) as federation:  # stops what it started, however the block ends
        federation.start()
        node_ids = [federation.node_id(i) for i in range(spec.num_supernodes)]
        if spec.executor == "warm":  # its first task would wait for the app's imports
            for index in range(spec.num_supernodes):
                federation.wait_for_warm_executor(index)
        print(
            f"SuperLink on {spec.control_address} ({'TLS' if spec.tls else 'insecure'}"
            f"{', SuperNode authentication' if spec.auth_keys else ''}"
            f"{', warm ClientApp executor' if spec.executor == 'warm' else ''}); "
            f"SuperNodes {node_ids}, {spec.clientapp_threads} torch thread(s) per ClientApp, "
            f"{spec.serverapp_threads} for the ServerApp; logs in {spec.log_dir}"
        )
        if args.run:
            command = [str(spec.bin_dir / "flwr"), "run", args.run, spec.connection, "--stream"]
            if args.run_config:
                command += ["--run-config", args.run_config]
            return subprocess.run(command, env=federation.environment(), check=False).returncode
        print("Run an app against it from another shell:")
        print(
            f"  FLWR_HOME={shlex.quote(str(spec.flwr_home))} flwr run . {spec.connection} --stream"
        )
        print("Ctrl-C (or SIGTERM, SIGHUP) stops everything.", flush=True)
        while not (ended := federation.ended()):
            time.sleep(1.0)
        print(f"{', '.join(ended)} ended; see {spec.log_dir}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedx-deploy``."""
    args = _parser().parse_args(argv)
    if args.command == "certs":
        files = write_tls_certificates(args.out, args.hosts)
        print(f"CA {files.ca_cert}, server certificate {files.server_cert}, key {files.server_key}")
        return 0
    if args.command == "keys":
        for private, public in write_supernode_keys(args.out, args.supernodes):
            print(f"{private} (SuperNode) / {public} (flwr supernode register)")
        return 0
    # Before anything starts: a signal at any time stops what was started (and nothing is left).
    with stop_on_signals():
        try:
            return _up(args)
        except StopRequested as stop:
            print(f"fedx-deploy: {stop}; everything it started is stopped", file=sys.stderr)
            return 0
        except (FileNotFoundError, ValueError, RuntimeError, TimeoutError) as err:
            print(f"fedx-deploy: {err}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
