"""``/schedules``: the tenant's clocks whose fires land ``schedule.fired``, through
:class:`~rhumbatron.reactions.schedule_registry.ScheduleRegistry`.

Authorization reuses the agents' scopes, as subscriptions do: ``agents:read`` to list and
read, ``agents:write`` to create, enable, disable and delete. Tenancy fails closed: another
tenant's schedule is the same 404 as one that does not exist, and a schedule fires only into
a project of its own tenant. A platform token (tenant ``*``) reads and governs every tenant's
schedules, but owns nothing, so it cannot create one.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic.alias_generators import to_camel

from rhumbatron.api.access import own_tenant
from rhumbatron.api.dependencies import AgentsReader, AgentsWriter, Runtime
from rhumbatron.api.errors import error_responses
from rhumbatron.api.routes._presets import base_errors, record_errors
from rhumbatron.api.schedule_schemas import (
    CreateScheduleRequest,
    ScheduleBody,
    ScheduleFiredBody,
    ScheduleListBody,
    UpdateScheduleRequest,
)
from rhumbatron.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    ScheduleRegistryError,
)
from rhumbatron.reactions.schedule_models import SCHEDULE_ID_PATTERN, ScheduleRecord, ScheduleTiming
from rhumbatron.reactions.schedule_registry import ScheduleRegistry

if TYPE_CHECKING:
    from rhumbatron.api.ports import ApiRuntime

__all__ = ["router"]

_log = logging.getLogger(__name__)

_NOT_FOUND = "No such schedule for this tenant (another tenant's is not found either)."
_ScheduleId = Annotated[str, Path(alias="scheduleId", pattern=SCHEDULE_ID_PATTERN)]

router = APIRouter()


def _registry(runtime: "ApiRuntime") -> ScheduleRegistry:
    # Cheap to build: it only holds the runtime's product database and clock.
    return ScheduleRegistry(runtime.product(), runtime.clock, project_tenant=runtime.project_tenant)


def _shown(record: ScheduleRecord, registry: ScheduleRegistry) -> ScheduleBody:
    return ScheduleBody.of(record, last_fired_for=registry.last_fired(record.schedule_id))


@router.post(
    "/schedules",
    response_model=ScheduleBody,
    status_code=201,
    summary="Create a schedule",
    responses={
        200: {"model": ScheduleBody, "description": "The same schedule existed."},
        **error_responses(
            401,
            403,
            409,
            422,
            503,
            e403="The token lacks agents:write, or is a platform token (owns nothing).",
            e409="The tenant has a schedule of that name with other content.",
            e422="The request is invalid (a timing without its field, a project not of "
            "this tenant, ...); `field` names the first bad field.",
        ),
    },
)
async def create_schedule(
    runtime: Runtime, principal: AgentsWriter, body: CreateScheduleRequest, response: Response
) -> ScheduleBody:
    """Creates (201) the caller's tenant's schedule, or answers the same one (200)."""
    own_tenant(principal, "create a schedule")
    schedules = _registry(runtime)
    with _refused():
        timing = ScheduleTiming.of(body.mode, every_minutes=body.every_minutes, at=body.at)
        outcome = schedules.create(
            principal.tenant_id, body.name, body.project_id, timing, enabled=body.enabled
        )
    response.status_code = 201 if outcome.created else 200
    _log.info(
        "api: schedule %s %s",
        outcome.record.schedule_id,
        "created" if outcome.created else "unchanged",
    )
    return _shown(outcome.record, schedules)


@router.get(
    "/schedules",
    response_model=ScheduleListBody,
    summary="List schedules",
    responses=base_errors(),
)
async def list_schedules(
    runtime: Runtime,
    principal: AgentsReader,
    enabled_only: Annotated[
        bool, Query(alias="enabledOnly", description="Only the enabled ones.")
    ] = False,
) -> ScheduleListBody:
    """The caller's tenant's schedules (every tenant's for a platform token)."""
    schedules = _registry(runtime)
    records = schedules.list(principal.tenant_scope, enabled_only=enabled_only)
    return ScheduleListBody(items=[_shown(r, schedules) for r in records])


@router.get(
    "/schedules/{scheduleId}",
    response_model=ScheduleBody,
    summary="Read a schedule",
    responses=record_errors(_NOT_FOUND),
)
async def read_schedule(
    runtime: Runtime, principal: AgentsReader, schedule_id: _ScheduleId
) -> ScheduleBody:
    """Its timing, project, state and latest fire."""
    schedules = _registry(runtime)
    record = schedules.get(principal.tenant_scope, schedule_id)
    if record is None:
        raise NotFoundError(f"no schedule {schedule_id!r}; GET /schedules lists them")
    return _shown(record, schedules)


@router.patch(
    "/schedules/{scheduleId}",
    response_model=ScheduleBody,
    summary="Enable or disable a schedule",
    responses=record_errors(_NOT_FOUND),
)
async def update_schedule(
    runtime: Runtime, principal: AgentsWriter, schedule_id: _ScheduleId, body: UpdateScheduleRequest
) -> ScheduleBody:
    """Enables or disables it; the same value again changes nothing. The timing and
    project do not change: delete and create instead."""
    schedules = _registry(runtime)
    with _refused():
        record = schedules.set_enabled(principal.tenant_scope, schedule_id, body.enabled)
    return _shown(record, schedules)


@router.delete(
    "/schedules/{scheduleId}",
    response_model=ScheduleBody,
    summary="Delete a schedule",
    responses=record_errors(_NOT_FOUND),
)
async def delete_schedule(
    runtime: Runtime, principal: AgentsWriter, schedule_id: _ScheduleId
) -> ScheduleBody:
    """Deletes the schedule (and the record of its fires) and answers what it was; it
    fires no more."""
    with _refused():
        record = _registry(runtime).delete(principal.tenant_scope, schedule_id)
    return ScheduleBody.of(record)


@router.post(
    "/schedules/{scheduleId}/fire",
    response_model=ScheduleFiredBody,
    summary="Fire a schedule now",
    responses=record_errors(_NOT_FOUND),
)
async def fire_schedule(
    runtime: Runtime, principal: AgentsWriter, schedule_id: _ScheduleId
) -> ScheduleFiredBody:
    """Writes the schedule's ``schedule.fired`` for the current minute now, enabled or not:
    what reacts to it reacts as to a due fire. Firing twice in one minute, or in the minute
    it was due anyway, writes one fact; its timing goes on as it was. Audited."""
    from rhumbatron.reactions.schedule_firing import fire_now

    record = _registry(runtime).get(principal.tenant_scope, schedule_id)
    if record is None:
        raise NotFoundError(f"no schedule {schedule_id!r}; GET /schedules lists them")
    with _refused():
        fire = fire_now(runtime, record)
    return ScheduleFiredBody(
        schedule_id=fire.schedule_id,
        event_id=fire.event_id,
        scheduled_at=fire.scheduled_at,
        written=fire.written,
    )


@contextmanager
def _refused() -> Iterator[None]:
    """The registry's refusals as answers: a taken name 409, a missing schedule 404, a bad
    value 422 naming its field as the client sent it."""
    try:
        yield
    except ScheduleNotFoundError as exc:
        raise NotFoundError(str(exc)) from None
    except ScheduleConflictError as exc:
        raise ConflictError(str(exc), code="schedule_exists", field="name") from None
    except ScheduleRegistryError as exc:
        field = None if exc.field is None else to_camel(exc.field)
        raise InvalidRequestError(str(exc), field=field) from None
