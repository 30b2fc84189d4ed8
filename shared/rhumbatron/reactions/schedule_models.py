"""A schedule's record and when it is due: :class:`ScheduleTiming` (``interval`` every 1 to
1440 minutes, counted from midnight UTC of 1970-01-01, or ``daily`` at ``HH:MM`` UTC),
:class:`ScheduleRecord` (one ``schedules`` row) and :func:`latest_due`.

The registry that keeps them is :mod:`~rhumbatron.reactions.schedule_registry`; what fires
them, :mod:`~rhumbatron.reactions.schedule_firing`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from rhumbatron.errors import ScheduleRegistryError
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.reactions.subscription_models import SUBSCRIPTION_NAME_PATTERN

__all__ = [
    "MAX_EVERY_MINUTES",
    "SCHEDULE_ID_PATTERN",
    "SCHEDULE_NAME_PATTERN",
    "TIME_OF_DAY_PATTERN",
    "ScheduleCreated",
    "ScheduleRecord",
    "ScheduleTiming",
    "latest_due",
    "utc_minute",
]

#: ``sch_`` and 32 hex digits (a UUID4 without dashes).
SCHEDULE_ID_PATTERN = r"^sch_[0-9a-f]{32}$"
#: Unique within a tenant; the subscriptions' alphabet.
SCHEDULE_NAME_PATTERN = SUBSCRIPTION_NAME_PATTERN
#: ``HH:MM``, 24-hour, UTC.
TIME_OF_DAY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
#: A day: an interval longer than that is a daily schedule.
MAX_EVERY_MINUTES = 1440

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIME_OF_DAY = re.compile(TIME_OF_DAY_PATTERN)


# -- the record ------------------------------------------------------------------------------


class _Frozen(BaseModel):
    # camelCase accepted too, so a schedule's JSON file reads the same to the CLI as to the API.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class ScheduleTiming(_Frozen):
    """When a schedule is due: ``interval`` every ``every_minutes`` (aligned on the UTC
    epoch: 60 fires on the hour, 1440 at midnight), or ``daily`` at ``at`` (``HH:MM`` UTC)."""

    mode: Literal["interval", "daily"]
    every_minutes: int | None = None
    at: str | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> Self:
        _check_timing(self.mode, self.every_minutes, self.at)
        return self

    @classmethod
    def of(cls, mode: str, *, every_minutes: int | None = None, at: str | None = None) -> Self:
        """The timing; raises :class:`ScheduleRegistryError` naming the bad field."""
        _check_timing(mode, every_minutes, at)
        return cls.model_validate({"mode": mode, "every_minutes": every_minutes, "at": at})


class ScheduleRecord(_Frozen):
    """One ``schedules`` row."""

    schedule_id: str = Field(pattern=SCHEDULE_ID_PATTERN)
    tenant_id: str = Field(min_length=1, max_length=64)
    name: str = Field(pattern=SCHEDULE_NAME_PATTERN)
    project_id: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    timing: ScheduleTiming
    enabled: bool
    armed_at: AwareDatetime = Field(
        description="Fires only for due times at or after this: created, or last enabled."
    )
    created_at: AwareDatetime
    updated_at: AwareDatetime


@dataclass(frozen=True, slots=True)
class ScheduleCreated:
    """What :meth:`~rhumbatron.reactions.schedule_registry.ScheduleRegistry.create` did;
    ``created`` is False when the same schedule existed already."""

    record: ScheduleRecord
    created: bool


def latest_due(timing: ScheduleTiming, at: datetime) -> datetime:
    """The latest time ``timing`` is due at or before ``at`` (UTC, whole minutes)."""
    minute = utc_minute(at)
    if timing.mode == "interval":
        assert timing.every_minutes is not None
        minutes = int((minute - _EPOCH).total_seconds()) // 60
        return _EPOCH + timedelta(minutes=minutes - minutes % timing.every_minutes)
    assert timing.at is not None
    hour, of_hour = (int(part) for part in timing.at.split(":"))
    due = minute.replace(hour=hour, minute=of_hour)
    return due if due <= minute else due - timedelta(days=1)


def utc_minute(moment: datetime) -> datetime:
    """``moment``'s minute in UTC (seconds dropped); raises :class:`ValueError` when it has no
    timezone."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment.isoformat()} has no timezone; a tick's time must be UTC")
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _check_timing(mode: str, every_minutes: int | None, at: str | None) -> None:
    if mode == "interval":
        if every_minutes is None or not 1 <= every_minutes <= MAX_EVERY_MINUTES:
            raise ScheduleRegistryError(
                f"an interval schedule needs every_minutes from 1 to {MAX_EVERY_MINUTES}, got "
                f"{every_minutes!r}; for a time of day use mode daily",
                field="every_minutes",
            )
        if at is not None:
            raise ScheduleRegistryError(
                f"an interval schedule takes no at (got {at[:20]!r}); leave it out, or use "
                "mode daily",
                field="at",
            )
    elif mode == "daily":
        if at is None or not _TIME_OF_DAY.fullmatch(at):
            shown = at if at is None else at[:20]
            raise ScheduleRegistryError(
                f"a daily schedule needs at as HH:MM (UTC, 00:00 to 23:59), got {shown!r}",
                field="at",
            )
        if every_minutes is not None:
            raise ScheduleRegistryError(
                f"a daily schedule takes no every_minutes (got {every_minutes!r}); leave it "
                "out, or use mode interval",
                field="every_minutes",
            )
    else:
        raise ScheduleRegistryError(
            f"schedule mode {str(mode)[:40]!r} is unknown; use interval or daily", field="mode"
        )
