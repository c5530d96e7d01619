"""Create the development superuser, without a prompt. Refuses unless DEBUG is on."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    """`manage.py ensure_dev_superuser`: used by `make run`."""

    help = "Create the development superuser (DEBUG only) and say how to log in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--skip-unless-debug",
            action="store_true",
            help="With DEBUG off, say so and succeed instead of failing (`make run`, which "
            "may be serving a production .env).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            if options["skip_unless_debug"]:
                self.stdout.write("DEBUG is off: no development superuser.")
                return
            raise CommandError("Refusing: a known superuser password is for development only.")
        username = settings.DEV_SUPERUSER_USERNAME
        password = settings.DEV_SUPERUSER_PASSWORD
        users = get_user_model()
        if not users.objects.filter(username=username).exists():
            users.objects.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"Created the development superuser {username!r}.")
        self.stdout.write(f"Admin: /admin/ (user {username!r}, password {password!r}).")
