"""What a run leaves in ``outputs/<run-name>/``: metrics, a learning curve, the model."""

import time
from pathlib import Path
from typing import Any

from fedx.files import write_json_atomically

METRICS_FILE = "metrics.json"
PLOT_FILE = "accuracy.png"
MODEL_FILE = "model.pt"


class RunRecorder:
    """Collects per-round metrics and timings and writes them as the run goes.

    :meth:`record` and :meth:`record_clients` collect; :meth:`flush` writes
    ``metrics.json``, which the ServerApp does once a round, after the
    round's checkpoint, and at the end of the run. The file is replaced
    atomically but not forced to the disk (``durable=False`` of
    :func:`fedx.files.write_atomically`): the checkpoint holds the same rows
    and is forced to the disk, and a run resumed from it writes them again.

    Every round is one row of ``metrics.json``'s ``rounds``: numbers such as
    ``accuracy`` (the global model on the held-out test split) and, for
    personalized methods, ``personalized-accuracy`` (mean over clients of
    each client's model on its own test split) with
    ``personalized-accuracy-std``, plus a ``clients`` object holding each
    client's own result under its id. ``stop-reason`` says why a run ended
    before its last round (``null`` when it did not: see
    :class:`~fedx.strategy_core.divergence.DivergenceGuard`).

    Parameters
    ----------
    directory : Path
        ``outputs/<run-name>``; created if missing.
    config : dict
        The resolved run configuration, stored in ``metrics.json``.
    rounds : dict, optional
        Rows of rounds already done, when a run is resumed from a checkpoint.
    """

    def __init__(
        self,
        directory: Path,
        config: dict[str, Any],
        rounds: dict[int, dict[str, float]] | None = None,
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.rounds: dict[int, dict[str, Any]] = {
            server_round: dict(row) for server_round, row in (rounds or {}).items()
        }
        #: Why the run ended before its last round (``None``: it did not).
        self.stop_reason: str | None = None
        self._started = time.perf_counter()
        self._round_started = self._started
        self._unwritten = True

    def start_round_clock(self) -> None:
        """Mark the start of the next round (after any evaluation)."""
        self._round_started = time.perf_counter()

    def record(self, server_round: int, **metrics: float) -> None:
        """Merge metrics into a round's row (written by the next :meth:`flush`)."""
        self.rounds.setdefault(server_round, {}).update(metrics)
        self._unwritten = True

    def record_clients(self, server_round: int, clients: dict[str, dict[str, Any]]) -> None:
        """Store per-client results (``{client id: {"accuracy": ..., ...}}``) in a round's row."""
        self.rounds.setdefault(server_round, {})["clients"] = clients
        self._unwritten = True

    def stopped(self, reason: str) -> None:
        """Record that the run ended early, and why, and rewrite ``metrics.json``."""
        self.stop_reason = reason
        self._unwritten = True
        self.flush()

    def flush(self) -> None:
        """Rewrite ``metrics.json`` if anything was recorded since it was last written."""
        if self._unwritten:
            write_json_atomically(self.directory / METRICS_FILE, self.summary(), durable=False)
            self._unwritten = False

    def round_seconds(self) -> float:
        """Seconds since :meth:`start_round_clock`."""
        return time.perf_counter() - self._round_started

    def summary(self) -> dict[str, Any]:
        """Everything ``metrics.json`` holds."""
        evaluated = [
            (r, m)
            for r, m in sorted(self.rounds.items())
            if "accuracy" in m or "personalized-accuracy" in m
        ]
        final = {"round": evaluated[-1][0], **evaluated[-1][1]} if evaluated else {}
        durations = [m["round-seconds"] for m in self.rounds.values() if "round-seconds" in m]
        return {
            "config": self.config,
            "rounds": [{"round": r, **m} for r, m in sorted(self.rounds.items())],
            "final": final,
            "stop-reason": self.stop_reason,
            "timings": {
                "total-seconds": time.perf_counter() - self._started,
                "mean-round-seconds": sum(durations) / len(durations) if durations else None,
            },
        }

    def plot(self, title: str) -> Path:
        """Draw accuracy against round into ``accuracy.png``.

        The global model's test accuracy is a line; personalized accuracy is
        its mean over clients with a band of one standard deviation.
        """
        rows = sorted(self.rounds.items())
        points = [(r, m["accuracy"]) for r, m in rows if "accuracy" in m]
        personal = [
            (r, m["personalized-accuracy"], m.get("personalized-accuracy-std", 0.0))
            for r, m in rows
            if "personalized-accuracy" in m
        ]
        # Imported here: only the end of a run draws. A Figure of its own (not
        # pyplot's) needs no display and leaves the process's backend alone.
        # pylint: disable=import-outside-toplevel
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        figure = Figure(figsize=(6, 4))
        axes = figure.subplots()
        if points:
            axes.plot(
                [r for r, _ in points],
                [a for _, a in points],
                marker="o",
                markersize=3,
                label="global model",
            )
        if personal:
            rounds = [r for r, _, _ in personal]
            means = [m for _, m, _ in personal]
            axes.plot(
                rounds,
                means,
                marker="s",
                markersize=3,
                label="personalized (mean ± std over clients)",
            )
            axes.fill_between(
                rounds, [m - s for _, m, s in personal], [m + s for _, m, s in personal], alpha=0.2
            )
            axes.legend(loc="lower right")
        axes.set_xlabel("round")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel("test accuracy" if personal else "global test accuracy")
        axes.set_ylim(0.0, 1.0)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        figure.tight_layout()
        path = self.directory / PLOT_FILE
        figure.savefig(path, dpi=120)
        return path
