"""WebSocket routes."""

from django.urls import path

from capabilities.transport.consumer import ABPConsumer

websocket_urlpatterns = [
    path("abp/ws", ABPConsumer.as_asgi()),
]
