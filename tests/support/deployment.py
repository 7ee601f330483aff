"""Helpers of the deployment tests: federations of real processes on 127.0.0.1."""

import json
import re
import shlex
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from fedx.deploy.cli import main as deploy_main
from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from tests.support.helpers import REPO, flwr_run, flwr_run_command

WIRE_APP = REPO / "tests" / "wire_app"


def spec_on_free_ports(num_supernodes: int, state_dir: Path, **kwargs) -> FederationSpec:
    """A federation whose SuperLink and SuperNodes listen on free 127.0.0.1 ports."""
    return FederationSpec(
        num_supernodes=num_supernodes,
        state_dir=state_dir,
        host="127.0.0.1",
        port=free_port(),
        supernode_ports=[free_port() for _ in range(num_supernodes)],
        **kwargs,
    )


@contextmanager
def running(spec: FederationSpec, timeout: float = 180):
    """The federation of ``spec``, started, every SuperNode connected; stopped at the end."""
    with LocalFederation(spec) as federation:
        federation.start()
        for index in range(spec.num_supernodes):
            federation.node_id(index, timeout=timeout)
        yield federation


def run_app(federation: LocalFederation, app: Path, run_config: str, timeout: float = 300) -> str:
    """``flwr run --stream`` of ``app`` on ``federation`` to the end; everything it printed."""
    spec = federation.spec
    return flwr_run(
        spec.environment(), app, run_config, spec.connection, timeout=timeout, bin_dir=spec.bin_dir
    )


def start_flwr_run(
    federation: LocalFederation, app: Path, run_config: str, log: Path
) -> subprocess.Popen:
    """``flwr run --stream`` of ``app`` on ``federation``, not waited for; its output goes to ``log``.

    It runs in a session of its own, so that ``os.killpg`` ends it with
    whatever it started.
    """
    spec = federation.spec
    with open(log, "w", encoding="utf-8") as out:
        return subprocess.Popen(  # pylint: disable=consider-using-with
            flwr_run_command(app, run_config, spec.connection, bin_dir=spec.bin_dir),
            env=spec.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def flwr_submit(federation: LocalFederation, app: Path, run_config: str) -> int:
    """``flwr run`` without waiting; returns the run id."""
    done = federation.flwr(
        "run",
        str(app),
        federation.spec.connection,
        "--format",
        "json",
        "--run-config",
        run_config,
        timeout=120,
    )
    try:
        return int(json.loads(done.stdout)["run-id"])
    except (ValueError, KeyError) as err:
        raise AssertionError(f"flwr run failed: {done.stdout}{done.stderr}") from err


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def count_in_log(federation: LocalFederation, name: str, pattern: str) -> int:
    """How often ``pattern`` occurs in ``logs/<name>.log``."""
    log = federation.spec.log_dir / f"{name}.log"
    return len(re.findall(pattern, log.read_text(errors="replace"))) if log.exists() else 0


def deploy_up_faked(monkeypatch, workdir: Path, arguments: str) -> tuple[int, dict]:
    """``fedx-deploy up ARGUMENTS`` (as typed in a shell) in ``workdir``, with the federation
    and ``flwr run`` faked.

    Returns the exit code and what the fakes saw: the ``spec``, whether the
    federation was ``started`` and ``stopped``, the ``flwr run`` ``command``
    and ``env``, and the SuperNodes whose ``warm`` executor was awaited.
    """
    seen: dict = {}

    class FakeFederation:
        def __init__(self, spec):
            seen["spec"] = spec
            self.supernodes, self.superlink = {}, None

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            seen["stopped"] = True

        def start(self):
            seen["started"] = True

        def node_id(self, index):
            return 100 + index

        def wait_for_warm_executor(self, index):
            seen.setdefault("warm", []).append(index)

        def environment(self):
            return seen["spec"].environment()

    def fake_run(command, env, check):
        seen["command"], seen["env"] = command, env
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr("fedx.deploy.cli.LocalFederation", FakeFederation)
    monkeypatch.setattr("fedx.deploy.cli.subprocess.run", fake_run)
    monkeypatch.chdir(workdir)
    return deploy_main(["up", *shlex.split(arguments)]), seen
