"""The app's doors on a host's ASGI application: one line in the host's `asgi.py`.

    application = with_abp(get_asgi_application())

HTTP goes to the host's Django, but `/mcp` (the MCP door) and `/abp/uploads` (raw
bytes to storage, before Django reads a body); WebSockets at `/abp/ws` and `/abp/rpc`
go to the consumers, behind the Host and browser-origin checks; the whole is told
the client's address by ABP_TRUSTED_PROXIES. Daphne is adjusted as the doors need
(a close code for oversized frames, a send on a closed socket raising, early upload
limits, a drain on SIGTERM).
"""

from __future__ import annotations

import sys
from typing import Any


def with_abp(django_application: Any) -> Any:
    """The host's Django ASGI application with the app's doors in front of it.

    Call it after `get_asgi_application()`, which sets Django up: the doors import
    models.
    """
    from channels.routing import ProtocolTypeRouter, URLRouter

    from capabilities import tracing
    from capabilities.calls import warm_up
    from capabilities.mcp_door.app import MCPDoor, routed
    from capabilities.transport.browser_origins import browser_origin_validator
    from capabilities.transport.hosts import AllowedHostsValidator
    from capabilities.transport.proxies import behind_trusted_proxies
    from capabilities.transport.routing import websocket_urlpatterns
    from capabilities.web import uploads, uploads_early_limit

    # The event loop and the ORM's worker thread hand the GIL to each other on every
    # settle; Python's default 5 ms hand-over would dominate a cancel's confirmation.
    sys.setswitchinterval(0.0005)
    # Off unless OTEL_* name a collector (docs/operating.md#traces).
    tracing.setup(tracing.WEB_SERVICE)
    _close_oversized_frames_with_1009()
    _refuse_sends_after_disconnect()
    _send_registered_close_codes()
    _drain_on_shutdown()
    uploads_early_limit.install()
    # Warm before the first call: the lane's processes start loading now.
    warm_up.begin()
    # The client's address comes from trusted proxies' headers before anything reads
    # it: Django's REMOTE_ADDR and the consumer's per-address budgets alike.
    return warm_up.on_first_event(
        behind_trusted_proxies(
            ProtocolTypeRouter(
                {
                    "http": routed(MCPDoor(), uploads.in_front_of(django_application)),
                    "websocket": AllowedHostsValidator(
                        browser_origin_validator(URLRouter(websocket_urlpatterns))
                    ),
                }
            )
        )
    )


def _close_oversized_frames_with_1009() -> None:
    """Make Daphne answer a frame over its size limit with close code 1009.

    Daphne enforces `--websocket-max-message-size` through autobahn, whose factory
    defaults to `failByDrop`: the TCP connection is dropped without a close frame.
    Autobahn also refuses 1009 from application code, so this option is the only
    way the agent learns why it was disconnected, as PROTOCOL.md promises.

    The same options give a client `CLOSE_REPLY_SECONDS` to answer our close frame
    (autobahn waits 1 s, then drops the connection). A client busy for longer, then
    replying to a dropped socket, gets a reset, and a client library may lose the
    frames it read with the close: a refusal's `notifications/error` among them.
    """
    from daphne.ws_protocol import WebSocketFactory

    reset = WebSocketFactory.resetProtocolOptions

    def reset_without_drop(self: WebSocketFactory) -> None:
        reset(self)
        self.failByDrop = False
        self.closeHandshakeTimeout = CLOSE_REPLY_SECONDS

    WebSocketFactory.resetProtocolOptions = reset_without_drop


def _refuse_sends_after_disconnect() -> None:
    """Make a WebSocket send on a closed connection raise, as the ASGI spec says.

    ASGI's WebSocket spec (2.4): a send on a closed connection raises an OSError
    subclass (uvicorn does since 0.27). Daphne 4
    drops it without a word once the client is gone, so a result sent between the
    client's close and our disconnect handler would look delivered and be lost to
    the agent's resume. Raising lets the consumer give the result back.
    """
    from daphne.server import Server

    handle_reply = Server.handle_reply

    async def handle_reply_or_raise(
        self: Server, protocol: object, message: dict[str, Any]
    ) -> None:
        details = self.connections.get(protocol)
        if message.get("type") == "websocket.send" and (
            details is None or details.get("disconnected")
        ):
            raise ConnectionClosedError("The WebSocket is closed.")
        await handle_reply(self, protocol, message)

    Server.handle_reply = handle_reply_or_raise


def _send_registered_close_codes() -> None:
    """Let the app close a WebSocket with 1012 (Service Restart) or 1013 (Try Again Later).

    Both are IANA-registered codes for a server to send, and every client of ours
    resumes after them. Autobahn lets application code send only 1000 and 3000-4999 and
    raises on the others, so Daphne's close failed and the client saw the connection
    drop (1006) instead of being told why. Its own close-frame sender takes any code.
    """
    from daphne.ws_protocol import WebSocketProtocol

    close = WebSocketProtocol.serverClose

    def server_close(self: WebSocketProtocol, code: int | None = None) -> None:
        if code in REGISTERED_SERVER_CODES and self.state == self.STATE_OPEN:
            self.sendCloseFrame(code=code, isReply=False)
        else:
            close(self, code)

    WebSocketProtocol.serverClose = server_close


REGISTERED_SERVER_CODES = (1012, 1013)
# How long a client has to answer our close frame before the connection is dropped.
CLOSE_REPLY_SECONDS = 3.0
# How long a stopping Daphne waits for its sessions to detach before it cancels what is
# left (Kubernetes' default grace is 30 s; a detach takes milliseconds).
DRAIN_SECONDS = 5.0


def _drain_on_shutdown() -> None:
    """On SIGTERM, close every WebSocket with 1012 before Daphne cancels the consumers.

    Daphne's shutdown cancels every application at once, and its clients see the TCP
    connection drop (1006). First, the process stops taking sessions (`/readyz` 503, new
    sockets closed with 1012), and every open socket is closed with 1012, "Service
    Restart": each consumer detaches its session as on any close (resumable, results
    kept for the resume), and the client resumes on another instance at once. Daphne
    cancels what is still running `DRAIN_SECONDS` later.
    """
    import asyncio
    import logging

    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import defer

    from capabilities.calls import draining
    from capabilities.lane import lane
    from capabilities.transport.consumer import SERVICE_RESTART

    kill_all = Server.kill_all_applications

    def kill_all_then_the_lane(self: Server) -> Any:
        # The lane's processes are the fork server's children, not Daphne's: nothing
        # else ends them when Daphne exits. Closing returns once every one has ended.
        killed = kill_all(self)
        lane.current().close()
        return killed

    def drain_then_kill(self: Server) -> Any:
        draining.begin()
        closing = []
        for protocol, details in list(self.connections.items()):
            if isinstance(protocol, WebSocketProtocol) and protocol.state == protocol.STATE_OPEN:
                protocol.serverClose(code=SERVICE_RESTART)
                instance = details.get("application_instance")
                if instance is not None and not instance.done():
                    closing.append(instance)
        logging.getLogger("capabilities").info(
            "Stopping: %d sessions told to resume elsewhere (1012)", len(closing)
        )
        if not closing:
            return kill_all_then_the_lane(self)
        ended = defer.Deferred.fromFuture(
            asyncio.ensure_future(asyncio.wait(closing, timeout=DRAIN_SECONDS))
        )
        ended.addBoth(lambda _: kill_all_then_the_lane(self))
        return ended

    Server.kill_all_applications = drain_then_kill


class ConnectionClosedError(OSError):
    """A send on a WebSocket the client already closed."""
