"""The Celery application: configured from Django settings (CELERY_* keys), with the app's
tasks, queues and beat schedule (capabilities/celery_setup.py)."""

import os

from celery import Celery

from capabilities.celery_setup import configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")

app = Celery("abpsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
configure(app)
