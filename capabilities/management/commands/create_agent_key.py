"""Create an agent key and print it, once: only its hash is kept."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from capabilities.access.agent_keys import create_key


class Command(BaseCommand):
    """`manage.py create_agent_key NAME`."""

    help = "Create an agent key for NAME and print it (it cannot be shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who holds the key (shown in the admin).")
        parser.add_argument(
            "--max-concurrent-calls", type=int, default=None, help="Jobs running at once."
        )
        parser.add_argument(
            "--max-queued-calls", type=int, default=None, help="Calls queued per session."
        )
        parser.add_argument("--calls-per-minute", type=int, default=None)
        parser.add_argument(
            "--max-open-sessions",
            type=int,
            default=None,
            help="Sessions open at once, across every door.",
        )
        parser.add_argument(
            "--quiet", action="store_true", help="Print the key alone (for scripts)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key, plaintext = create_key(
            options["name"],
            max_concurrent_calls=options["max_concurrent_calls"],
            max_queued_calls=options["max_queued_calls"],
            calls_per_minute=options["calls_per_minute"],
            max_open_sessions=options["max_open_sessions"],
        )
        if options["quiet"]:
            self.stdout.write(plaintext)
            return
        self.stdout.write(
            f"Agent key for {key.name!r} (prefix {key.prefix}); store it now, it is not kept:"
        )
        self.stdout.write(plaintext)
