"""Ctrl-C and SIGTERM stop a command where it stands, even where Python would drop the interruption.

Python raises ``KeyboardInterrupt`` at the next bytecode after SIGINT; raised inside a weakref callback or a
destructor (an import's module lock, a tensor freed), it is printed as "Exception ignored" and the run goes on
as if nothing had been asked. So the stop is remembered and raised again every ``RETRY_SECONDS`` until it reaches
the command (SIGALRM), unless it is already on its way out through a ``finally`` or ``with`` block.
"""

import contextlib
import signal
import sys
from typing import Iterator, Optional, Type

RETRY_SECONDS = 0.5


class Terminated(BaseException):
    """SIGTERM, raised where the command stands (as Ctrl-C raises KeyboardInterrupt), so that it stops as cleanly."""


STOPS = (KeyboardInterrupt, Terminated)


def _propagating() -> bool:
    """Whether a stop is already being handled up the stack (a ``finally`` or ``__exit__`` runs for it)."""
    return isinstance(sys.exc_info()[1], STOPS)


@contextlib.contextmanager
def stops_raised() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` and ``Terminated`` in the main thread until the block ends,
    and a stop Python dropped is raised before the block ends normally. A signal the caller ignores (a job started
    with ``nohup`` or in a shell's background) stays ignored; outside the main thread the signals are left alone."""
    pending: Optional[Type[BaseException]] = None  # the stop received, until the block ends

    def receive(stop: Type[BaseException]):
        def handler(_signal, _frame):
            nonlocal pending
            pending = stop
            signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS, RETRY_SECONDS)
            raise stop()
        return handler

    def retry(_signal, _frame):
        if pending is not None and not _propagating():
            raise pending()

    handlers = {signal.SIGINT: receive(KeyboardInterrupt), signal.SIGTERM: receive(Terminated), signal.SIGALRM: retry}
    previous = {}
    try:
        for number, handler in handlers.items():
            if signal.getsignal(number) != signal.SIG_IGN:
                previous[number] = signal.signal(number, handler)
    except ValueError:  # not the main thread
        yield
        return
    previous_hook = sys.unraisablehook

    def drop_stops(unraisable):
        """Python's report of an exception it could not raise, silent for a stop (raised again by ``retry``)."""
        if not isinstance(unraisable.exc_value, STOPS):
            previous_hook(unraisable)

    sys.unraisablehook = drop_stops
    try:
        yield
        if pending is not None:
            raise pending()
    finally:
        pending = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = previous_hook
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
