# notes/views.py
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from capabilities import EnqueueRefused, JobNotFound

from .abp_capabilities import ExportParams, export_notes


@require_POST
@login_required
def start_export(request: HttpRequest) -> JsonResponse:
    params = ExportParams(title_contains=request.POST.get("title_contains", ""))
    try:
        job = export_notes.enqueue(params, user=request.user)
    except EnqueueRefused as refused:  # nothing was stored
        status = 403 if refused.code == "PERMISSION_DENIED" else 400
        return JsonResponse({"code": refused.code, "message": refused.message}, status=status)
    return JsonResponse({"job": job.id, "status": job.status}, status=202)


@login_required
def export_status(request: HttpRequest, job_id: str) -> JsonResponse:
    try:
        job = export_notes.get_result(job_id, user=request.user)  # only the user's own
    except JobNotFound:
        return JsonResponse({"code": "NOT_FOUND"}, status=404)
    answer = {"job": job.id, "status": job.status}
    if job.result is not None:
        answer["notes"] = job.result["notes"]
    if job.error is not None:
        answer["code"] = job.error.code
    return JsonResponse(answer)
