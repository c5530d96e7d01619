"""Create an agent key and print it, once: only its hash is kept."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from capabilities.access.agent_keys import create_key
from capabilities.work import registry


class Command(BaseCommand):
    """`manage.py create_agent_key NAME [--user USERNAME] [--scope CAPABILITY ...]`."""

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
            "--user",
            default=None,
            help="The user its calls run for (ctx.user), with that user's permissions; "
            "without it, a service key that runs for nobody.",
        )
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            metavar="CAPABILITY",
            help="A capability the key may call (repeat it); none: every capability its "
            "user may call.",
        )
        parser.add_argument(
            "--quiet", action="store_true", help="Print the key alone (for scripts)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        owner = _user(options["user"]) if options["user"] else None
        unknown = [name for name in options["scope"] if registry.get(name) is None]
        if unknown:
            raise CommandError(f"No capability {', '.join(map(repr, unknown))} is registered.")
        key, plaintext = create_key(
            options["name"],
            max_concurrent_calls=options["max_concurrent_calls"],
            max_queued_calls=options["max_queued_calls"],
            calls_per_minute=options["calls_per_minute"],
            max_open_sessions=options["max_open_sessions"],
            owner=owner,
            scopes=options["scope"],
        )
        if options["quiet"]:
            self.stdout.write(plaintext)
            return
        self.stdout.write(
            f"Agent key for {key.name!r} (prefix {key.prefix}); store it now, it is not kept:"
        )
        self.stdout.write(plaintext)


def _user(username: str) -> Any:
    users = get_user_model()
    try:
        return users._default_manager.get_by_natural_key(username)
    except users.DoesNotExist:
        raise CommandError(f"No user {username!r}.") from None
