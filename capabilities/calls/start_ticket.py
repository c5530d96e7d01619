"""A cancel that overtakes its call while the call's job is being written.

The consumer starts a call off its lock, so a cancel sent right behind it need not
wait for the insert and the hand-over to Celery. Whichever comes first wins: the
cancel (the event loop's thread), or the seal just before the row is written (the
database thread). A cancel that wins is answered at once, and the row is written
already settled as cancelled and delivered, so nothing runs and a resume finds it
answered. A seal that wins means the row is on its way: the cancel waits for it and
takes the usual path (settle, abort flag, revoke).
"""

from __future__ import annotations

import threading


class StartTicket:
    """One call's start: pending, then cancelled or sealed, once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sealed = False
        self._cancel_reason: str | None = None

    def cancel(self, reason: str) -> bool:
        """Cancel before the row is written; False if it is being written already."""
        with self._lock:
            if self._sealed:
                return False
            if self._cancel_reason is None:
                self._cancel_reason = reason
            return True

    @property
    def cancelled(self) -> bool:
        """Whether a cancel won: the row is (or will be) written settled as cancelled."""
        with self._lock:
            return self._cancel_reason is not None

    def seal(self) -> str | None:
        """About to write the row: the cancel's reason if one came first, else None."""
        with self._lock:
            if self._cancel_reason is None:
                self._sealed = True
            return self._cancel_reason
