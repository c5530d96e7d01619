"""The WebSocket consumer at /abp/rpc: the ABP session, spoken as JSON-RPC 2.0.

The same shell, session and call service as /abp/ws (capabilities/transport/
consumer.py); only the dialect differs: frames are read by capabilities/jsonrpc/
codec.py and replies written by capabilities/jsonrpc/replies.py.
"""

from __future__ import annotations

from typing import ClassVar

from capabilities.jsonrpc import codec, replies
from capabilities.models import Door
from capabilities.protocol import Message
from capabilities.session.wire import Wire
from capabilities.transport.consumer import ABPConsumer


class JSONRPCConsumer(ABPConsumer):
    """One agent connection speaking JSON-RPC 2.0, with ACP's `$/cancel_request`."""

    door: ClassVar[Door] = Door.RPC
    wire: ClassVar[Wire] = replies

    @staticmethod
    def read_frame(frame: str | bytes) -> Message | None:
        """The frame's message; None for a notification nobody answers."""
        return codec.decode(frame)
