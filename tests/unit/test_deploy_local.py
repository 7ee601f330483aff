"""A local federation's processes: the share of the cores each gets, and stopping them.

Stopping: a process and every process below it.
"""

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fedx.deploy import cores
from fedx.deploy.processes import (  # pylint: disable=protected-access
    _alive,
    _descendants,
    stop_processes,
)
from fedx.deploy.spec import FederationSpec
from tests.support.deployment import deploy_up_faked

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@pytest.fixture
def eight_cores(monkeypatch):
    """A machine of 8 usable cores, with no thread settings in the environment."""
    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    for name in (
        "FEDX_CLIENTAPP_THREADS",
        "FEDX_SERVERAPP_THREADS",
        "FEDX_SUPERNODES_PER_MACHINE",
        *THREAD_VARIABLES,
    ):
        monkeypatch.delenv(name, raising=False)


def test_supernodes_share_the_cores_and_the_serverapp_has_them_all(eight_cores, tmp_path):
    spec = FederationSpec(3, tmp_path, insecure=True, executor="warm")
    assert (spec.clientapp_threads, spec.serverapp_threads) == (2, 8)  # 8 // 3, and all
    node = spec.supernode_environment()
    assert all(node[name] == "2" for name in THREAD_VARIABLES)
    # fedx-superexec gets the count, and how many SuperNodes share the machine (its task limit).
    assert node["FEDX_CLIENTAPP_THREADS"] == "2" and node["FEDX_SUPERNODES_PER_MACHINE"] == "3"
    assert all(spec.superlink_environment()[name] == "8" for name in THREAD_VARIABLES)
    # More SuperNodes than cores: one thread each, never none.
    assert FederationSpec(12, tmp_path, insecure=True).clientapp_threads == 1
    assert FederationSpec(1, tmp_path, insecure=True).clientapp_threads == 8  # alone: all
    # A simulation's threads are its client resources: no thread variables of ours.
    simulation = FederationSpec(0, tmp_path, insecure=True, simulation=True)
    assert not set(THREAD_VARIABLES) & set(simulation.superlink_environment())


def test_the_option_comes_before_the_environment_before_the_share(
    eight_cores, tmp_path, monkeypatch
):
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "3")
    monkeypatch.setenv("FEDX_SERVERAPP_THREADS", "5")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # a user's own setting is replaced
    spec = FederationSpec(3, tmp_path, insecure=True)
    assert (spec.clientapp_threads, spec.serverapp_threads) == (3, 5)
    assert spec.supernode_environment()["OMP_NUM_THREADS"] == "3"
    given = FederationSpec(3, tmp_path, insecure=True, clientapp_threads=1, serverapp_threads=2)
    assert (given.clientapp_threads, given.serverapp_threads) == (1, 2)
    with pytest.raises(ValueError, match="clientapp threads must be"):
        FederationSpec(3, tmp_path, insecure=True, clientapp_threads=0)
    monkeypatch.setenv("FEDX_CLIENTAPP_THREADS", "0")
    with pytest.raises(ValueError, match="FEDX_CLIENTAPP_THREADS must be"):
        FederationSpec(3, tmp_path, insecure=True)


def test_deploy_up_gives_the_threads_it_was_told_or_the_share(
    eight_cores, tmp_path, monkeypatch, capsys
):
    code, started = deploy_up_faked(monkeypatch, tmp_path, "--insecure --supernodes 3 --run app")
    assert code == 0 and started["spec"].clientapp_threads == 2
    assert started["spec"].serverapp_threads == 8
    assert "2 torch thread(s) per ClientApp, 8 for the ServerApp" in capsys.readouterr().out
    code, started = deploy_up_faked(
        monkeypatch,
        tmp_path,
        "--insecure --supernodes 3 --clientapp-threads 4 --serverapp-threads 1 --run app",
    )
    assert code == 0
    assert (started["spec"].clientapp_threads, started["spec"].serverapp_threads) == (4, 1)
    code, _ = deploy_up_faked(monkeypatch, tmp_path, "--insecure --clientapp-threads 0 --run app")
    assert code == 1 and "clientapp threads must be" in capsys.readouterr().err


def test_torch_in_a_new_clientapp_process_uses_the_supernodes_share(tmp_path):
    # Flower's executor starts a new flwr-clientapp per message, with the SuperNode's
    # environment: torch reads the variables as it loads (its default: one per core;
    # it takes no more than the machine's cores from them).
    spec = FederationSpec(2, tmp_path, insecure=True, clientapp_threads=1)
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=spec.supernode_environment(),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert done.stdout.strip() == "1"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_usable_cores_are_capped_by_the_cgroup_quota(tmp_path, monkeypatch):
    # cgroup v2: this process's cgroup and its parents; the tightest quota counts.
    write(tmp_path / "v2" / "cgroup", "0::/machine/app\n")
    write(tmp_path / "v2" / "fs" / "machine" / "cpu.max", "250000 100000\n")
    write(tmp_path / "v2" / "fs" / "machine" / "app" / "cpu.max", "max 100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "v2" / "fs", tmp_path / "v2" / "cgroup") == 2.5
    # cgroup v1 as a container mounts it; no quota is -1.
    write(tmp_path / "v1" / "cgroup", "5:cpu,cpuacct:/\n4:memory:/\n")
    write(tmp_path / "v1" / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "50000\n")
    write(tmp_path / "v1" / "fs" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "v1" / "fs", tmp_path / "v1" / "cgroup") == 0.5
    write(tmp_path / "v1" / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    assert cores.cgroup_cpu_limit(tmp_path / "v1" / "fs", tmp_path / "v1" / "cgroup") is None
    assert cores.cgroup_cpu_limit(tmp_path, tmp_path / "missing") is None
    # 2.5 CPUs of quota on 8 cores in reach: 3 threads (rounded up, as Go and Java do).
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: 2.5)
    assert cores.usable_cores() == 3
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: None)
    assert cores.usable_cores() == 8


SLEEPER = "import time; time.sleep(120)"


def test_a_stopped_process_takes_its_children_along_even_in_sessions_of_their_own():
    # Like the SuperLink, whose SuperExec runs in a session of its own.
    code = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True); "
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
        "print('started', flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout.readline().strip() == "started"
        children = _descendants(parent.pid)
        assert len(children) == 2 and all(_alive(pid) for pid in children)
    finally:
        stop_processes([psutil.Process(parent.pid)], signal.SIGTERM, groups=True)
        parent.wait(timeout=5)
        parent.stdout.close()
    assert parent.poll() is not None
    assert not any(_alive(pid) for pid in children)
    assert _descendants(parent.pid) == [] and not _alive(parent.pid)
