"""Signed, expiring download URLs for results too large to inline.

A URL carries a token signed with the SECRET_KEY (Django's signing, with a
timestamp): it names the job, its session, the stored file and the name it is
served under, so nobody can point one at another session's job or at any other
file, nor serve a PDF as `invoice.html`, and it expires. A tampered token is 403,
an expired one (or a file past its retention) 410, another file name 404.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.files.storage import default_storage
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

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


@require_GET
def download(request: HttpRequest, token: str, filename: str) -> HttpResponseBase:
    """Serve a result file named by a valid, unexpired token."""
    try:
        claims = signing.loads(token, salt=SALT, max_age=settings.ABP["DOWNLOAD_URL_TTL_SECONDS"])
    except signing.SignatureExpired:
        return HttpResponse("This download link has expired.", status=410)
    except signing.BadSignature:
        return HttpResponse("This download link is not valid.", status=403)
    name = claims["n"]
    job_id = uuid.UUID(claims["j"])
    owned = Job.objects.filter(pk=job_id, session_id=uuid.UUID(claims["s"])).exists()
    # The signature already binds these; checking again keeps a leaked SECRET_KEY
    # from reaching files outside the job's own folder.
    if not owned or not name.startswith(f"results/{job_id}/"):
        return HttpResponse("This download link is not valid.", status=403)
    # The name in the path is the one a browser saves the file under (and guesses its
    # type from): only the signed one. Links signed before it was signed have none.
    if filename != claims.get("f"):
        return HttpResponse("No such file.", status=404)
    if not default_storage.exists(name):
        return HttpResponse("This result is no longer kept.", status=410)
    response = FileResponse(
        default_storage.open(name, "rb"),
        as_attachment=True,
        filename=filename,
        content_type=claims["m"],
    )
    response["Cache-Control"] = "private, no-store"
    return response
