# Sessions record the user they act for: resumes and deactivations are bound to it.

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

USER_PRINCIPAL = "user:"


def open_sessions_of_users(apps: Any, schema_editor: Any) -> None:
    """Open sessions of a user's key get their user (their principal is `user:<id>`).

    Without it, a deactivation would not find them, nor would the reaper tell them
    from a deleted user's (a null user and a `user:` principal).
    """
    sessions = apps.get_model("capabilities", "AgentSession")
    users = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    alias = schema_editor.connection.alias
    rows = sessions.objects.using(alias).filter(
        closed_at__isnull=True, user__isnull=True, principal__startswith=USER_PRINCIPAL
    )
    for principal in rows.values_list("principal", flat=True).distinct():
        user_id = principal.removeprefix(USER_PRINCIPAL)
        if user_id.isdigit() and users.objects.using(alias).filter(pk=int(user_id)).exists():
            rows.filter(principal=principal).update(user_id=int(user_id))


class Migration(migrations.Migration):
    dependencies = [
        ("capabilities", "0015_job_client_user_cancel_app_door"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="abp_sessions",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(open_sessions_of_users, migrations.RunPython.noop),
    ]
