"""The Celery side: tasks, the executor, the interrupter, heartbeats, memory caps, the reaper."""
