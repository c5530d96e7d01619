"""The relay between the Daphnes and Redis, which can also refuse: what a Redis that
is down looks like from the Daphnes (`Error 111 connecting to Redis`).

While refusing, the relay's port is closed (a connect is refused, ECONNREFUSED) and
every connection it carried is reset; when it accepts again, the same port listens
again. It stalls as `TcpRelay` does; a stall and a refusal are not run at once (the
soak's faults on the relay wait for each other).
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time

from tests.support.tcp_relay import TcpRelay

# SO_LINGER on, 0 s: close() sends a reset instead of a FIN.
_RESET = struct.pack("ii", 1, 0)


class RedisRelay(TcpRelay):
    """A `TcpRelay` that can refuse connections for a while."""

    def __init__(self, target_port: int) -> None:
        self._refuse = threading.Event()
        self._refusing = False  # the relay thread's own: its port is closed now
        self.refused_at: float | None = None  # monotonic, when the last refusal began
        super().__init__(target_port)

    def refuse(self) -> None:
        """Close the port and reset every connection (on the relay's thread, within 50 ms)."""
        self._refuse.set()

    def accept_again(self) -> None:
        """Listen again on the same port."""
        self._refuse.clear()

    def _flush(self) -> None:
        # The relay's thread calls this once a round (when not stalled): where the
        # sockets may be closed and the listener swapped without a lock.
        if self._refuse.is_set() != self._refusing:
            self._close_port() if self._refuse.is_set() else self._open_port()
        super()._flush()

    def _close_port(self) -> None:
        self.refused_at = time.monotonic()
        self._selector.unregister(self._listener)
        self._listener.close()
        for sock in list(self._peers):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        for sock in list(self._peers):
            self._drop(sock)  # and its peer
        self._refusing = True

    def _open_port(self) -> None:
        try:
            self._listener = socket.create_server(("127.0.0.1", self.port))
        except OSError:  # the port taken meanwhile (unlikely): tried again next round
            return
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._refusing = False
