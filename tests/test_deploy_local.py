"""Stopping what a local federation started: a process and every process below it."""

import signal
import subprocess
import sys

from fedx.deploy.local import _alive, _descendants, _stop_group  # pylint: disable=protected-access

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
        _stop_group(parent, signal.SIGTERM)
        parent.stdout.close()
    assert parent.poll() is not None
    assert not any(_alive(pid) for pid in children)
    assert _descendants(parent.pid) == [] and not _alive(parent.pid)
