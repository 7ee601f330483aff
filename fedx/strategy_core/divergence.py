"""Stopping a run that diverged, instead of letting it go on to its last round.

A diverging run shows itself in two ways: the clients' models blow up, so
every reply that comes back holds NaN or Inf and is dropped (the pool and the
global model then never change again, and every later round is the same
wasted round), or the global model itself stops making sense: NaN or Inf in
its arrays or its central loss, or a central loss that grew far beyond the
initial model's (a pool of mutations that lie ever further out can keep some
replies finite while the loss grows a hundredfold a round). :class:`DivergenceGuard` watches the round
loop (:func:`fedx.strategies.run_rounds`) for both and tells it to stop, with
one sentence that says why (``stop_reason``); the loop then ends the run
with the global model of the last round that ended well
(:attr:`DivergenceGuard.last_good_round`), and calls ``on_round_end`` (where
checkpoints are written) only for rounds that ended well, so the last
checkpoint is a good one.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from fedx.arrays import to_numpy
from fedx.checks import NON_NEGATIVE, Integer, check


def _loss(metrics: MetricRecord | None) -> float | None:
    """The ``loss`` of a central evaluation, when it reports a number."""
    loss = None if metrics is None else metrics.get("loss")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    return None


def _finite(arrays: ArrayRecord) -> bool:
    """Whether every float array of ``arrays`` holds only finite values."""
    for array in arrays.values():
        values = to_numpy(array)
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            return False
    return True


@dataclass
class DivergenceGuard:
    """Decides, round by round, whether a run diverged.

    Parameters
    ----------
    invalid_rounds : int (default: 3)
        Stop after this many consecutive rounds in which training replies
        came back but none could be used (every one dropped as invalid, for
        example for NaN or Inf). A round in which a reply was used, or in
        which no node answered at all (silence is not divergence), ends the
        streak. 0: never stop for this (such rounds then count as ended
        well, as every round did before the guard).
    nonfinite : bool (default: True)
        Stop as soon as the global model holds NaN or Inf, or the central
        evaluation reports a loss that is NaN or infinite.
    loss_ratio : float (default: 1000.0)
        Stop as soon as the central loss exceeds this multiple of the
        central loss of the initial model (round 0; no such check when the
        run has none). A cross-entropy loss that grew a thousandfold from an
        untrained model's (ln 10 = 2.3 for ten classes) belongs to a model
        that no longer classifies. 0: never stop for this.
    """

    invalid_rounds: int = 3
    nonfinite: bool = True
    loss_ratio: float = 1000.0
    #: Why the run must stop (``None`` while it may go on).
    stop_reason: str | None = None
    #: The last round that ended well (0: none yet, the initial model).
    last_good_round: int = 0
    #: The global model after :attr:`last_good_round`.
    last_good_arrays: ArrayRecord | None = None
    _initial_loss: float | None = None
    _streak: int = 0
    _round_ok: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        check("invalid_rounds", self.invalid_rounds, Integer(0))
        check("loss_ratio", self.loss_ratio, NON_NEGATIVE)

    def start(
        self, server_round: int, arrays: ArrayRecord, initial: MetricRecord | None = None
    ) -> None:
        """The run starts after ``server_round`` (0, or a checkpoint's round) from ``arrays``.

        ``initial`` is the central evaluation of round 0, when there was one.
        """
        self.last_good_round, self.last_good_arrays = server_round, arrays
        self.stop_reason, self._streak = None, 0
        loss = _loss(initial)
        self._initial_loss = loss if loss is not None and np.isfinite(loss) else None

    def after_training(
        self,
        server_round: int,
        replies: Sequence[Message],
        arrays: ArrayRecord | None,
        metrics: MetricRecord | None,
    ) -> None:
        """Look at a round's training: ``replies``, and what the strategy made of them."""
        self._round_ok = True
        answered = sum(1 for reply in replies if not reply.has_error())
        used = arrays is not None or metrics is not None
        if used or answered == 0 or not self.invalid_rounds:
            self._streak = 0
        else:
            self._streak += 1
            self._round_ok = False
            if self._streak >= self.invalid_rounds:
                self.stop_reason = (
                    f"diverged: no training reply could be used in {self._streak} consecutive "
                    f"rounds ({server_round - self._streak + 1}-{server_round}; "
                    f"divergence-rounds={self.invalid_rounds})"
                )
        if self.nonfinite and arrays is not None and len(arrays) > 0 and not _finite(arrays):
            self._fail(f"diverged: the global model of round {server_round} holds NaN or Inf")

    def after_evaluation(
        self, server_round: int, arrays: ArrayRecord, metrics: MetricRecord | None
    ) -> None:
        """Look at the central evaluation of round ``server_round``; note a round that ended well."""
        loss = _loss(metrics)
        if loss is not None and self.nonfinite and not np.isfinite(loss):
            self._fail(f"diverged: the central loss of round {server_round} is {loss}")
        limit = None if self._initial_loss is None else self.loss_ratio * self._initial_loss
        if loss is not None and self.loss_ratio and limit is not None and loss > limit:
            self._fail(
                f"diverged: the central loss of round {server_round} is {loss:.4g}, more than "
                f"divergence-loss-ratio={self.loss_ratio:g} times the initial model's "
                f"{self._initial_loss:.4g}"
            )
        if self._round_ok:
            self.last_good_round, self.last_good_arrays = server_round, arrays

    @property
    def round_ok(self) -> bool:
        """Whether the round just looked at ended well (its state is worth a checkpoint)."""
        return self._round_ok

    def _fail(self, reason: str) -> None:
        self._round_ok = False
        if self.stop_reason is None:
            self.stop_reason = reason
