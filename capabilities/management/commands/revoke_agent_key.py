"""Revoke agent keys by prefix: their connections close, their calls are cancelled."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from capabilities.endings.key_revocation import revoke
from capabilities.models import AgentKey


class Command(BaseCommand):
    """`manage.py revoke_agent_key PREFIX [PREFIX ...]`."""

    help = "Revoke agent keys (by the prefix the admin shows, or the whole key)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("keys", nargs="+", help="Key prefixes (or whole keys).")

    def handle(self, *args: Any, **options: Any) -> None:
        prefixes = [_prefix(value) for value in options["keys"]]
        keys = AgentKey.objects.filter(prefix__in=prefixes)
        unknown = sorted(set(prefixes) - set(keys.values_list("prefix", flat=True)))
        if unknown:
            raise CommandError(f"No agent key with prefix {', '.join(unknown)}.")
        count = revoke(keys)
        self.stdout.write(f"Revoked {count} key(s); {len(prefixes) - count} already were.")


def _prefix(value: str) -> str:
    # abp_<prefix>_<secret>, or the prefix alone.
    if value.startswith("abp_"):
        return value[4:].partition("_")[0]
    return value
