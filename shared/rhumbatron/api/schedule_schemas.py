"""The schedules API's request and response bodies: frozen pydantic models, camelCase on the
wire, like :mod:`rhumbatron.api.schemas`."""

from datetime import datetime
from typing import Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.reactions.schedule_models import (
    MAX_EVERY_MINUTES,
    SCHEDULE_NAME_PATTERN,
    TIME_OF_DAY_PATTERN,
    ScheduleRecord,
)

__all__ = [
    "CreateScheduleRequest",
    "ScheduleBody",
    "ScheduleFiredBody",
    "ScheduleListBody",
    "UpdateScheduleRequest",
]


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


class ScheduleFiredBody(_Wire):
    """A fire asked for now: the ``schedule.fired`` fact written for this minute."""

    schedule_id: str
    event_id: str = Field(description="The fact's ID: the schedule's for this minute.")
    scheduled_at: AwareDatetime = Field(description="The UTC minute it fired for.")
    written: bool = Field(
        description="False: this minute's fire was written already (by a fire or its tick)."
    )
