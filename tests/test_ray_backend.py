"""fedx's Ray backend (fedx/ray_backend.py) on this machine's own Ray: the pool's rules.

The cluster cases (a node lost and back, two hosts) are in tests/test_ray_cluster.py.
"""

import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
from flwr.clientapp.client_app import LoadClientAppError

from fedx.deploy.local import free_port
from fedx.ray_backend import ActorPool, ClusterRayBackend, actors_per_node, check_cluster_address


def test_actors_per_node_is_flowers_rule():
    assert actors_per_node({"CPU": 16.0, "GPU": 2.0}, {"num_cpus": 2, "num_gpus": 0.25}) == 8
    assert actors_per_node({"CPU": 16.0, "GPU": 2.0}, {"num_cpus": 4, "num_gpus": 0.25}) == 4
    assert actors_per_node({"CPU": 16.0}, {"num_cpus": 1, "num_gpus": 0.5}) == 0  # no GPU there
    assert actors_per_node({"CPU": 0.9}, {"num_cpus": 0.3, "num_gpus": 0.0}) == 3  # not 2.9999
    assert actors_per_node({"CPU": 2.0}, {"num_cpus": 3}) == 0


def test_a_ray_address_where_nothing_listens_is_refused_at_once():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(
        ConnectionError, match=rf"RAY_ADDRESS='127.0.0.1:{port}': no Ray cluster answers there"
    ):
        check_cluster_address(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    with pytest.raises(ConnectionError, match="is not <host>:<port>"):
        check_cluster_address("10.0.0.1")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_cluster_address(f"127.0.0.1:{listening.getsockname()[1]}")
    for ray_decides in ("", "auto", "local"):
        check_cluster_address(ray_decides)


def test_the_backend_refuses_a_ray_address_where_nothing_listens_before_ray_starts(monkeypatch):
    """What ``flwr run`` shows when RAY_ADDRESS names nothing (Ray itself retries for many minutes)."""
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    started = time.monotonic()
    with pytest.raises(
        ConnectionError, match=f"RAY_ADDRESS='{address}': no Ray cluster answers there"
    ):
        ClusterRayBackend({"client_resources": {"num_cpus": 1}, "init_args": {}})
    assert time.monotonic() - started < 5
    assert not ray.is_initialized()


@ray.remote(num_cpus=1)
class Worker:
    """Stands in for Flower's ClientAppActor."""

    def run(self, die: bool = False, fail: bool = False, sleep: float = 0.0) -> int:
        time.sleep(sleep)
        if die:
            os._exit(1)  # the process goes, as when Ray's memory monitor kills it
        if fail:
            raise ValueError("the ClientApp's own error")
        return os.getpid()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def test_the_pool_replaces_an_actor_that_died_and_reruns_its_message(local_ray, caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    pool = ActorPool(
        {"num_cpus": 1, "num_gpus": 0.0}, Worker.remote, watch_interval=0.2, death_report_delay=0.5
    )
    try:
        assert pool.capacity == 2
        assert (
            "starting 2 ClientApp actors (num_cpus=1, num_gpus=0 each) on 1 Ray node" in caplog.text
        )
        attempts = []

        def dies_once(handle):
            attempts.append(handle)
            return handle.run.remote(die=len(attempts) == 1)

        pid = pool.run(dies_once)
        assert len(attempts) == 2 and attempts[0] != attempts[1]
        assert isinstance(pid, int)

        # The ClientApp's own error is raised, and its actor stays.
        with pytest.raises(ray.exceptions.RayTaskError, match="the ClientApp's own error"):
            pool.run(lambda handle: handle.run.remote(fail=True))

        deadline = time.monotonic() + 60
        while (pool.started < 2 or "died" not in caplog.text) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.started == pool.size == 2
        died = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
        assert len(died) == 1 and "1 ClientApp actor died" in died[0], died
        assert "the pool goes on with 2 actors on 1 node" in died[0]
        # Both actors, the replacement included, take messages at once.
        with ThreadPoolExecutor(2) as threads:
            pids = list(
                threads.map(lambda _: pool.run(lambda h: h.run.remote(sleep=1.0)), range(2))
            )
        assert len(set(pids)) == 2 and pool.peak_running == 2
    finally:
        pool.shutdown()
    assert "ClientApp messages per Ray node: " in caplog.text


def test_messages_wait_for_actors_that_start_slowly(local_ray, monkeypatch, caplog):
    """A busy machine may take minutes to start actors: that is no reason to fail messages."""
    monkeypatch.setattr("fedx.ray_backend.NO_ACTOR_TIMEOUT", 0.5)
    monkeypatch.setattr("fedx.ray_backend.SLOW_START", 1.0)
    caplog.set_level(logging.INFO, logger="flwr")
    pool = ActorPool(
        {"num_cpus": 1}, Worker.remote, app_fn=lambda: time.sleep(3), watch_interval=0.2
    )
    try:
        assert isinstance(pool.run(lambda handle: handle.run.remote()), int)
    finally:
        pool.shutdown()
    assert "2 ClientApp actors have waited 1s or more to start" in caplog.text


def test_a_clientapp_that_does_not_load_fails_its_messages_at_once(local_ray, caplog):
    """A worker node without fedx (or with another version) is a setup error, not a reason to wait."""

    def load():
        raise ModuleNotFoundError("No module named 'fedx'")

    caplog.set_level(logging.INFO, logger="flwr")
    pool = ActorPool(
        {"num_cpus": 1}, Worker.remote, app_fn=load, watch_interval=0.2, death_report_delay=60
    )
    try:
        started = time.monotonic()
        with pytest.raises(
            LoadClientAppError,
            match=r"the ClientApp does not load in a Ray actor .*No module named 'fedx'",
        ):
            pool.run(lambda handle: handle.run.remote())
        assert time.monotonic() - started < 60
        time.sleep(1.0)  # the watcher does not start new actors that would fail the same way
        assert pool.size == 0
    finally:
        pool.shutdown()
    assert "every node needs the same fedx, flwr and torch as the head" in caplog.text
    assert "died" not in caplog.text  # a setup error, not a lost actor
