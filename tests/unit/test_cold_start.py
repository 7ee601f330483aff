"""A fresh ClientApp process imports only what a digits run needs (issue 14: the cold start).

In a deployment Flower starts a new ClientApp process for every message, so
every import of the app is paid per node per message. This guards the import
set: torchvision, the Hugging Face datasets stack, matplotlib, scikit-learn
and torch's compiler stay out of a digits ClientApp (and of the ServerApp's
import), so they cannot creep back. The cold-start time itself is measured by
the deployment benchmark, not here.

The app modules themselves import neither torch nor fedx's data, model and
strategy code: their handlers do, when they first run. Flower's simulation
loads both modules under one lock before it starts Ray (fedx/client_app.py),
and a deployed node answers the server's query without them.
"""

import json
import subprocess
import sys

from fedx import client_app
from fedx.deploy.superexec import DEFAULT_PRELOAD
from tests.support.cold_start import answer_digits_messages
from tests.support.helpers import REPO, run_config


def test_a_digits_clientapp_process_imports_only_what_it_needs(server_task_identity) -> None:
    config = run_config({"local-epochs": 1})
    # This process computes the partitions and the digits split once (into
    # the session's disk cache), as the first process of a user's run does.
    expected = answer_digits_messages(config)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.cold_start", json.dumps(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["import the apps"] == []
    assert report["query"] == {"client-id": 3}
    assert report["train and evaluate"] == []
    # It answered from the cached partitions: the same data as here.
    for kind in ("train", "evaluate"):
        assert report["replies"][kind]["num-examples"] == expected[kind]["num-examples"]


def test_warm_clientapp_interpreters_import_the_handlers_ahead() -> None:
    """fedx-superexec's default (the simulation's Ray actors: fedx/client_app.py)."""
    assert client_app.HANDLERS_MODULE in DEFAULT_PRELOAD
