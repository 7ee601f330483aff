"""fedx on real Flower 1.41 processes: a SuperLink and 3 SuperNodes on 127.0.0.1.

The federation starts once for the module on free ports with its own state
directory and FLWR_HOME, as fedx-deploy starts it, and is stopped (with
every process it started) at the end. It is fedx's fast setup with every
safeguard on: fedx-superlink (whose scoped middleware must still
authenticate), fedx-supernode with a short idle poll, and the warm ClientApp
executor (fedx-superexec); TLS on every link, SuperNode authentication and
SuperExec authentication. The fedx app runs FedMR on it, its ClientApps
forked from the warm interpreters, and writes metrics.json and checkpoints;
unregistered and plain-text SuperNodes are refused; the numpy test app
(tests/wire_app) sends bad replies at the wire, and its ServerApp crashes
after a round and resumes.

A SuperNode killed mid-round (Flower's own SuperLink and executor):
tests/system/test_deployment_faults.py. The warm executor's own rules:
tests/unit/test_warm_executor.py.
"""

import json
import re
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from fedx.deploy import superexec
from fedx.deploy.credentials import (
    supernode_key_paths,
    write_supernode_keys,
    write_tls_certificates,
)
from fedx.deploy.local import free_port
from tests.support.deployment import (
    WIRE_APP,
    flwr_submit,
    run_app,
    running,
    spec_on_free_ports,
    wait_for,
)

pytestmark = pytest.mark.cost(3)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """TLS + SuperNode authentication (keys 1-3 registered, key 4 never) + SuperExec authentication;
    fedx-superlink, fedx-supernode (0.5 s idle polls) and the warm executor, every interpreter ready."""
    base = tmp_path_factory.mktemp("secure")
    tls = write_tls_certificates(base / "certificates", ["localhost", "127.0.0.1"])
    write_supernode_keys(base / "keys", 4)
    spec = spec_on_free_ports(
        3,
        base / "state",
        tls=tls,
        auth_keys=base / "keys",
        executor="warm",
        poll_interval=0.5,
        superlink="fedx",
    )
    with running(spec) as federation:
        for index in range(3):
            federation.wait_for_warm_executor(index, timeout=300)
        yield federation


# ----------------------------------------------------------------------
# TLS and SuperNode authentication
# ----------------------------------------------------------------------


def test_fedmr_over_tls_with_authentication_on_warm_executors_writes_metrics(secure, app, tmp_path):
    spec = secure.spec
    assert "--superexec-auth-secret-file" in spec.supernode_command(0)
    assert Path(spec.supernode_command(0)[0]).name == "fedx-supernode"
    assert Path(spec.superlink_command()[0]).name == "fedx-superlink"
    logs = [spec.log_dir / f"supernode-{index}.log" for index in range(3)]
    before = [len(log.read_text(errors="replace")) for log in logs]  # this run's lines only
    output = run_app(
        secure,
        app,
        "num-server-rounds=2 local-epochs=1 min-available-nodes=3 deterministic=true "
        f'run-name="tls" output-dir="{tmp_path}"',
        timeout=480,
    )
    directory = tmp_path / "tls"
    assert (directory / "metrics.json").exists(), output[-4000:]
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics["config"]["strategy"] == "fedmr"
    rounds = {row["round"]: row for row in metrics["rounds"]}
    assert sorted(rounds) == [0, 1, 2]
    assert all(rounds[r]["trained-slots"] == 3 for r in (1, 2))
    assert all(0.0 <= rounds[r]["accuracy"] <= 1.0 for r in (0, 1, 2))
    assert all(rounds[r]["checkpoint-seconds"] < 5.0 for r in (1, 2))
    assert metrics["final"]["round"] == 2
    checkpoint = json.loads((directory / "checkpoint.json").read_text())
    assert (checkpoint["round"], checkpoint["strategy"]) == (2, "FedMR")
    assert (directory / checkpoint["arrays-file"]).stat().st_size > 10_000
    assert "3 nodes get 3 different pool models (K=3)" in output
    # Every model crossed packed, one array per model (fedx.strategy_core.packing).
    assert "3 nodes connected (3 identified, 3 read packed models)" in output
    assert re.search(r"models went packed in [1-9]\d* messages, standard in 0\b", output)
    # Every ClientApp was forked from its SuperNode's warm interpreter.
    for index, (log, offset) in enumerate(zip(logs, before, strict=True)):
        whole = log.read_text(errors="replace")
        this_run = whole[offset:]
        received = this_run.count("Receiving: ")
        forked = this_run.count("forked from the warm interpreter")
        assert received >= 2 and forked == received, (index, received, forked)  # 2 rounds (+ query)
        warm_pid = secure.wait_for_warm_executor(index)
        assert f"warm ClientApp interpreter (pid {warm_pid}) ready" in whole
        # ...having imported what fedx's ClientApp imports on its first training message.
        preloaded = ", ".join([*superexec.DEFAULT_PRELOAD, "fedx.client_app"])
        assert f"imported: {preloaded}" in whole
        # The run's FAB holds the installed fedx: once it is installed (by a node's first
        # task), the tasks keep the warm interpreter's modules instead of importing them.
        kept = this_run.count("(the FAB's code is the warm one's)")
        assert kept >= forked - 1, (index, kept, forked)
        # Every forked task trained with the deterministic kernels the run config asked for.
        deterministic = this_run.count("fedx: deterministic kernels in this process")
        assert deterministic == received - this_run.count("Receiving: query"), (
            index,
            deterministic,
        )
        assert "Traceback" not in this_run, this_run[-3000:]
        # The SuperNode's Runtime API, where the tasks' tokens travel, speaks TLS only.
        context = ssl.create_default_context(cafile=str(spec.tls.ca_cert))
        with socket.create_connection(
            ("127.0.0.1", spec.supernode_ports[index]), timeout=10
        ) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_the_superlink_speaks_tls_only(secure):
    spec = secure.spec
    context = ssl.create_default_context(cafile=str(spec.tls.ca_cert))
    with socket.create_connection((spec.host, spec.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # A client that does not know our CA refuses the certificate.
    with socket.create_connection((spec.host, spec.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")


def test_unregistered_and_plain_text_supernodes_are_refused(secure):
    spec = secure.spec
    # Registering again (fedx-deploy up on the same database) is harmless.
    assert secure.register_supernode(0) is None
    base = spec.supernode_command(0)
    key_at = base.index("--auth-supernode-private-key")
    unregistered_key, _ = supernode_key_paths(spec.auth_keys, 4)

    def variant(command: list[str]) -> list[str]:
        port = command.index("--port")
        return [*command[: port + 1], str(free_port()), *command[port + 2 :]]

    attempts = {
        "unregistered-key": variant(
            [*base[: key_at + 1], str(unregistered_key), *base[key_at + 2 :]]
        ),
        "no-key": variant([*base[:key_at], *base[key_at + 2 :]]),
        # No TLS on the SuperNode's side (and no key, which needs TLS): the
        # SuperLink only speaks HTTPS, so it never gets in.
        "plain-text": variant(
            [
                "--insecure" if a == "--root-certificates" else a
                for a in [*base[:key_at], *base[key_at + 2 :]]
                if a != str(spec.tls.ca_cert)
            ]
            + ["--max-retries", "2"]
        ),
    }
    logs = {name: spec.log_dir / f"refused-{name}.log" for name in attempts}
    processes = {}
    try:
        for name, command in attempts.items():
            with open(logs[name], "w", encoding="utf-8") as log:
                processes[name] = subprocess.Popen(  # pylint: disable=consider-using-with
                    command,
                    env=spec.environment(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        codes = {name: process.wait(timeout=180) for name, process in processes.items()}
    finally:
        for process in processes.values():
            try:
                process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = {name: log.read_text(errors="replace") for name, log in logs.items()}
    assert all(code != 0 for code in codes.values()), codes
    assert "Failed to activate SuperNode" in text["unregistered-key"], text["unregistered-key"][
        -2000:
    ]
    assert "All SuperNodes must be registered" in text["no-key"], text["no-key"][-2000:]
    assert all("SuperNode ID:" not in log for log in text.values())


# ----------------------------------------------------------------------
# Bad replies, a crashed ServerApp, a killed SuperNode
# ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def wire_reference(secure, tmp_path_factory):
    """FedMR for 2 rounds with misbehaving ClientApps, checkpointing, never interrupted."""
    base = tmp_path_factory.mktemp("wire-reference")
    output = run_app(
        secure,
        WIRE_APP,
        f'misbehave="wire" num-server-rounds=2 checkpoint-dir="{base / "checkpoints"}" '
        f'result-file="{base / "result.json"}"',
    )
    assert (base / "result.json").exists(), output[-4000:]
    return output, json.loads((base / "result.json").read_text())["strategies"]["fedmr"]


def test_bad_replies_at_the_wire_are_dropped_and_the_run_goes_on(secure, wire_reference):
    output, result = wire_reference
    first, second = secure.node_id(1), secure.node_id(2)  # partitions 1 and 2 misbehave
    assert f"Round 1: dropped the reply of node {first} (slot " in output
    assert "'weight': shape (7, 3), expected (6, 3)" in output
    assert f"Round 1: dropped the reply of node {second} (slot " in output
    assert "bias: contains NaN or Inf" in output
    assert f"Round 2: dropped the reply of node {first} (slot " in output
    assert "expected one MetricRecord with a positive 'num-examples', got None" in output
    assert result["rounds"] == [1, 2]
    assert result["trained-slots"] == {"1": 1, "2": 2}
    assert len(result["pool"]) == 3


def test_a_crashed_serverapp_resumes_to_the_same_final_pool(secure, wire_reference, tmp_path):
    _, reference = wire_reference
    settings = f'misbehave="wire" num-server-rounds=2 checkpoint-dir="{tmp_path / "checkpoints"}"'
    flwr_submit(
        secure,
        WIRE_APP,
        f'{settings} crash-after-round=1 result-file="{tmp_path / "crashed.json"}"',
    )
    checkpoint = tmp_path / "checkpoints" / "fedmr" / "checkpoint.json"
    wait_for(checkpoint.exists, 300, "the checkpoint of round 1")
    time.sleep(2.0)  # the ServerApp exits right after writing it
    assert json.loads(checkpoint.read_text())["round"] == 1
    assert not (tmp_path / "crashed.json").exists(), "the crashed run must not have finished"

    output = run_app(
        secure, WIRE_APP, f'{settings} resume=true result-file="{tmp_path / "resumed.json"}"'
    )
    assert (tmp_path / "resumed.json").exists(), output[-4000:]
    resumed = json.loads((tmp_path / "resumed.json").read_text())["strategies"]["fedmr"]
    assert "Resuming after round 1" in output
    assert "[ROUND 1/2]" not in output and "[ROUND 2/2]" in output
    assert resumed["pool"] == reference["pool"]
    assert resumed["global-model"] == reference["global-model"]
    assert resumed["train-loss"] == reference["train-loss"]
    assert json.loads(checkpoint.read_text())["round"] == 2
