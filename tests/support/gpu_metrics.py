"""What two runs that should repeat are compared on: ``metrics.json`` without the wall clock."""

import json
from pathlib import Path


def comparable_metrics(path: Path) -> dict:
    """``metrics.json`` without what the wall clock decides, nor what the runs differ in by design."""
    metrics = json.loads(path.read_text())
    metrics.pop("timings", None)
    metrics["rounds"] = [
        {k: v for k, v in row.items() if not k.endswith("-seconds")} for row in metrics["rounds"]
    ]
    metrics["final"] = {
        k: v for k, v in (metrics.get("final") or {}).items() if not k.endswith("-seconds")
    }
    for key in ("output-dir", "run-name"):
        metrics["config"].pop(key, None)
    return metrics
