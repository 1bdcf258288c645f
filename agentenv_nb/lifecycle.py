"""What the kit starts stops when Python exits: one exit hook closes every object registered here that is still
alive, newest first, so a client closes its sessions before its server stops and a server before its env processes.

    close_at_exit(server.close)     # a bound method: held weakly, so registering keeps nothing alive
    close_at_exit(close_pools)      # a function: held for good

A close that fails is logged, and the others still run. SIGTERM, left to its default, would end Python without
its exit hooks: once something is registered, it closes everything registered and exits Python the normal way
instead (status 143, as before). Closing first, while the main thread's code is stopped: past the end of the program,
Python stops the thread pools episodes still in flight need to end cleanly, before any exit hook runs.
"""

from __future__ import annotations

import atexit
import logging
import signal
import sys
import threading
import weakref
from collections.abc import Callable

logger = logging.getLogger(__name__)
_closers: list[Callable[[], Callable[[], None] | None]] = []
_lock = threading.RLock()  # also taken by the SIGTERM handler, which may interrupt the main thread holding it


def close_at_exit(close: Callable[[], None]) -> None:
    """Call ``close`` when Python exits, unless the object it belongs to is gone by then."""
    held = weakref.WeakMethod(close) if hasattr(close, "__self__") else (lambda: close)
    with _lock:
        _closers.append(held)
    # Only the main thread may set a handler; a handler of the program's own (the serve command's) stays
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_normally)


def _exit_normally(signum, frame) -> None:
    close_all()
    sys.exit(128 + signum)


def close_all() -> None:
    """Call every registered close still alive, newest first; what it registered is forgotten."""
    with _lock:
        closers, _closers[:] = list(_closers), []
    for held in reversed(closers):
        close = held()
        if close is None:
            continue
        try:
            close()
        except Exception:  # one that fails mustn't keep the rest from cleaning up
            logger.exception("closing %r at exit failed", close)


atexit.register(close_all)
