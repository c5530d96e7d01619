"""A TCP relay on loopback that can freeze: bytes stop flowing both ways, sockets stay open.

For a client whose server stops answering without closing (a stalled network), and,
with `thaw`, for a path that stalls for a while and then delivers what it held back.
New connections can be sent to another port: one address in front of the instances of
a rolling restart, as a Kubernetes Service is.
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
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, socket.socket] = {}
        # Bytes read while frozen, by the socket they are for, in order.
        self._held: dict[socket.socket, list[bytes]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        """Stop forwarding (what arrives is read and held back)."""
        self._frozen.set()

    def thaw(self) -> None:
        """Forward again, what was held back first."""
        self._frozen.clear()

    def send_new_connections_to(self, target_port: int) -> None:
        """Connections from now on go to another port (a Service's endpoints changing)."""
        self._target = target_port

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._listener.close()

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        while not self._closed.is_set():
            if not self._frozen.is_set():
                self._flush()
            for key, _ in self._selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                elif sock in self._peers:  # else closed earlier in this round, with its peer
                    self._forward(sock)
        for sock in self._peers:
            sock.close()
        self._selector.close()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", self._target))
        except OSError:
            client.close()  # the target is down: so is the path
            return
        self._peers[client], self._peers[upstream] = upstream, client
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(upstream, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        target = self._peers[sock]
        if self._frozen.is_set() or self._held.get(target):
            self._held.setdefault(target, []).append(data)
            return
        try:
            target.sendall(data)
        except OSError:
            self._drop(sock)

    def _flush(self) -> None:
        for target, chunks in list(self._held.items()):
            if not chunks:
                continue
            try:
                target.sendall(b"".join(chunks))
            except OSError:
                self._drop(target)
                continue
            chunks.clear()

    def _drop(self, sock: socket.socket) -> None:
        """Close a socket and its peer."""
        for end in (sock, self._peers.get(sock)):
            if end is None or end not in self._peers:
                continue
            self._selector.unregister(end)
            end.close()
            self._peers.pop(end, None)
            self._held.pop(end, None)
