"""``/outbox``: the actors' outboxes — rows by state per actor, the failed rows with their
last error — and the requeue of failed rows, through :mod:`rhumbatron.operator.outbox`."""

from typing import Annotated

from fastapi import APIRouter, Query

from rhumbatron.api.dependencies import ProjectsReader, ProjectsWriter, Runtime
from rhumbatron.api.outbox_schemas import OutboxPageBody, RequeueBody, RequeueRequest
from rhumbatron.api.routes._presets import record_errors
from rhumbatron.operator import outbox
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN

__all__ = ["router"]

router = APIRouter()


@router.get(
    "/outbox",
    response_model=OutboxPageBody,
    summary="Read the actors' outboxes: rows by state, and the failed rows",
    responses=record_errors(e404="No project with that ID for this tenant."),
)
async def read_outbox(
    *,
    runtime: Runtime,
    principal: ProjectsReader,
    project_id: Annotated[
        str | None, Query(alias="projectId", pattern=PROJECT_ID_PATTERN.pattern)
    ] = None,
    failed_only: Annotated[
        bool, Query(alias="failedOnly", description="Only actors with a failed row.")
    ] = False,
    after: Annotated[
        str | None, Query(min_length=1, max_length=200, description="The previous page's next.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> OutboxPageBody:
    """The caller's tenant's actors (a project's, with ``projectId``), in key order: each
    outbox's rows per state, from the counters its transactions keep, and its oldest failed
    rows with their ``lastError``. Page with ``after``."""
    page = outbox.outbox_status(
        runtime,
        tenant_id=principal.tenant_id,
        project_id=project_id,
        failed_only=failed_only,
        after=after,
        limit=limit,
    )
    return OutboxPageBody.of(page)


@router.post(
    "/outbox/requeue",
    response_model=RequeueBody,
    summary="Put a project's failed outbox rows back to pending",
    responses=record_errors(e404="No project with that ID for this tenant."),
)
async def requeue_outbox(
    runtime: Runtime, principal: ProjectsWriter, body: RequeueRequest
) -> RequeueBody:
    """Puts the project's ``failed`` rows (only ``eventIds`` when given) back to
    ``pending``, attempts reset, and sets each actor's alarm: the publisher sends them
    again (their stable event IDs keep a second copy out of the stream). Idempotent: a row
    already requeued is not failed any more. Audited (``GET /audit``)."""
    requeued = outbox.requeue_failed(
        runtime,
        tenant_id=principal.tenant_id,
        project_id=body.project_id,
        event_ids=body.event_ids,
    )
    return RequeueBody(requeued=requeued, total=sum(requeued.values()))
