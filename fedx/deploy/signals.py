"""The signals that stop a local federation: INT, TERM and HUP, always, and never half-way.

``fedx-deploy up`` runs in :func:`stop_on_signals` from before it starts
anything: the first of SIGINT, SIGTERM or SIGHUP raises :class:`StopRequested`
in the main thread, wherever it is (a start-up wait, the watch loop, ``flwr
run``), and the federation's ``with`` block stops everything it started.

* SIGINT is handled even where it arrived ignored: a shell starts a
  background job (``nohup fedx-deploy up ... &``) with SIGINT ignored, and
  Python keeps it so, which made "Ctrl-C (or ``kill -INT``) stops
  everything" false there.
* SIGHUP is handled unless it arrived ignored: ``nohup`` ignores it on
  purpose, so that the federation outlives the terminal.

A teardown runs in :func:`deferred`: a second signal meanwhile is noted, not
acted on, so it cannot abandon the teardown half-way; once the teardown is
done, what the signal's handler would have done is done (a test runner's
SIGINT raises its ``KeyboardInterrupt`` then).
"""

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

#: The signals that stop a federation.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(BaseException):
    """A stop signal arrived (a ``BaseException``: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class _FirstStops:
    """The handler :func:`stop_on_signals` installs: the first signal raises, later ones are noted."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.received.append(signum)
        if len(self.received) == 1:
            raise StopRequested(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[list[int]]:
    """Raise :class:`StopRequested` at the first SIGINT, SIGTERM or SIGHUP inside the block.

    Call it from the main thread, before anything is started. SIGINT is
    handled even where it arrived ignored; SIGHUP is not where it arrived
    ignored (``nohup``). The handlers in place before come back after the
    block. Yields the signals received, in order.
    """
    handler = _FirstStops()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        if sig == signal.SIGHUP and previous[sig] == signal.SIG_IGN:
            continue  # nohup: hangups ignored on purpose
        signal.signal(sig, handler)
    try:
        yield handler.received
    finally:
        for sig, before in previous.items():
            if before is not None:
                signal.signal(sig, before)


@contextlib.contextmanager
def deferred() -> Iterator[list[int]]:
    """Note SIGINT, SIGTERM and SIGHUP inside the block (a teardown) instead of acting on them.

    After the block the handlers in place before come back, and the first
    signal noted is handed to its handler: a Python handler is called, a
    default action is taken (the signal is sent again), an ignored signal
    stays ignored. Outside the main thread, where no handler can be set,
    nothing changes. Yields the signals noted.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, before in previous.items():
        if before not in (signal.SIG_IGN, None):
            signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        for sig, before in previous.items():
            if before is not None:
                signal.signal(sig, before)
        if noted:
            before = previous[noted[0]]
            if callable(before):
                before(noted[0], None)
            elif before == signal.SIG_DFL:
                os.kill(os.getpid(), noted[0])
