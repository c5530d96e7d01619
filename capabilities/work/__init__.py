"""The work itself, one folder per capability: its spec and its runner.

No Celery, no database, no agent.
"""
