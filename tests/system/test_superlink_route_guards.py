"""Every route of the SuperLink, without credentials and with wrong ones: fedx-superlink answers as Flower's.

``fedx-superlink`` runs Flower's SuperLink with seven of its nine HTTP
middleware scoped to the requests they act on
(:mod:`fedx.flower.superlink_middleware`): the Control API's on
``/v1/control/``, SuperNode authentication on ``/v1/fleet/``. This test
starts Flower's ``flower-superlink`` and ``fedx-superlink`` side by side,
with every guard on: TLS, SuperNode authentication, the Runtime API's
SuperExec authentication and Control API authentication (a plugin that
accepts one bearer token: ``tests/support/control_auth``, where Flower looks for its
Enterprise plugins). Every route of the SuperLink's app (Fleet, Control,
Runtime, health, the API docs), and paths that play with the prefixes the
scopes test (a double slash, a trailing one, percent-encoding, dot segments,
other case), is sent without credentials and with wrong ones (a bearer token
the plugin refuses, a SuperNode signature by a key never registered, a
SuperExec signature with another secret): both SuperLinks must give the same
status and the same body, every time. The table of answers is printed
(``pytest -s``).
"""

import http.client
import os
import secrets
import ssl
import subprocess
from base64 import b64encode
from collections import Counter
from pathlib import Path

import psutil
import pytest

from fedx.deploy.credentials import write_tls_certificates
from fedx.deploy.local import free_port, stop_processes, wait_for_port
from tests.support.control_auth.sitecustomize import TOKEN
from tests.support.helpers import BIN

CONTROL_AUTH = Path(__file__).parents[1] / "support" / "control_auth"
PROGRAMS = ("flower-superlink", "fedx-superlink")


@pytest.fixture(scope="module")
def superlinks(tmp_path_factory):
    """Both SuperLinks with every guard on: program -> (port, CA file)."""
    base = tmp_path_factory.mktemp("route-guards")
    tls = write_tls_certificates(base / "certificates", ["localhost", "127.0.0.1"])
    secret = base / "superexec.secret"
    secret.write_bytes(secrets.token_bytes(32))
    secret.chmod(0o600)
    env = {
        **os.environ,
        "FLWR_OIDC_ENABLED": "1",  # Control API authentication, through the plugin of tests/support/control_auth
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(CONTROL_AUTH), os.environ.get("PYTHONPATH")])
        ),
    }
    started: dict[str, tuple[int, subprocess.Popen]] = {}
    try:
        for program in PROGRAMS:
            port = free_port()
            command = [
                str(BIN / program),
                "--ssl-certfile", str(tls.server_cert),
                "--ssl-keyfile", str(tls.server_key),
                "--ssl-ca-certfile", str(tls.ca_cert),
                "--enable-supernode-auth",
                "--superexec-auth-secret-file", str(secret),
                "--isolation", "process",  # no SuperExec of its own
                "--host", "127.0.0.1",
                "--port", str(port),
            ]  # fmt: skip
            with open(base / f"{program}.log", "w", encoding="utf-8") as log:
                process = subprocess.Popen(  # pylint: disable=consider-using-with
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            started[program] = (port, process)
        for program, (port, process) in started.items():
            try:
                wait_for_port("127.0.0.1", port, 180)
            except TimeoutError:
                log = (base / f"{program}.log").read_text(errors="replace")
                pytest.fail(f"{program} did not start (exit {process.poll()}):\n{log[-3000:]}")
        yield {program: (port, tls.ca_cert) for program, (port, _) in started.items()}
    finally:
        handles = []
        for _, process in started.values():
            try:
                handles.append(psutil.Process(process.pid))
            except psutil.Error:
                pass
        stop_processes(handles, 15, groups=True)
        for _, process in started.values():
            process.wait(timeout=30)


def routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the SuperLink's app, as Flower builds it."""
    # pylint: disable=import-outside-toplevel
    from fastapi.routing import iter_route_contexts
    from flwr.superlink.main import create_app

    found = []
    for context in iter_route_contexts(create_app().routes):
        methods = sorted(set(context.methods or []) - {"HEAD"})
        found += [(method, context.path) for method in methods]
    return found


def odd_paths() -> list[tuple[str, str]]:
    """Paths that play with the prefixes the scoped middleware tests."""
    paths = []
    for path in ("/v1/control/list-runs", "/v1/fleet/get-run", "/v1/runtime/get-nodes"):
        api = path.split("/")[2]
        paths += [
            f"/{path}",  # //v1/...
            f"{path}/",
            path.replace(f"/{api}/", f"/{api.upper()}/"),
            path.replace(f"/{api}/", f"/%{ord(api[0]):02x}{api[1:]}/"),  # percent-encoded
            path.replace(f"/{api}/", "/control/../fleet/"),
            path.replace(f"/{api}/", "/fleet/../control/"),
            path.replace(f"/{api}/", f"/{api}"),  # /v1/controllist-runs
        ]
    return [("POST", path) for path in [*paths, "/v1/control", "/v1/fleet", "/health/"]]


def wrong_credentials() -> dict[str, str]:
    """Every kind of credential, each wrong: a bearer token the plugin refuses, a SuperNode
    signature by a key never registered, a SuperExec signature made with another secret."""
    # pylint: disable=import-outside-toplevel
    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.proto.run_pb2 import GetRunRequest  # pylint: disable=no-name-in-module
    from flwr.supercore.auth.superexec import create_superexec_auth_metadata
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import (
        generate_key_pairs,
        public_key_to_bytes,
        sign_message,
    )

    private, public = generate_key_pairs()
    timestamp = now().isoformat()
    return {
        "authorization": f"Bearer not-{TOKEN}",
        FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(public_key_to_bytes(public)).decode(),
        FLEET_HTTP_SIGNATURE_HEADER: b64encode(sign_message(private, timestamp.encode())).decode(),
        TIMESTAMP_HEADER: timestamp,
        **create_superexec_auth_metadata(
            auth_secret=secrets.token_bytes(32), method="wrong", request=GetRunRequest()
        ),
    }


def ask(port: int, ca_cert: Path, method: str, path: str, headers: dict) -> tuple[int, bytes]:
    """One request as typed (http.client sends the path untouched); its status and body."""
    context = ssl.create_default_context(cafile=str(ca_cert))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    try:
        body = b"" if method == "POST" else None
        connection.request(
            method, path, body=body, headers={"content-type": "application/protobuf", **headers}
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def api(path: str) -> str:
    for name in ("control", "fleet", "runtime", "health"):
        if path.startswith((f"/v1/{name}/", f"/{name}")):
            return name
    return "other"


def test_every_route_answers_the_same_through_flowers_superlink_and_fedxs(superlinks):
    cases = {"no credentials": {}, "wrong credentials": wrong_credentials()}
    requests = [*routes(), *odd_paths()]
    assert len(requests) > 80 and {api(p) for _, p in requests} >= {"control", "fleet", "runtime"}
    table: dict[tuple[str, str, str], Counter] = {}
    differ = []
    for case, headers in cases.items():
        for method, path in requests:
            answers = {
                program: ask(port, ca, method, path, headers)
                for program, (port, ca) in superlinks.items()
            }
            if len(set(answers.values())) != 1:
                differ.append(f"{case} {method} {path}: {answers}")
            for program, (status, _) in answers.items():
                table.setdefault((case, api(path), program), Counter())[status] += 1
    print()
    for (case, group, program), statuses in sorted(table.items()):
        print(f"{case:18} {group:8} {program:17} {dict(sorted(statuses.items()))}")
    assert differ == [], "\n".join(differ[:20])
    # The guards are on: nothing of the Fleet, Control or Runtime APIs is done without a
    # credential that the SuperLink accepts (the Control API's login routes aside).
    for (case, group, _), statuses in table.items():
        if group in ("fleet", "runtime"):
            assert not [s for s in statuses if 200 <= s < 300], (case, group, statuses)


def test_the_control_token_is_accepted_by_both(superlinks):
    """Control authentication is really on: the plugin's token lists the runs, in both."""
    for port, ca in superlinks.values():
        refused, _ = ask(port, ca, "POST", "/v1/control/list-runs", {})
        accepted, _ = ask(
            port, ca, "POST", "/v1/control/list-runs", {"authorization": f"Bearer {TOKEN}"}
        )
        assert refused == 401 and accepted == 200, (refused, accepted)
