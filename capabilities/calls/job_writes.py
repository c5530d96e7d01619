"""A call's two writes in Daphne, batched: its new row, and its local run's settle.

Under load, the starts and settles that come in while the database thread is busy
are written together in its next hop (jobs/hop_batches.py), in one transaction: one
commit for the batch instead of one per row, and the slot counts (budgets, fair
shares) read once per queue and principal instead of once per call
(jobs/slot_counts.py). Each item keeps its own answer: a refused start is refused
alone. A batch that fails in the database is rolled back and written again one item
at a time, each autocommitted as a lone call is, so a duplicate callId fails its own
call and no other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError, transaction

from capabilities.access import permissions
from capabilities.access.principal import Principal
from capabilities.calls import availability, budgets
from capabilities.calls.start_ticket import StartTicket
from capabilities.jobs import finished, lifecycle, outages
from capabilities.jobs.hop_batches import HopBatch, run_each
from capabilities.jobs.slot_counts import SlotTally
from capabilities.models import Job
from capabilities.protocol import WireError
from capabilities.protocol.call_digest import call_digest
from capabilities.work import registry

Item = TypeVar("Item")
Result = TypeVar("Result")


class Unavailable(Exception):
    """No live worker can run the capability now: `error` says so."""

    def __init__(self, error: WireError) -> None:
        super().__init__(error.message)
        self.error = error


# Refused before any statement was sent: the batch's transaction is still sound.
_REFUSALS = (Unavailable, budgets.Refused)


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A checked call's row to write: `budgets.create_job`'s arguments."""

    principal: Principal
    job: dict[str, Any] = field(default_factory=dict)
    check: Callable[[], None] | None = None
    """Run just before the row, autocommitted (`start.CallRequest.check`)."""


@dataclass(frozen=True, kw_only=True)
class LocalSettle:
    """A local run's outcome to write: `finished.settle_and_tell`'s arguments."""

    job: Job
    outcome: lifecycle.Outcome
    response: dict[str, Any]
    answered_here: bool
    generation: int = 0
    """The session generation of the connection that answers here (its claim's fence)."""


def create(new: NewJob) -> asyncio.Future[Job]:
    """Queue the row (from the event loop, in order); the job once written."""
    return _creations.submit(new)


def settle(done: LocalSettle) -> asyncio.Future[bool]:
    """Queue a local run's settle; False if something settled the job first."""
    return _settles.submit(done)


def _create_all(items: Sequence[NewJob]) -> list[Job | Exception]:
    # The doors' checks first, each alone: one may write (a session row opened again).
    checked = run_each(items, _check)
    ready = [new for new, found in zip(items, checked, strict=True) if found is None]
    written = iter(_in_one_transaction(ready, _creator(SlotTally()), _creator(None)))
    return [next(written) if found is None else found for found in checked]


def _check(new: NewJob) -> None:
    try:
        _check_doors(new)
    except outages.DATABASE_AWAY:
        raise
    except Exception:
        if not _cancel_won(new.job.get("ticket")):
            raise


def _check_doors(new: NewJob) -> None:
    # The user's permissions and the capability's authorize check: reads, only for a
    # capability that declares either.
    spec = registry.get(new.job["capability"])
    refused = (
        permissions.refusal(spec, new.principal.user_id, new.job["params"])
        if spec is not None
        else None
    )
    if refused is not None:
        raise budgets.NotPermitted(refused)
    if new.check is not None:
        new.check()


def _cancel_won(ticket: StartTicket | None) -> bool:
    """A start being refused before its row: decided now (the ticket sealed), unless its
    cancel won meanwhile. That cancel was answered, so its row is written settled."""
    return ticket is not None and ticket.seal() is not None


def _creator(tally: SlotTally | None) -> Callable[[NewJob], Job]:
    def create_one(new: NewJob) -> Job:
        ticket: StartTicket | None = new.job.get("ticket")
        try:
            # A cancel that won the start was answered already: its row is written
            # settled (nothing will run), whether or not a worker could run it now.
            if ticket is None or not ticket.cancelled:
                error = availability.unavailable(new.job["capability"])
                if error is not None:
                    raise Unavailable(error)
            return _write(new, tally)
        except outages.DATABASE_AWAY:
            raise  # written again (start_retries.py): a cancel may still win meanwhile
        except lifecycle.CallIdInUse:
            raise  # the session holds the callId: writing again would find it again
        except Exception:  # refused, or Redis unreadable
            if _cancel_won(ticket):
                return _write(new, tally)
            in_use = _in_use(new)
            if in_use is not None:
                raise in_use from None
            raise

    return create_one


def _in_use(new: NewJob) -> lifecycle.CallIdInUse | None:
    """A refused start's callId, if the session holds it already (docs/design.md, a call).

    Whatever refused this copy (no worker, a budget, Redis unreadable), the row that
    holds its callId is what the call is: the same call adopts it, another is refused
    as a reused callId. Looked up only on a refusal, in a savepoint of its own so that a
    batch's transaction stays sound; a lookup that fails leaves the refusal as it was.
    """
    job = new.job
    digest = job.get("params_hash") or call_digest(job["capability"], job["params"])
    try:
        with transaction.atomic():
            return lifecycle.call_in_use(job["session_id"], job["call_id"], digest)
    except DatabaseError:
        return None


def _write(new: NewJob, tally: SlotTally | None) -> Job:
    # Looked up at each call: tests hold it (tests/transport/test_consumer_inprocess.py).
    return budgets.create_job(new.principal, tally=tally or SlotTally(), **new.job)


def _settle_all(items: Sequence[LocalSettle]) -> list[bool | Exception]:
    def settle_one(done: LocalSettle) -> bool:
        return finished.settle_and_tell(
            done.job,
            done.outcome,
            done.response,
            answered_here=done.answered_here,
            generation=done.generation,
        )

    return _in_one_transaction(items, settle_one, settle_one)


def _in_one_transaction(
    items: Sequence[Item],
    batched: Callable[[Item], Result],
    alone: Callable[[Item], Result],
) -> list[Result | Exception]:
    """Every item in one transaction; one at a time if the database refused one."""
    if not items:
        return []
    if len(items) == 1:
        return run_each(items, alone)
    try:
        with transaction.atomic():
            outcomes = run_each(items, batched)
            if any(isinstance(o, Exception) and not isinstance(o, _REFUSALS) for o in outcomes):
                raise _WriteAgain
    except _WriteAgain:
        return run_each(items, alone)
    return outcomes


class _WriteAgain(Exception):
    """An item's statement failed: the transaction is rolled back."""


_creations: HopBatch[NewJob, Job] = HopBatch(_create_all)
_settles: HopBatch[LocalSettle, bool] = HopBatch(_settle_all)
