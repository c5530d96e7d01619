"""Durable jobs: the settle-once row, the queue, abort flags, results and notes to sessions."""
