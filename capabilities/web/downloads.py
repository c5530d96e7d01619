"""Serving result files named by signed download links (capabilities/jobs/download_links.py).

A tampered token is 403, an expired one (or a file past its retention) 410, another
file name 404.
"""

from __future__ import annotations

from django.core.files.storage import default_storage
from django.http import FileResponse, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from capabilities.jobs import download_links


@require_GET
def download(request: HttpRequest, token: str, filename: str) -> HttpResponseBase:
    """Serve a result file named by a valid, unexpired token."""
    try:
        link = download_links.resolve(token, filename)
    except download_links.Refused as refused:
        return HttpResponse(refused.message, status=refused.status)
    if not default_storage.exists(link.name):
        return HttpResponse("This result is no longer kept.", status=410)
    response = FileResponse(
        default_storage.open(link.name, "rb"),
        as_attachment=True,
        filename=link.filename,
        content_type=link.mime_type,
    )
    response["Cache-Control"] = "private, no-store"
    return response
