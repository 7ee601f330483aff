"""docs/outputs.md lists every field a run writes into its ``metrics.json``.

The default method's run (FedMR, the session's shared run through `flwr
run`) here; FedMe's fields are checked with its own run in
tests/system/test_fedme_e2e.py. The check can fail: a field the page does not list
is reported.
"""

from tests.support.helpers import undocumented_fields


def test_a_field_the_page_does_not_list_is_found():
    metrics = {
        "config": {},
        "rounds": [{"round": 0, "accuracy": 0.1}, {"round": 1, "new-field": 1.0}],
        "final": {},
        "stop-reason": None,
        "timings": {"total-seconds": 1.0, "per-client-seconds": 2.0},
    }
    assert undocumented_fields(metrics) == ["new-field", "per-client-seconds"]
    assert undocumented_fields({**metrics, "rounds": [{"initial-cnn-2": 3.0}]}) == [
        "per-client-seconds"
    ]
