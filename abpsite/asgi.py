"""ASGI entry point: HTTP through Django, WebSocket through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402 - after setup

from capabilities.routing import websocket_urlpatterns  # noqa: E402
from capabilities.security import browser_origin_validator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": browser_origin_validator(URLRouter(websocket_urlpatterns)),
    }
)
