"""Signed, expiring download URLs for results too large to inline.

A URL carries a token signed with the SECRET_KEY (Django's signing, with a
timestamp): it names the job, its session, the stored file and the name it is
served under, so nobody can point one at another session's job or at any other
file, nor serve a PDF as `invoice.html`, and it expires. A tampered token is 403,
an expired one (or a file past its retention) 410, another file name 404.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.urls import reverse
from django.utils import timezone

from capabilities.models import Job

SALT = "capabilities.downloads"


def reference(job: Job, ref: dict[str, Any], *, base_url: str) -> dict[str, Any]:
    """The BinaryDataReference of a stored result file."""
    ttl = settings.ABP["DOWNLOAD_URL_TTL_SECONDS"]
    token = signing.dumps(
        {
            "j": job.id.hex,
            "s": job.session_id.hex,
            "n": ref["$file"],
            "m": ref["mimeType"],
            "f": ref["filename"],
        },
        salt=SALT,
        compress=True,
    )
    path = reverse("abp-download", kwargs={"token": token, "filename": ref["filename"]})
    expires: datetime = timezone.now() + timedelta(seconds=ttl)
    return {
        "downloadUrl": base_url.rstrip("/") + path,
        "mimeType": ref["mimeType"],
        "size": ref["size"],
        "filename": ref["filename"],
        "expiresAt": expires.isoformat().replace("+00:00", "Z"),
    }


@dataclass(frozen=True, kw_only=True)
class Link:
    """What a valid download link names."""

    name: str
    mime_type: str
    filename: str


class Refused(Exception):
    """The link may not be served: `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def resolve(token: str, filename: str) -> Link:
    """The file a token names; Refused (403, 404 or 410) if it may not be served."""
    try:
        claims = signing.loads(token, salt=SALT, max_age=settings.ABP["DOWNLOAD_URL_TTL_SECONDS"])
    except signing.SignatureExpired:
        raise Refused(410, "This download link has expired.") from None
    except signing.BadSignature:
        raise Refused(403, "This download link is not valid.") from None
    name = claims["n"]
    job_id = uuid.UUID(claims["j"])
    owned = Job.objects.filter(pk=job_id, session_id=uuid.UUID(claims["s"])).exists()
    # The signature already binds these; checking again keeps a leaked SECRET_KEY
    # from reaching files outside the job's own folder.
    if not owned or not name.startswith(f"results/{job_id}/"):
        raise Refused(403, "This download link is not valid.")
    # The name in the path is the one a browser saves the file under (and guesses its
    # type from): only the signed one.
    if filename != claims.get("f"):
        raise Refused(404, "No such file.")
    return Link(name=name, mime_type=claims["m"], filename=filename)
