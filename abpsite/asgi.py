"""ASGI entry point: the demo's Django with the app's doors (capabilities/asgi.py)."""

import os

from django.core.asgi import get_asgi_application

from capabilities.asgi import with_abp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")
application = with_abp(get_asgi_application())
