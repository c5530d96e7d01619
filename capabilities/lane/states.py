"""The local lane's one lifecycle: its states, and the events that move it.

    NOT_STARTED --start--> STARTING --ready--> RUNNING
         |                    |                   |
         +--close--> STOPPED  +------close--------+--> STOPPING --ended--> STOPPED

Closing is final: a closed lane starts no process again, whatever comes after.
"""

from __future__ import annotations

import enum
import threading


class LaneState(enum.Enum):
    """Where the lane is in its life."""

    NOT_STARTED = "not started"
    """No process yet: calls go through Celery."""
    STARTING = "starting"
    """Its processes are loading their runners; runs handed to it wait for one."""
    RUNNING = "running"
    """Every process has loaded its runners once; a dead one is started again."""
    STOPPING = "stopping"
    """Closing: no process starts any more, and those alive are being ended."""
    STOPPED = "stopped"
    """Every process it started has ended, and none will start."""


class LaneEvent(enum.Enum):
    """What happens to the lane."""

    START = "start"
    """Its pool starts (Daphne loads the application)."""
    READY = "ready"
    """Every process has loaded its runners."""
    CLOSE = "close"
    """Daphne is going: end the lane."""
    ENDED = "ended"
    """The closing pool's last process has ended."""


# Every move the lane makes; an event its state does not take changes nothing.
_NEXT: dict[tuple[LaneState, LaneEvent], LaneState] = {
    (LaneState.NOT_STARTED, LaneEvent.START): LaneState.STARTING,
    (LaneState.NOT_STARTED, LaneEvent.CLOSE): LaneState.STOPPED,
    (LaneState.STARTING, LaneEvent.READY): LaneState.RUNNING,
    (LaneState.STARTING, LaneEvent.CLOSE): LaneState.STOPPING,
    (LaneState.RUNNING, LaneEvent.CLOSE): LaneState.STOPPING,
    (LaneState.STOPPING, LaneEvent.ENDED): LaneState.STOPPED,
}

# The states in which the pool starts processes (and starts them again as they die).
STARTS_PROCESSES = frozenset({LaneState.STARTING, LaneState.RUNNING})


class LaneLifecycle:
    """The lane's state, shared by its threads; it moves only along `_NEXT`."""

    def __init__(self) -> None:
        self._state = LaneState.NOT_STARTED
        self._changed = threading.Condition()

    @property
    def state(self) -> LaneState:
        """The state now."""
        return self._state

    def starts_processes(self) -> bool:
        """Whether a process may start now (a closing lane starts none)."""
        return self._state in STARTS_PROCESSES

    def on(self, event: LaneEvent) -> bool:
        """Take the event; False if the state now does not take it (nothing changed)."""
        with self._changed:
            after = _NEXT.get((self._state, event))
            if after is None:
                return False
            self._state = after
            self._changed.notify_all()
            return True

    def wait_stopped(self, timeout: float) -> bool:
        """Wait until the lane has stopped (blocking); False if not within `timeout`."""
        with self._changed:
            return self._changed.wait_for(lambda: self._state is LaneState.STOPPED, timeout)
