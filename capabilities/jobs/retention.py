"""What is kept, and for how long: result files, uploads, then job rows and ended sessions.

Run by Celery beat (`abp.clean_up`). Result files go RESULT_RETENTION_SECONDS after
their job settled (their download URLs answer 410 from then on, even before this
runs); job rows, and ended sessions left without jobs, go JOB_RETENTION_DAYS after.
Uploads (`uploads/<session id>/<expiry>-<random>`, jobs/uploads.py) go once their
expiry is past by MAX_TIMEOUT_MS: a call that named one just before it expired may
wait that long for a worker to read it. No new call can name it after its expiry.

Files are found through the storage API alone, so it works on any of Django's
storages: each job's files sit under `results/<job id>/` and `inputs/<job id>/`,
and `listdir` gives the job ids. On an object store (S3) those folders are only key
prefixes: a missing one lists as empty, one exists while it holds an object, and
listing costs one LIST request per 1,000 jobs, plus one LIST and one DELETE per
object removed.
"""

from __future__ import annotations

import logging
import os
import uuid
from datetime import datetime, timedelta

from django.core.files.storage import default_storage
from django.db.models import Q
from django.utils import timezone

from capabilities.conf import abp_settings
from capabilities.jobs import uploads
from capabilities.jobs.download_links import RESULTS_DIR
from capabilities.jobs.inputs import INPUTS_DIR
from capabilities.models import AgentSession, Job

logger = logging.getLogger(__name__)

# Spilled inputs of jobs that never ran (cancelled while queued) are left behind.
FOLDERS = (RESULTS_DIR, INPUTS_DIR)
# Job ids per query (SQLite's bound on a statement's parameters is far above this).
BATCH = 500


def clean_up() -> tuple[int, int]:
    """One pass; returns (job folders removed, job rows removed)."""
    now = timezone.now()
    files_before = now - timedelta(seconds=abp_settings().RESULT_RETENTION_SECONDS)
    rows_before = now - timedelta(days=abp_settings().JOB_RETENTION_DAYS)
    folders = sum(_remove_old_files(top, files_before) for top in FOLDERS)
    last_use = now - timedelta(milliseconds=abp_settings().MAX_TIMEOUT_MS)
    removed_uploads = remove_expired_uploads(int(last_use.timestamp()))
    if removed_uploads:
        logger.info("Removed %d expired uploads", removed_uploads)
    deleted_jobs, _ = Job.objects.filter(settled_at__lt=rows_before).delete()
    AgentSession.objects.filter(closed_at__lt=rows_before, jobs__isnull=True).delete()
    if folders or deleted_jobs:
        logger.info("Removed %d job folders and %d old jobs", folders, deleted_jobs)
    return folders, deleted_jobs


def _remove_old_files(top: str, settled_before: datetime) -> int:
    """Delete the folders under `top` of jobs settled before then, or gone."""
    try:
        names, _ = default_storage.listdir(top)
    except FileNotFoundError:  # the filesystem, before the first file
        return 0
    # Only folders named by a job id are ours to judge.
    folders = {name: _job_id(name) for name in names}
    ids = [job_id for job_id in folders.values() if job_id is not None]
    kept: set[uuid.UUID] = set()
    for start in range(0, len(ids), BATCH):
        kept.update(
            Job.objects.filter(pk__in=ids[start : start + BATCH])
            .filter(Q(settled_at__isnull=True) | Q(settled_at__gte=settled_before))
            .values_list("id", flat=True)
        )
    removed = 0
    for name, job_id in folders.items():
        if job_id is None or job_id in kept:
            continue
        path = f"{top}/{name}"
        for file_name in default_storage.listdir(path)[1]:
            default_storage.delete(f"{path}/{file_name}")
        _remove_empty_folder(path)
        removed += 1
    return removed


def remove_expired_uploads(expired_before: int) -> int:
    """Delete the uploads that expired before then (Unix seconds); how many."""
    try:
        sessions, _ = default_storage.listdir(uploads.UPLOADS_DIR)
    except FileNotFoundError:  # the filesystem, before the first upload
        return 0
    removed = 0
    for session in sessions:
        path = f"{uploads.UPLOADS_DIR}/{session}"
        names = default_storage.listdir(path)[1]
        old = [name for name in names if _expired(name, expired_before)]
        for name in old:
            default_storage.delete(f"{path}/{name}")
        removed += len(old)
        if len(old) == len(names):
            _remove_empty_folder(path)
    return removed


def _expired(file_name: str, before: int) -> bool:
    """Whether a file is an upload (by its name) that expired before then."""
    expiry = uploads.expiry_of(file_name)
    return expiry is not None and expiry < before


def _job_id(name: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(name)
    except ValueError:
        return None


def _remove_empty_folder(path: str) -> None:
    """On the filesystem, the folder itself (an object store has no folders to remove)."""
    try:
        local = default_storage.path(path)
    except NotImplementedError:
        return
    try:
        os.rmdir(local)
    except OSError:
        logger.warning("Could not remove the folder %s", local)
