"""fedx's actor pool and ClientApp actor (fedx/simulation/) on a Ray started here, with real actors.

The pool's rules without Ray, and the feeder: tests/unit/test_ray_backend.py;
the cluster cases (a node lost and back, two hosts): tests/system/test_ray_cluster.py.
"""

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException, LoadClientAppError

from fedx.simulation.actor import ClientAppActor
from fedx.simulation.pool import MESSAGES_PER_ACTOR, ActorPool


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


def test_fedx_clientapp_actor_passes_the_apps_errors_on_as_flowers_does(
    local_ray, server_task_identity
):
    """fedx/simulation/actor.py's actor in place of Flower's: the same errors reach the engine."""
    app = ClientApp()

    @app.query()
    def fails(msg: Message, context: Context) -> Message:
        raise ValueError(f"the app's own error on node {context.node_id}")

    def unloadable() -> ClientApp:
        raise LoadClientAppError("no ClientApp here")

    actor = ClientAppActor.options(num_cpus=1).remote()
    message = Message(RecordDict(), dst_node_id=7, message_type="query")
    context = Context(1, 7, {}, RecordDict(), {})
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as raised:
            ray.get(actor.run.remote(lambda: app, message, "7", context), timeout=120)
        assert isinstance(raised.value.cause, ClientAppException)
        assert "the app's own error on node 7" in str(raised.value.cause)
        with pytest.raises(ray.exceptions.RayTaskError) as raised:
            ray.get(actor.run.remote(unloadable, message, "7", context), timeout=120)
        assert isinstance(raised.value.cause, LoadClientAppError)
    finally:
        ray.kill(actor)


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


def test_a_busy_actor_gets_a_message_queued_only_while_more_wait_than_there_are_actors(local_ray):
    pool = ActorPool({"num_cpus": 1}, Worker.remote, watch_interval=0.2)
    try:
        deadline = time.monotonic() + 60
        while pool.started < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        held: list[list[int]] = []  # messages each actor held when one was handed over

        def job(handle):
            held.append(sorted(actor.in_flight for actor in pool._busy))
            return handle.run.remote(sleep=0.3)

        def run_at_once(count: int) -> list[int]:
            held.clear()
            with ThreadPoolExecutor(count) as threads:
                return list(threads.map(lambda _: pool.run(job), range(count)))

        assert len(set(run_at_once(2))) == 2 and max(map(max, held)) == 1  # one each, no queue
        pids = run_at_once(6)
        assert len(set(pids)) == 2 and len(pids) == 6
        assert max(map(max, held)) == MESSAGES_PER_ACTOR  # queued behind a running one
        assert pool.idle == 2 and pool.started == 2
    finally:
        pool.shutdown()


def test_messages_wait_for_actors_that_start_slowly(local_ray, monkeypatch, caplog):
    """A busy machine may take minutes to start actors: that is no reason to fail messages."""
    monkeypatch.setattr("fedx.simulation.pool.NO_ACTOR_TIMEOUT", 0.5)
    monkeypatch.setattr("fedx.simulation.pool.SLOW_START", 1.0)
    caplog.set_level(logging.INFO, logger="flwr")
    pool = ActorPool(
        {"num_cpus": 1}, Worker.remote, app_fn=lambda: time.sleep(3), watch_interval=0.2
    )
    try:
        assert isinstance(pool.run(lambda handle: handle.run.remote()), int)
    finally:
        pool.shutdown()
    assert "2 ClientApp actors have waited 1s or more to start" in caplog.text


def _no_fedx():
    raise ModuleNotFoundError("No module named 'fedx'")


@pytest.mark.parametrize(
    ("app_fn", "preload", "missing"),
    [
        (_no_fedx, (), "fedx"),
        # What the ClientApp imports on its first message (fedx.client_app's handlers).
        (lambda: None, ("json", "fedx_not_installed.handlers"), "fedx_not_installed"),
    ],
    ids=["app", "preload"],
)
def test_a_clientapp_that_does_not_load_fails_its_messages_at_once(
    local_ray, caplog, app_fn, preload, missing
):
    """A worker node without fedx (or with another version) is a setup error, not a reason to wait."""
    caplog.set_level(logging.INFO, logger="flwr")
    pool = ActorPool(
        {"num_cpus": 1},
        Worker.remote,
        app_fn=app_fn,
        preload=preload,
        watch_interval=0.2,
        death_report_delay=60,
    )
    try:
        started = time.monotonic()
        with pytest.raises(
            LoadClientAppError,
            match=rf"the ClientApp does not load in a Ray actor .*No module named '{missing}'",
        ):
            pool.run(lambda handle: handle.run.remote())
        assert time.monotonic() - started < 60
        time.sleep(1.0)  # the watcher does not start new actors that would fail the same way
        assert pool.size == 0
    finally:
        pool.shutdown()
    assert "every node needs the same fedx, flwr and torch as the head" in caplog.text
    assert "died" not in caplog.text  # a setup error, not a lost actor
