"""The relay between the Daphnes and Redis, which can also refuse: what a Redis that
is down looks like from the Daphnes (`Error 111 connecting to Redis`).

While refusing, the relay's port is closed (a connect is refused, ECONNREFUSED) and
every connection it carried is reset; when it accepts again, the same port listens
again. A refusal can also wait for one command: it begins as a Daphne sends bytes that
hold every marker given (a PUBLISH to one session's group), and those bytes are
dropped, so that command meets the refusal and nothing before it does. It stalls as
`TcpRelay` does; a stall and a refusal are not run at once (the soak's faults on the
relay wait for each other).
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
        self.began = threading.Event()  # a refusal began since the last accept_again
        self._trap: tuple[bytes, ...] = ()
        super().__init__(target_port)

    def refuse(self) -> None:
        """Close the port and reset every connection (on the relay's thread, within 50 ms)."""
        self._refuse.set()

    def refuse_at(self, *markers: bytes) -> None:
        """Refuse once a Daphne sends bytes holding every marker (those bytes dropped)."""
        self._trap = markers

    def accept_again(self) -> None:
        """Listen again on the same port (and wait for no command any more)."""
        self._trap = ()
        self._refuse.clear()
        self.began.clear()

    def _forward(self, sock: socket.socket) -> None:
        trap = self._trap
        if trap and sock.getsockname()[1] == self.port:  # accepted: a Daphne's end
            try:
                waiting = sock.recv(65536, socket.MSG_PEEK)
            except OSError:
                waiting = b""
            if waiting and all(marker in waiting for marker in trap):
                self._trap = ()
                self._refuse.set()
                self._close_port()  # `sock` too, its bytes unread
                return
        super()._forward(sock)

    def _flush(self) -> None:
        # The relay's thread calls this once a round (when not stalled): where the
        # sockets may be closed and the listener swapped without a lock.
        if self._refuse.is_set() != self._refusing:
            self._close_port() if self._refuse.is_set() else self._open_port()
        super()._flush()

    def _accept(self) -> None:
        if not self._refusing:  # else the port closed earlier in this round
            super()._accept()

    def _close_port(self) -> None:
        self.refused_at = time.monotonic()
        self.began.set()
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
