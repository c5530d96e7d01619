"""WebSocket routes."""

from django.urls import path

from capabilities.transport.consumer import ABPConsumer
from capabilities.transport.rpc_consumer import JSONRPCConsumer

websocket_urlpatterns = [
    path("abp/ws", ABPConsumer.as_asgi()),
    path("abp/rpc", JSONRPCConsumer.as_asgi()),
]
