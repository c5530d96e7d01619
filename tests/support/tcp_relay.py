"""A TCP relay on loopback that can freeze: bytes stop flowing both ways, sockets stay open.

For a client whose server stops answering without closing (a stalled network).
"""

from __future__ import annotations

import selectors
import socket
import threading


class TcpRelay:
    """Forwards 127.0.0.1:<port> to a target port, on a thread, until closed."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        """Stop forwarding (what arrives is read and held back)."""
        self._frozen.set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._listener.close()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        while not self._closed.is_set():
            for key, _ in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    client, _ = self._listener.accept()
                    upstream = socket.create_connection(("127.0.0.1", self._target))
                    peers[client], peers[upstream] = upstream, client
                    selector.register(client, selectors.EVENT_READ)
                    selector.register(upstream, selectors.EVENT_READ)
                    continue
                if sock not in peers:
                    continue  # closed earlier in this round, with its peer
                data = sock.recv(65536)
                if not data:
                    for end in (sock, peers[sock]):
                        selector.unregister(end)
                        end.close()
                        peers.pop(end, None)
                    continue
                if not self._frozen.is_set():
                    peers[sock].sendall(data)
        for sock in peers:
            sock.close()
        selector.close()
