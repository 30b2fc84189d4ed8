"""The schedules API: ``/schedules``, the tenant's clocks whose fires land ``schedule.fired``.

:func:`schedule_router` builds the routes over a runtime; they translate HTTP to the
:class:`~rhumbatron.reactions.schedules.ScheduleRegistry` and back, ``async def`` with no
``await`` inside a product transaction (see ``app.py``).

Authorization reuses the agents' scopes, as subscriptions do: ``agents:read`` to list and
read, ``agents:write`` to create, enable, disable and delete. Tenancy fails closed: another
tenant's schedule is the same 404 as one that does not exist, and a schedule fires only into
a project of its own tenant. A platform token (tenant ``*``) reads and governs every tenant's
schedules, but owns nothing, so it cannot create one.
"""

# No ``from __future__ import annotations`` here, on purpose (as in ``subscription_routes``):
# the routes are closures over the principal dependency they are given, and FastAPI resolves
# string annotations against the module's globals only.

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Literal, Self

from fastapi import APIRouter, Path, Query, Response, Security
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.api.auth import SCOPE_AGENTS_READ, SCOPE_AGENTS_WRITE, Principal
from rhumbatron.api.errors import InvalidRequestError, error_responses
from rhumbatron.api.lifecycle_routes import (
    ConflictError,
    NotFoundError,
    PrincipalDependency,
    own_tenant,
)
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.reactions.schedules import (
    MAX_EVERY_MINUTES,
    SCHEDULE_ID_PATTERN,
    SCHEDULE_NAME_PATTERN,
    TIME_OF_DAY_PATTERN,
    ScheduleConflictError,
    ScheduleNotFoundError,
    ScheduleRecord,
    ScheduleRegistry,
    ScheduleRegistryError,
    ScheduleTiming,
)
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = [
    "CreateScheduleRequest",
    "ScheduleBody",
    "ScheduleListBody",
    "UpdateScheduleRequest",
    "schedule_router",
]

_log = logging.getLogger(__name__)


# -- bodies ------------------------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class CreateScheduleRequest(_Wire):
    """A schedule of the caller's tenant: ``interval`` every ``everyMinutes`` (aligned on the
    UTC epoch: 60 fires on the hour), or ``daily`` at ``at`` (``HH:MM`` UTC). Its fires land
    ``schedule.fired`` on the stream of ``projectId``. The same request again is answered 200
    with the stored schedule."""

    name: str = Field(pattern=SCHEDULE_NAME_PATTERN, description="Unique in the tenant.")
    project_id: str = Field(
        pattern=PROJECT_ID_PATTERN.pattern, description="One of the tenant's projects."
    )
    mode: Literal["interval", "daily"]
    every_minutes: int | None = Field(default=None, ge=1, le=MAX_EVERY_MINUTES)
    at: str | None = Field(default=None, pattern=TIME_OF_DAY_PATTERN)
    enabled: bool = True


class UpdateScheduleRequest(_Wire):
    """Enable or disable the schedule. Enabling re-arms it: it fires for due times from now
    on, never for those it was off."""

    enabled: bool


class ScheduleBody(_Wire):
    """A schedule, and the due time of its latest fire."""

    schedule_id: str
    tenant_id: str
    name: str
    project_id: str
    mode: Literal["interval", "daily"]
    every_minutes: int | None
    at: str | None
    enabled: bool
    armed_at: datetime = Field(description="It fires for due times from this one on.")
    last_fired_for: datetime | None = Field(
        default=None, description="The due time of its latest fire, if it fired."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, record: ScheduleRecord, *, last_fired_for: datetime | None = None) -> Self:
        """``record`` as shown."""
        return cls(
            schedule_id=record.schedule_id,
            tenant_id=record.tenant_id,
            name=record.name,
            project_id=record.project_id,
            mode=record.timing.mode,
            every_minutes=record.timing.every_minutes,
            at=record.timing.at,
            enabled=record.enabled,
            armed_at=record.armed_at,
            last_fired_for=last_fired_for,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


class ScheduleListBody(_Wire):
    """Schedules by tenant, then name."""

    items: list[ScheduleBody]


# -- the router --------------------------------------------------------------------------------

_NOT_FOUND = "No such schedule for this tenant (another tenant's is not found either)."
_ScheduleId = Annotated[str, Path(alias="scheduleId", pattern=SCHEDULE_ID_PATTERN)]


def schedule_router(app: Rhumbatron, principal: PrincipalDependency) -> APIRouter:
    """The ``/schedules`` routes over ``app``; ``principal`` is the API's dependency that
    authenticates the bearer token and checks the operation's scopes (``app._principal``)."""
    Reader = Annotated[Principal, Security(principal, scopes=[SCOPE_AGENTS_READ])]
    Writer = Annotated[Principal, Security(principal, scopes=[SCOPE_AGENTS_WRITE])]

    router = APIRouter()

    def registry() -> ScheduleRegistry:
        # Cheap to build: it only holds the runtime's product database and clock.
        return ScheduleRegistry(app.product(), app.clock, project_tenant=app.project_tenant)

    def shown(record: ScheduleRecord, registry: ScheduleRegistry) -> ScheduleBody:
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
        principal: Writer, body: CreateScheduleRequest, response: Response
    ) -> ScheduleBody:
        """Creates (201) the caller's tenant's schedule, or answers the same one (200)."""
        own_tenant(principal, "create a schedule")
        schedules = registry()
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
        return shown(outcome.record, schedules)

    @router.get(
        "/schedules",
        response_model=ScheduleListBody,
        summary="List schedules",
        responses=error_responses(401, 403, 422, 503),
    )
    async def list_schedules(
        principal: Reader,
        enabled_only: Annotated[
            bool, Query(alias="enabledOnly", description="Only the enabled ones.")
        ] = False,
    ) -> ScheduleListBody:
        """The caller's tenant's schedules (every tenant's for a platform token)."""
        schedules = registry()
        records = schedules.list(principal.tenant_scope, enabled_only=enabled_only)
        return ScheduleListBody(items=[shown(r, schedules) for r in records])

    @router.get(
        "/schedules/{scheduleId}",
        response_model=ScheduleBody,
        summary="Read a schedule",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def read_schedule(principal: Reader, schedule_id: _ScheduleId) -> ScheduleBody:
        """Its timing, project, state and latest fire."""
        schedules = registry()
        record = schedules.get(principal.tenant_scope, schedule_id)
        if record is None:
            raise NotFoundError(f"no schedule {schedule_id!r}; GET /schedules lists them")
        return shown(record, schedules)

    @router.patch(
        "/schedules/{scheduleId}",
        response_model=ScheduleBody,
        summary="Enable or disable a schedule",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def update_schedule(
        principal: Writer, schedule_id: _ScheduleId, body: UpdateScheduleRequest
    ) -> ScheduleBody:
        """Enables or disables it; the same value again changes nothing. The timing and
        project do not change: delete and create instead."""
        schedules = registry()
        with _refused():
            record = schedules.set_enabled(principal.tenant_scope, schedule_id, body.enabled)
        return shown(record, schedules)

    @router.delete(
        "/schedules/{scheduleId}",
        response_model=ScheduleBody,
        summary="Delete a schedule",
        responses=error_responses(401, 403, 404, 422, 503, e404=_NOT_FOUND),
    )
    async def delete_schedule(principal: Writer, schedule_id: _ScheduleId) -> ScheduleBody:
        """Deletes the schedule (and the record of its fires) and answers what it was; it
        fires no more."""
        with _refused():
            record = registry().delete(principal.tenant_scope, schedule_id)
        return ScheduleBody.of(record)

    return router


# -- helpers -----------------------------------------------------------------------------------


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
