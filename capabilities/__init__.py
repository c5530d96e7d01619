"""ABP capabilities as cancellable Celery jobs."""
