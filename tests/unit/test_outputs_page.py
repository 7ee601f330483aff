"""The check that docs/outputs.md lists every field a run writes into its ``metrics.json`` can fail.

A field the page does not list is reported. The check on real runs:
tests/system/test_outputs_page.py (FedMR) and tests/system/test_fedme_e2e.py (FedMe).
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
