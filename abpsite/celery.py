"""The Celery application: configured from Django settings (CELERY_* keys)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")

app = Celery("abpsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The default in every thread: capabilities/jobs/queue.py sends through `current_app`.
app.set_default()
# Only the worker loads the tasks (and with them WeasyPrint and Pillow); Daphne
# queues and revokes them by name (capabilities/jobs/queue.py).
app.conf.imports = ("capabilities.worker.tasks",)
