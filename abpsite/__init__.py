"""Django project package; the Celery app is loaded with it so tasks register."""

from abpsite.celery import app as celery_app

__all__ = ["celery_app"]
