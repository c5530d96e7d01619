"""What is kept, and for how long: result files, then job rows and ended sessions.

Run by Celery beat (`abp.clean_up`). Result files go RESULT_RETENTION_SECONDS after
their job settled (their download URLs then answer 410); job rows, and ended
sessions left without jobs, go JOB_RETENTION_DAYS after.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.db.models import Q
from django.utils import timezone

from capabilities.jobs.inputs import INPUTS_DIR
from capabilities.models import AgentSession, Job

logger = logging.getLogger(__name__)

RESULTS_DIR = "results"
# Spilled inputs of jobs that never ran (cancelled while queued) are left behind.
FOLDERS = (RESULTS_DIR, INPUTS_DIR)


def clean_up() -> tuple[int, int]:
    """One pass; returns (result folders removed, job rows removed)."""
    now = timezone.now()
    files_before = now - timedelta(seconds=settings.ABP["RESULT_RETENTION_SECONDS"])
    rows_before = now - timedelta(days=settings.ABP["JOB_RETENTION_DAYS"])
    folders = sum(_remove_old_files(top, files_before) for top in FOLDERS)
    deleted_jobs, _ = Job.objects.filter(settled_at__lt=rows_before).delete()
    AgentSession.objects.filter(closed_at__lt=rows_before, jobs__isnull=True).delete()
    if folders or deleted_jobs:
        logger.info("Removed %d result folders and %d old jobs", folders, deleted_jobs)
    return folders, deleted_jobs


def _remove_old_files(top: str, settled_before: datetime) -> int:
    if not default_storage.exists(top):
        return 0
    folders, _ = default_storage.listdir(top)
    keep = set(
        Job.objects.filter(pk__in=folders)
        .filter(Q(settled_at__isnull=True) | Q(settled_at__gte=settled_before))
        .values_list("id", flat=True)
    )
    kept = {str(job_id) for job_id in keep}
    removed = 0
    for folder in folders:
        if folder in kept:
            continue
        path = f"{top}/{folder}"
        for name in default_storage.listdir(path)[1]:
            default_storage.delete(f"{path}/{name}")
        removed += 1
    return removed
