"""fedx's Ray backend (fedx/simulation/) without starting Ray: the pool's rules and the feeder.

On a Ray started here, with real actors: tests/system/test_ray_backend.py; the
cluster cases (a node lost and back, two hosts): tests/system/test_ray_cluster.py.
"""

import os
import socket
import sys
import threading
import time
from queue import Empty, Queue

import numpy as np
import pytest
import ray
from flwr.app import ArrayRecord, Message, RecordDict

from fedx.deploy.local import free_port
from fedx.flower.ray_backend import FlowerRayBackend
from fedx.messaging import REPLIES_STORED
from fedx.simulation.backend import INLINE_OBJECT_BYTES, ClusterRayBackend
from fedx.simulation.feeder import feed_messages
from fedx.simulation.ray_cluster import actors_per_node, check_cluster_address, starts_own_ray


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


def test_a_ray_started_here_passes_models_inline_a_running_cluster_keeps_its_settings(monkeypatch):
    seen = []
    monkeypatch.setattr(FlowerRayBackend, "init_ray", lambda self, config: seen.append(config))
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("fedx.simulation.backend.starts_own_ray", lambda address: True)
    ClusterRayBackend({"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    ClusterRayBackend(
        {"client_resources": {"num_cpus": 1}, "init_args": {"_system_config": {"a": 1}}}
    )
    # A Ray started here inherits the app's path from the environment: no runtime env.
    assert os.environ["PYTHONPATH"].split(os.pathsep)[: len(sys.path)] == sys.path
    assert os.environ["PYTHONPATH"].endswith(f"{os.pathsep}/elsewhere")
    monkeypatch.setattr("fedx.simulation.backend.starts_own_ray", lambda address: False)
    ClusterRayBackend({"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    inline = {"max_direct_call_object_size": INLINE_OBJECT_BYTES}
    assert seen == [
        {"include_dashboard": False, "num_cpus": 2, "_system_config": inline},
        {"include_dashboard": False, "_system_config": {"a": 1, **inline}},
        {"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},  # Flower's, as given
    ]
    with socket.socket() as listening:  # an address: Ray joins what listens there
        listening.bind(("127.0.0.1", 0))
        assert not starts_own_ray(f"127.0.0.1:{listening.getsockname()[1]}")


# ----------------------------------------------------------------------
# The message feeder, on Flower's in-memory state of a simulation
# ----------------------------------------------------------------------


def message_to(node_id: int, value: float) -> Message:
    content = RecordDict({"arrays": ArrayRecord([np.full(2, value, dtype=np.float32)])})
    return Message(content, dst_node_id=node_id, message_type="train")


def value_of(message: Message) -> float:
    return float(message.content["arrays"].to_numpy_ndarrays()[0][0])


def feeding(state, nodes_mapping):
    """Run feed_messages in a thread; yield its queue; stop it."""
    queue, stop = Queue(), threading.Event()
    thread = threading.Thread(target=feed_messages, args=(state, queue, nodes_mapping, stop))
    thread.start()
    return queue, stop, thread


def take(queue: Queue, count: int, timeout: float = 10.0) -> list[Message]:
    return [queue.get(timeout=timeout) for _ in range(count)]


def test_the_feeder_hands_over_messages_when_they_are_pushed(simulation_state, monkeypatch):
    """Pushes wake it: with the passes minutes apart, pushed messages still come at once."""
    state, grid, nodes, mapping = simulation_state
    monkeypatch.setattr("fedx.simulation.feeder.FEED_INTERVAL", 300.0)
    monkeypatch.setattr("fedx.simulation.feeder.FEED_SWEEP_INTERVAL", 300.0)
    queue, stop, thread = feeding(state, mapping)
    try:
        time.sleep(0.2)  # the feeder waits for pushes
        grid.push_messages([message_to(node, position) for position, node in enumerate(nodes)])
        delivered = take(queue, 3)
        assert sorted(value_of(m) for m in delivered) == [0.0, 1.0, 2.0]
        assert all(m.metadata.delivered_at for m in delivered)  # the state marked them
        with pytest.raises(Empty):
            queue.get(timeout=0.3)  # each once
        # The engine stores a reply: the ServerApp's exchanges waiting in this process hear it.
        reply = Message(RecordDict(), reply_to=delivered[0])
        reply.metadata.__dict__["_message_id"] = "reply-0"  # as Flower's engine does
        stored = REPLIES_STORED.count
        assert state.store_message_res(reply) == "reply-0"
        assert REPLIES_STORED.count == stored + 1
    finally:
        stop.set()
        grid.push_messages([message_to(nodes[0], 9.0)])  # a push wakes it to see the stop
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert "store_message_ins" not in vars(state)  # Flower's method again


def test_the_feeder_gives_a_node_one_message_a_pass_and_finds_what_its_hook_missed(
    simulation_state, monkeypatch
):
    state, grid, nodes, mapping = simulation_state
    monkeypatch.setattr("fedx.simulation.feeder.FEED_INTERVAL", 0.05)
    monkeypatch.setattr("fedx.simulation.feeder.FEED_SWEEP_INTERVAL", 0.5)
    queue, stop, thread = feeding(state, mapping)
    try:
        grid.push_messages([message_to(nodes[1], 1.0), message_to(nodes[1], 1.5)])
        grid.push_messages([message_to(nodes[0], 0.0)])
        first = take(queue, 1)
        second, third = take(queue, 2)
        values = [value_of(m) for m in (first[0], second, third)]
        assert values.index(1.5) > values.index(1.0)  # node 1's second message a pass later
        assert sorted(values) == [0.0, 1.0, 1.5]
        # A message stored past the hook (Flower's method itself) waits for the sweep.
        missed = message_to(nodes[2], 2.0)
        missed.metadata.__dict__["_message_id"] = "missed"
        type(state).store_message_ins(state, missed)
        started = time.monotonic()
        (found,) = take(queue, 1)
        assert value_of(found) == 2.0 and time.monotonic() - started < 5
    finally:
        stop.set()
        thread.join(timeout=10)
