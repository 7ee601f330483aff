"""benchmarks/fedx_bench/message_timeline.py: its tracer and how it reads one message's way from a trace."""

import os
import subprocess
import sys

import pytest

from tests.support.helpers import environment_with_path

from fedx_bench import message_timeline as timeline


def test_the_tracer_writes_one_line_per_call_of_its_targets_and_nothing_without_a_file(tmp_path):
    trace = tmp_path / "trace.txt"
    program = (
        "from fedx.deploy import warm_task\n"
        "warm_task._fresh_start(None, 1)\n"
        "warm_task._fresh_start(None, 1)\n"
    )
    environment = environment_with_path(timeline.TRACER)
    subprocess.run([sys.executable, "-c", program], env=environment, check=True, timeout=120)
    assert not trace.exists()
    environment["FEDX_TRACE_FILE"] = str(trace)
    subprocess.run([sys.executable, "-c", program], env=environment, check=True, timeout=120)
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert [line[5:] for line in lines] == [["_fresh_start", "NoneType"]] * 2
    start, seconds, pid = float(lines[0][0]), float(lines[0][1]), int(lines[0][2])
    assert seconds >= 0 and pid != os.getpid() and float(lines[1][0]) >= start
    # What starts CUDA in a process is traced too (it is what a GPU node's task pays).
    check = "import torch\nassert torch.cuda._lazy_init.__fedx_traced__\n"
    subprocess.run([sys.executable, "-c", check], env=environment, check=True, timeout=120)


def test_one_nodes_steps_are_read_from_the_processes_calls():
    supernode, superexec, warm, child = 11, 12, 13, 14

    def call(start, end, pid, name, ppid=1):
        return timeline.Call(start, end - start, pid, ppid, "p", name, "x")

    exchange = call(10.0, 12.0, 99, "send_and_collect")
    calls = sorted(
        [
            exchange,
            call(10.0, 10.3, 99, "HttpGrid.push_messages"),
            call(10.01, 10.5, supernode, "_pull_and_store_message"),
            call(10.05, 10.06, superexec, "WarmExecutor.launch"),
            call(10.07, 11.5, child, "BaseProcess._bootstrap", ppid=warm),
            call(10.08, 11.5, child, "run_clientapp", ppid=warm),
            call(10.1, 10.55, child, "pull_task_input", ppid=warm),
            call(10.55, 10.6, child, "install_from_fab", ppid=warm),
            call(10.6, 10.65, child, "get_load_client_app_fn()", ppid=warm),
            call(10.65, 11.2, child, "ClientApp.__call__", ppid=warm),
            call(10.7, 11.15, child, "train", ppid=warm),
            call(10.71, 10.91, child, "_lazy_init", ppid=warm),  # a GPU node: CUDA starts
            call(10.95, 10.95, child, "_lazy_init", ppid=warm),  # started already
            call(11.2, 11.3, child, "push_message", ppid=warm),
            call(11.3, 11.4, child, "flwr_exit", ppid=warm),
            call(10.5, 11.6, supernode, "_push_messages"),
        ],
        key=lambda c: c.start,
    )
    spans = timeline.node_spans(calls, exchange, timeline.Node(supernode, superexec, warm))
    took = {step: round(end - begin, 3) for step, (begin, end) in spans.items()}
    assert took["SuperNode pulls the message and its objects"] == 0.49
    assert took["fork: launch to the child's first line"] == 0.01
    assert took["child: pull task input (waits for the objects)"] == 0.45
    assert took["child: ClientApp handler"] == 0.55 and took["  train"] == 0.45
    assert took["  CUDA starts (torch.cuda._lazy_init)"] == 0.2
    assert took["SuperNode sends the reply to the SuperLink"] == 0.3
    assert took["child: exit (after the reply)"] == 0.2
    assert spans["child: install FAB"] == pytest.approx((0.55, 0.6))
    # Another node's SuperExec never launched this message: no timeline for it.
    assert timeline.node_spans(calls, exchange, timeline.Node(supernode, 77, warm)) is None
