"""docs/outputs.md lists every field the default method's run writes into its ``metrics.json``.

The run is FedMR's, the session's shared run through `flwr run`; FedMe's
fields are checked with its own run in tests/system/test_fedme_e2e.py. That the
check finds a field the page does not list: tests/unit/test_outputs_page.py.
"""

import json

from tests.support.helpers import undocumented_fields


def test_every_field_of_a_runs_metrics_is_on_the_page(plain_fedmr_run):
    directory, _ = plain_fedmr_run
    metrics = json.loads((directory / "metrics.json").read_text())
    assert {"accuracy", "pool-update-seconds", "trained-slots"} <= set(metrics["rounds"][1])
    assert undocumented_fields(metrics) == []
