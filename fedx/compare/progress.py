"""Where a comparison stands while its runs go: the current run's round and accuracy, and the grid's time.

A run's ServerApp rewrites its ``metrics.json`` after every round; the
runner looks at the file's modification time every few seconds while the
run goes (:meth:`GridProgress.watch`) and reads it only when it changed, so
watching costs the runs nothing. What it shows:

``[3/12] digits-cnn-dir0.5 · fedavg · seed 0: round 17/40, accuracy 0.9120, 1:23 in this run; grid 14:05, about 31:20 left``

On a terminal the line is rewritten in place (``\\r``) every time it is
looked at, and gives way to the run's one-line outcome when the run ends.
Into a log (not a terminal) it goes as a plain line when the round has
changed and ``interval`` seconds have passed since the last such line.

The estimate is the seconds the grid's runs have taken so far per round
(their start-ups included), times the rounds of every run not done yet,
less what the running run has taken already. Runs finished before (skipped)
count for nothing.
"""

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from fedx.compare.plan import PlannedRun
from fedx.outputs import METRICS_FILE


def clock_text(seconds: float) -> str:
    """``1:23`` or ``2:05:09``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def latest_round(metrics_file: Path) -> tuple[int, float | None] | None:
    """The last round of a ``metrics.json`` and its latest accuracy (``None``: no round yet).

    The accuracy is the last evaluated round's: the global model's, or the
    mean over clients for a personalized method. A file being replaced, or
    not written yet, reads as no round.
    """
    try:
        metrics = json.loads(metrics_file.read_text())
        rows = [row for row in metrics["rounds"] if row.get("round", 0) > 0]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not rows:
        return None
    accuracy = None
    for row in rows:
        value = row.get("accuracy", row.get("personalized-accuracy"))
        if isinstance(value, (int, float)):
            accuracy = float(value)
    return int(rows[-1]["round"]), accuracy


class GridProgress:
    """The progress of a comparison's grid, shown while it runs.

    Parameters
    ----------
    runs : list[PlannedRun]
        Every run of the grid, in order.
    stream : TextIO, optional
        Where the lines go (standard output by default); a terminal gets
        one line rewritten in place, anything else plain lines.
    interval : float
        Not a terminal: the fewest seconds between two progress lines.
    poll : float
        Seconds between two looks at the running run's ``metrics.json``.
    clock : callable
        Monotonic seconds (a test's own).
    width : int, optional
        A terminal's columns (by default the terminal's own): a longer line
        is cut, as a line that wraps could not be rewritten in place.
    """

    # pylint: disable=too-many-instance-attributes,too-many-arguments
    def __init__(
        self,
        runs: list[PlannedRun],
        stream: TextIO | None = None,
        *,
        interval: float = 60.0,
        poll: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.runs = runs
        self.stream = stream if stream is not None else sys.stdout
        self.interval = interval
        self.poll = poll
        self.clock = clock
        self.width = width
        self.in_place = bool(getattr(self.stream, "isatty", lambda: False)())
        self._started = clock()
        self._last_line = self._started
        #: Runs this invocation ran or will run (not skipped), by position.
        self._pending = set(range(len(runs)))
        self._spent_seconds = 0.0
        self._spent_rounds = 0
        self._current: int | None = None
        self._run_started = self._started
        self._round: tuple[int, float | None] | None = None
        self._shown_round = 0
        self._metrics_stamp: int | None = None
        self._line_shown = False

    # ------------------------------------------------------------------

    def skipped(self, index: int) -> None:
        """Run ``index`` was done before: nothing of it is left to run."""
        self._pending.discard(index)

    def start(self, index: int) -> None:
        """Run ``index`` starts."""
        self._current = index
        self._run_started = self.clock()
        self._round = None
        self._shown_round = 0
        self._metrics_stamp = None

    def watch(self) -> None:
        """Look at the running run's ``metrics.json`` (if it changed) and show where it stands."""
        if self._current is None:
            return
        metrics_file = self.runs[self._current].directory / METRICS_FILE
        try:
            stamp = metrics_file.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp is not None and stamp != self._metrics_stamp:
            self._metrics_stamp = stamp
            self._round = latest_round(metrics_file) or self._round
        now = self.clock()
        if self.in_place:
            self._show(self.line(now), in_place=True)
        elif (
            self._round is not None
            and self._round[0] != self._shown_round
            and now - self._last_line >= self.interval
        ):
            self._shown_round = self._round[0]
            self._last_line = now
            self._show(self.line(now), in_place=False)

    def finish(self, index: int) -> None:
        """Run ``index`` ended: what it took counts for the estimate of the rest."""
        self._pending.discard(index)
        run = self.runs[index]
        done = latest_round(run.directory / METRICS_FILE)  # the rounds since the last look too
        self._spent_seconds += self.clock() - self._run_started
        self._spent_rounds += done[0] if done is not None else 0
        self._current = None
        self._round = None
        self.clear()

    def clear(self) -> None:
        """Take the in-place line away (before a line of its own is printed)."""
        if self.in_place and self._line_shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._line_shown = False

    # ------------------------------------------------------------------

    def seconds_left(self, now: float) -> float | None:
        """The estimate of the grid's remaining seconds (``None``: no round done yet).

        Seconds per round so far (the runs' start-ups included: the finished
        runs', and the running run's when it has done a round) times each
        remaining run's rounds; the running run's elapsed time is taken off
        its share.
        """
        current_rounds = self._round[0] if self._round is not None else 0
        running = now - self._run_started if self._current is not None else 0.0
        if current_rounds:
            per_round = (self._spent_seconds + running) / (self._spent_rounds + current_rounds)
        elif self._spent_rounds:
            per_round = self._spent_seconds / self._spent_rounds
        else:
            return None
        waiting = sum(self.runs[i].num_rounds for i in self._pending if i != self._current)
        left = per_round * waiting
        if self._current is not None:
            left += max(per_round * self.runs[self._current].num_rounds - running, 0.0)
        return left

    def line(self, now: float) -> str:
        """Where the grid stands, one line."""
        assert self._current is not None
        run = self.runs[self._current]
        text = f"[{self._current + 1}/{len(self.runs)}] {run.label}: "
        if self._round is None:
            text += f"starting, round 0/{run.num_rounds}"
        else:
            text += f"round {self._round[0]}/{run.num_rounds}"
            if self._round[1] is not None:
                text += f", accuracy {self._round[1]:.4f}"
        text += f", {clock_text(now - self._run_started)} in this run; grid {clock_text(now - self._started)}"
        left = self.seconds_left(now)
        return text + (f", about {clock_text(left)} left" if left is not None else "")

    def _show(self, text: str, in_place: bool) -> None:
        if in_place:
            width = self.width or shutil.get_terminal_size((120, 24)).columns
            # A line wider than the terminal wraps, and \r could not take it back.
            self.stream.write("\r" + text[: max(width - 1, 1)] + "\x1b[K")
            self._line_shown = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
