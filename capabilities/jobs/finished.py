"""Work that finished: settle its job, then tell its session. The worker and the local lane.

The settle is the conditional one of `lifecycle.settle`, recording in the same write
that the work stopped. Its winner tells the session's group (`job.settled`), whose
connection answers the agent; a loser (a cancel, a timeout or the reaper got there
first, and told the session itself) only records when the work stopped.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from capabilities.jobs import lifecycle, notes
from capabilities.models import Job


def settle_and_tell(
    job: Job,
    outcome: lifecycle.Outcome,
    response: dict[str, Any] | None,
    *,
    answered_here: bool = False,
    generation: int = 0,
) -> bool:
    """Settle finished work and tell the session; False if something settled it first.

    `response`: the call's ABPResponse for the note, or None for the connection to
    read it from the database (files, large results). `answered_here`: the caller is
    the connection holding the call, which claims its delivery in the same write (for
    its session `generation`) and answers at once, so nobody else is told.
    """
    if lifecycle.settle(
        job.id, outcome, work_stopped=True, delivered=answered_here, generation=generation
    ):
        if not answered_here:
            # At once, unless in a batch's transaction: then once the settle is visible.
            note = notes.job_settled(job.call_id, response)
            transaction.on_commit(lambda: notes.notify(str(job.session_id), note))
        return True
    lifecycle.record_stopped(job.id)
    return False
