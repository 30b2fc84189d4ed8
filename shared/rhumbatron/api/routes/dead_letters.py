"""``/dead-letters``: list, inspect, retry and dismiss dead letters, through
:mod:`rhumbatron.operator`."""

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from rhumbatron import operator
from rhumbatron.api.dependencies import DeadLettersReader, DeadLettersWriter, Runtime, Streams
from rhumbatron.api.letter_group_schemas import (
    GroupActionBody,
    GroupActionRequest,
    LetterGroupBody,
    LetterGroupsBody,
)
from rhumbatron.api.routes._presets import base_errors, record_errors, refusable_errors
from rhumbatron.api.schemas import (
    DeadLetterDetail,
    DeadLetterPageBody,
    DeadLetterSummary,
    RetryBody,
)
from rhumbatron.errors import DeadLetterNotFoundError, InvalidRequestError
from rhumbatron.operator import letter_groups
from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN

__all__ = ["router"]

LetterId = Annotated[str, Path(alias="id", min_length=1, max_length=64)]
GroupId = Annotated[str, Path(alias="groupId", pattern=r"^grp_[0-9a-f]{16}$")]

router = APIRouter()


@router.get(
    "/dead-letters",
    response_model=DeadLetterPageBody,
    summary="List dead letters",
    responses=base_errors(),
)
async def list_dead_letters(
    *,
    runtime: Runtime,
    principal: DeadLettersReader,
    status: Annotated[
        Literal["open", "closed", "all"], Query(description="Open letters unless asked.")
    ] = "open",
    kind: Annotated[DeadLetterKind | None, Query()] = None,
    queue: Annotated[str | None, Query(max_length=64, description="The origin queue.")] = None,
    project_id: Annotated[
        str | None, Query(alias="projectId", pattern=PROJECT_ID_PATTERN.pattern)
    ] = None,
    after: Annotated[
        str | None, Query(min_length=1, max_length=64, description="The previous page's next.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=operator.MAX_PAGE)] = 50,
) -> DeadLetterPageBody:
    """The caller's tenant's letters, oldest first. Page with ``after``: the ``next`` of
    the previous page."""
    try:
        page = operator.list_dead_letters(
            runtime,
            tenant_id=principal.tenant_id,
            status=None if status == "all" else DeadLetterStatus(status),
            kind=kind,
            queue=queue,
            project_id=project_id,
            after=after,
            limit=limit,
        )
    except DeadLetterNotFoundError as exc:
        raise InvalidRequestError(str(exc), field="after") from None
    return DeadLetterPageBody.of(page)


@router.get(
    "/dead-letters/groups",
    response_model=LetterGroupsBody,
    summary="List the open dead letters in groups that failed the same way",
    responses=base_errors(),
)
async def list_dead_letter_groups(
    runtime: Runtime, principal: DeadLettersReader
) -> LetterGroupsBody:
    """The caller's tenant's open letters grouped by kind, queue (or subscription), command
    type and failure reason, the reason's IDs, numbers and quoted values elided — so the
    same error about different records is one group. The largest group first; a group
    that can only be dismissed says ``retryable: false``."""
    groups = letter_groups.group_dead_letters(runtime, tenant_id=principal.tenant_id)
    return LetterGroupsBody(groups=[LetterGroupBody.of(g) for g in groups])


@router.post(
    "/dead-letters/groups/{groupId}/retry",
    response_model=GroupActionBody,
    summary="Retry every open dead letter of a group",
    responses=refusable_errors(
        e404="No group of open letters with that ID for this tenant: list the groups again.",
        e409="The group's letters can only be dismissed.",
    ),
)
async def retry_dead_letter_group(
    runtime: Runtime,
    streams: Streams,
    principal: DeadLettersWriter,
    group_id: GroupId,
    body: GroupActionRequest,
) -> GroupActionBody:
    """Retries each open letter of the group, as one Retry each: a letter whose attempt
    another Retry reserved is ``already``, so retrying a group twice sends nothing twice.
    ``dryRun`` lists the letters it would retry and sends nothing."""
    if not body.dry_run:
        await streams.ready()
    action = await letter_groups.retry_group(
        runtime, group_id, tenant_id=principal.tenant_id, dry_run=body.dry_run
    )
    return GroupActionBody.of(action)


@router.post(
    "/dead-letters/groups/{groupId}/dismiss",
    response_model=GroupActionBody,
    summary="Dismiss every open dead letter of a group",
    responses=record_errors(
        e404="No group of open letters with that ID for this tenant: list the groups again."
    ),
)
async def dismiss_dead_letter_group(
    runtime: Runtime, principal: DeadLettersWriter, group_id: GroupId, body: GroupActionRequest
) -> GroupActionBody:
    """Dismisses each open letter of the group; one closed meanwhile is ``already``.
    ``dryRun`` lists the letters it would dismiss and closes nothing."""
    action = letter_groups.dismiss_group(
        runtime, group_id, tenant_id=principal.tenant_id, dry_run=body.dry_run
    )
    return GroupActionBody.of(action)


@router.get(
    "/dead-letters/{id}",
    response_model=DeadLetterDetail,
    summary="Inspect a dead letter",
    responses=record_errors(),
)
async def inspect_dead_letter(
    runtime: Runtime, principal: DeadLettersReader, dead_letter_id: LetterId
) -> DeadLetterDetail:
    """The letter with its full command payload, last error, attempts and resolution."""
    inspection = operator.inspect_dead_letter(
        runtime, dead_letter_id, tenant_id=principal.tenant_id
    )
    return DeadLetterDetail.of_inspection(inspection)


@router.post(
    "/dead-letters/{id}/retry",
    response_model=RetryBody,
    summary="Send a dead-lettered command again",
    responses=refusable_errors(),
)
async def retry_dead_letter(
    runtime: Runtime, streams: Streams, principal: DeadLettersWriter, dead_letter_id: LetterId
) -> RetryBody:
    """Sends the command again with ``attempt + 1`` (agent.wake on agent-wakeups, others
    on integration), exactly once: a second Retry of the same attempt sends nothing and
    answers ``sent: false`` with ``alreadyRetriedAs``. The letter stays open until the
    command succeeds or fails again. A poison-event letter can only be dismissed (409)."""
    await streams.ready()
    outcome = await operator.retry_dead_letter(
        runtime, dead_letter_id, tenant_id=principal.tenant_id
    )
    return RetryBody.of(outcome)


@router.post(
    "/dead-letters/{id}/dismiss",
    response_model=DeadLetterSummary,
    summary="Dismiss a dead letter",
    responses=refusable_errors(),
)
async def dismiss_dead_letter(
    runtime: Runtime, principal: DeadLettersWriter, dead_letter_id: LetterId
) -> DeadLetterSummary:
    """Closes an open letter with the resolution ``dismissed``."""
    letter = operator.dismiss_dead_letter(runtime, dead_letter_id, tenant_id=principal.tenant_id)
    return DeadLetterSummary.of(letter)
