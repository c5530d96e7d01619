"""The Celery application: configured from Django settings (CELERY_* keys)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")

app = Celery("abpsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
