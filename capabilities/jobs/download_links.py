"""Signed, expiring download URLs for results too large to inline.

A URL carries a token signed with the SECRET_KEY (Django's signing, with a
timestamp): it names the job, its session, the stored file and the name it is
served under, so nobody can point one at another session's job or at any other
file, nor serve a PDF as `invoice.html`, and it expires. A tampered token is 403,
an expired one 410, another file name 404, and a result past its retention 410
(whether or not the clean-up has deleted the file yet).

These checks are all ours and run before any byte is served, whichever way the
web process then serves it (capabilities/web/downloads.py): streamed from the
storage, or redirected to the store's own signed URL, which lives no longer than
the link and the retention it was checked against.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import signing
from django.urls import reverse
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.models import Job

SALT = "capabilities.downloads"
RESULTS_DIR = "results"


def folder(job_id: uuid.UUID | str) -> str:
    """Where a job's result files are stored (names relative to the storage)."""
    return f"{RESULTS_DIR}/{job_id}/"


def reference(job: Job, ref: dict[str, Any], *, base_url: str) -> dict[str, Any]:
    """The BinaryDataReference of a stored result file."""
    ttl = abp_settings().DOWNLOAD_URL_TTL_SECONDS
    # The clock the signature's timestamp is read from.
    expires = datetime.fromtimestamp(int(time.time()) + ttl, tz=UTC)
    token = signing.dumps(
        {
            "j": job.id.hex,
            "s": job.session_id.hex,
            "n": ref["$file"],
            "m": ref["mimeType"],
            "f": ref["filename"],
            # When it expires, for whoever serves it: a store's signed URL must not
            # outlive it. The signature's own timestamp is what refuses it.
            "e": int(expires.timestamp()),
        },
        salt=SALT,
        compress=True,
    )
    path = reverse("abp-download", kwargs={"token": token, "filename": ref["filename"]})
    return {
        "downloadUrl": base_url.rstrip("/") + path,
        "mimeType": ref["mimeType"],
        "size": ref["size"],
        "filename": ref["filename"],
        "expiresAt": expires.isoformat().replace("+00:00", "Z"),
    }


@dataclass(frozen=True, kw_only=True)
class Link:
    """What a valid download link names, and until when it may be served."""

    name: str
    mime_type: str
    filename: str
    # The earlier of the link's expiry and the end of the result's retention.
    valid_until: datetime


class Refused(Exception):
    """The link may not be served: `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


GONE = "This result is no longer kept."


def resolve(token: str, filename: str) -> Link:
    """The file a token names; Refused (403, 404 or 410) if it may not be served."""
    ttl = abp_settings().DOWNLOAD_URL_TTL_SECONDS
    try:
        claims = signing.loads(token, salt=SALT, max_age=ttl)
    except signing.SignatureExpired:
        raise Refused(410, "This download link has expired.") from None
    except signing.BadSignature:
        raise Refused(403, "This download link is not valid.") from None
    name = claims["n"]
    job_id = uuid.UUID(claims["j"])
    row = (
        Job.objects.filter(pk=job_id, session_id=uuid.UUID(claims["s"]))
        .values("settled_at")
        .first()
    )
    # The signature already binds these; checking again keeps a leaked SECRET_KEY
    # from reaching files outside the job's own folder.
    if row is None or not name.startswith(folder(job_id)) or ".." in name.split("/"):
        raise Refused(403, "This download link is not valid.")
    # The name in the path is the one a browser saves the file under (and guesses its
    # type from): only the signed one.
    if filename != claims.get("f"):
        raise Refused(404, "No such file.")
    now = timezone.now()
    valid_until = now + timedelta(seconds=ttl)
    if isinstance(claims.get("e"), int):
        valid_until = min(valid_until, datetime.fromtimestamp(claims["e"], tz=UTC))
    settled_at: datetime | None = row["settled_at"]
    if settled_at is not None:
        kept_until = settled_at + timedelta(seconds=abp_settings().RESULT_RETENTION_SECONDS)
        if kept_until <= now:
            raise Refused(410, GONE)
        valid_until = min(valid_until, kept_until)
    return Link(name=name, mime_type=claims["m"], filename=filename, valid_until=valid_until)
