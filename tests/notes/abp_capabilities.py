# notes/abp_capabilities.py
import csv
import io
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied

from capabilities import CapabilityError, File, JobContext, capability

from .models import Note


@dataclass
class ExportParams:
    title_contains: str = ""


@dataclass
class Export:
    notes: int
    csv: File


@capability(
    "notes.export",
    description="The caller's own notes as a CSV.",
    permissions=["notes.view_note"],
)
def export_notes(params: ExportParams, ctx: JobContext) -> Export:
    if ctx.user is None:
        raise CapabilityError("PERMISSION_DENIED", "Only a user's own notes can be exported.")
    mine = Note.objects.filter(owner=ctx.user, title__contains=params.title_contains)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["id", "title"])
    count = 0
    for count, note in enumerate(mine.order_by("pk").iterator(), start=1):
        ctx.checkpoint()  # a cancel stops the export here
        writer.writerow([note.pk, note.title])
        ctx.report(progress=count, stage="notes")
    data = out.getvalue().encode()
    return Export(notes=count, csv=ctx.save_file(data, mime_type="text/csv", filename="notes.csv"))


@dataclass
class Rename:
    note_id: int
    title: str


def owns_the_note(user: AbstractBaseUser | None, params: dict[str, Any]) -> bool:
    """The note the params name is the caller's: checked before the job is stored."""
    if not Note.objects.filter(pk=params["note_id"], owner=user).exists():
        raise PermissionDenied(f"note {params['note_id']} is not yours")
    return True


@capability(
    "notes.rename",
    description="Renames one of the caller's notes.",
    permissions=["notes.change_note"],
    authorize=owns_the_note,
)
def rename_note(params: Rename, ctx: JobContext) -> Rename:
    Note.objects.filter(pk=params.note_id, owner=ctx.user).update(title=params.title)
    return params
