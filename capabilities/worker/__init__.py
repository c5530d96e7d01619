"""The Celery side: tasks, the job executor, the interrupter, heartbeats, memory caps."""
