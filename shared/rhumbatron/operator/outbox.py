"""The actors' outboxes as an operator reads and steers them: rows by state per actor, the
failed rows with their last error, and a requeue — each within the caller's tenant.

An actor's counts are the counters its transactions keep (``outbox.counts_by_state``: four
rows, whatever the outbox holds); the failed rows are at most :data:`FAILED_ROWS_SHOWN` per
actor, oldest first. A file this call had to open is closed again, so a walk over every
actor never keeps thousands of files open. Requeue puts ``failed`` rows back to
``pending`` with their attempts reset and sets the actor's alarm (the publisher's own
``requeue_failed_rows``); a second requeue finds nothing failed and does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import ProjectNotFoundError
from rhumbatron.operator.context import OperatorContext

if TYPE_CHECKING:
    from rhumbatron.actors.actor import Actor, ActorRef

__all__ = [
    "FAILED_ROWS_SHOWN",
    "ActorOutbox",
    "FailedRow",
    "OutboxContext",
    "OutboxPage",
    "outbox_status",
    "requeue_failed",
]

#: Failed rows listed per actor (the counts say how many there are in all).
FAILED_ROWS_SHOWN = 20


class OutboxContext(OperatorContext, Protocol):
    """The operator's port, and the actor files under the state directory."""

    def actor_refs(self) -> Iterator[ActorRef]: ...

    def actor(self, ref: ActorRef) -> Actor: ...


@dataclass(frozen=True, slots=True)
class FailedRow:
    event_id: str
    event_type: str
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ActorOutbox:
    """One actor's outbox: rows per state, and its oldest failed rows."""

    actor: str
    project_id: str
    counts: dict[str, int]
    failed: tuple[FailedRow, ...]


@dataclass(frozen=True, slots=True)
class OutboxPage:
    """Actors in key order; ``next_after`` is the cursor of the next page (None: the last)."""

    actors: Sequence[ActorOutbox]
    next_after: str | None


def _refs(app: OutboxContext, tenant_id: str, project_id: str | None) -> Iterator[ActorRef]:
    """The caller's actors (of ``project_id`` when given), in key order."""
    owners: dict[str, str | None] = {}
    refs = sorted(app.actor_refs(), key=lambda ref: ref.key)
    for ref in refs:
        if project_id is not None and ref.project_id != project_id:
            continue
        if ref.project_id not in owners:
            owners[ref.project_id] = app.project_tenant(ref.project_id)
        if tenant_id in (ANY_TENANT, owners[ref.project_id]):
            yield ref


def _read(actor: Actor) -> tuple[dict[str, int], tuple[FailedRow, ...]]:
    from rhumbatron.actors.outbox import counts_by_state

    was_open = actor.is_open
    try:
        db = actor.connection
        failed = db.execute(
            "SELECT event_id, event_type, attempts, last_error FROM outbox "
            "WHERE state = 'failed' ORDER BY seq LIMIT ?",
            (FAILED_ROWS_SHOWN,),
        ).fetchall()
        counts = counts_by_state(db)
    finally:
        if not was_open:
            actor.close()
    return counts, tuple(
        FailedRow(str(r[0]), str(r[1]), int(r[2]), None if r[3] is None else str(r[3]))
        for r in failed
    )


def outbox_status(
    app: OutboxContext,
    *,
    tenant_id: str,
    project_id: str | None = None,
    failed_only: bool = False,
    after: str | None = None,
    limit: int = 50,
) -> OutboxPage:
    """The caller's actors' outboxes, in actor-key order after ``after``; ``failed_only``
    keeps the actors with a failed row. Raises :class:`ProjectNotFoundError` for a
    ``project_id`` this tenant has no actor of."""
    found: list[ActorOutbox] = []
    seen_project = project_id is None
    for ref in _refs(app, tenant_id, project_id):
        seen_project = True
        if after is not None and ref.key <= after:
            continue
        counts, failed = _read(app.actor(ref))
        if failed_only and not counts.get("failed"):
            continue
        if len(found) == limit:
            return OutboxPage(found, found[-1].actor)
        found.append(ActorOutbox(ref.key, ref.project_id, counts, failed))
    if not seen_project:
        raise ProjectNotFoundError(f"no project {project_id!r}; check the project ID")
    return OutboxPage(found, None)


def requeue_failed(
    app: OutboxContext,
    *,
    tenant_id: str,
    project_id: str,
    event_ids: Sequence[str] | None = None,
) -> dict[str, int]:
    """Put the project's ``failed`` outbox rows (only ``event_ids`` when given) back to
    ``pending``; returns the rows requeued per actor key (actors with none left out).
    Raises :class:`ProjectNotFoundError` for a project this tenant has no actor of."""
    from rhumbatron.actors.publisher import requeue_failed_rows

    requeued: dict[str, int] = {}
    refs = list(_refs(app, tenant_id, project_id))
    if not refs:
        raise ProjectNotFoundError(f"no project {project_id!r}; check the project ID")
    for ref in refs:
        count = requeue_failed_rows(app.actor(ref), list(event_ids) if event_ids else None)
        if count:
            requeued[ref.key] = count
    return requeued
