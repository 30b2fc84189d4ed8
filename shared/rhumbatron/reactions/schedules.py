"""Time events: every schedule fire lands a ``schedule.fired`` fact on the log (S2 §6, E3).

Two producers fire, both once per sweep tick (:func:`fire_due_schedules`):

* the **sweep's own tick**: schedule ``sweep`` (name ``sweep``, mode ``sweep``) fires at every
  tick's minute, in the reserved clock project (``RHUMBATRON_CLOCK_PROJECT_ID``, owned by
  ``RHUMBATRON_CLOCK_TENANT_ID``; the sweep creates it on first use);
* **user-defined schedules**, kept per tenant in the product database
  (:class:`ScheduleRegistry`, :data:`SCHEDULES_SCHEMA`) beside the subscriptions: ``interval``
  (every 1 to 1440 minutes, counted from midnight UTC of 1970-01-01, so ``60`` fires on the
  hour) or ``daily`` (at ``HH:MM`` UTC). Each fires into the stream of its project.

Nothing reacts to a schedule directly: a time-driven reaction is an ordinary subscription on
``schedule.fired`` filtered by ``payload.scheduleId`` — the clock produces facts, and the
reactions consumer decides what they cause.

**Once per due time.** A fire's Event ID is derived from ``(schedule, due time)``
(:func:`schedule_event_id`), so a retried or duplicated tick writes the same Event: the
outbox's ``INSERT OR IGNORE`` and JetStream's duplicate window drop the repeat. Each fire is
also recorded (``schedule_fires``) so the next tick knows it fired. After downtime a schedule
fires once, for its latest due time — no backfill storm — and it never fires for a due time
before it was created or last enabled.
"""

from __future__ import annotations

import builtins
import logging
import re
import sqlite3
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, Protocol, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, SettingsConfigDict

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import Clock
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.transition import Transition

# Defined in rhumbatron.errors; the alias keeps this module's old import path working.
from rhumbatron.errors import (
    RhumbatronError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    ScheduleRegistryError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN, stable_event_id
from rhumbatron.reactions.registry import SUBSCRIPTION_NAME_PATTERN

if TYPE_CHECKING:
    from collections.abc import Callable

    from rhumbatron.actors.project_root import ProjectRoot
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.product.database import ProductDatabase

__all__ = [
    "MAX_EVERY_MINUTES",
    "SCHEDULES_SCHEMA",
    "SCHEDULE_ID_PATTERN",
    "SCHEDULE_NAME_PATTERN",
    "SWEEP_SCHEDULE_ID",
    "TIME_OF_DAY_PATTERN",
    "FireReport",
    "ScheduleContext",
    "ScheduleCreated",
    "ScheduleFire",
    "ScheduleRecord",
    "ScheduleRegistry",
    "ScheduleSettings",
    "ScheduleTiming",
    "fire_due_schedules",
    "latest_due",
    "schedule_event_id",
    "schedule_fired_event",
]


class ScheduleContext(Protocol):
    """What firing schedules reads from the process: the clock, the product database (the
    schedules table) and the actors the time events are written to."""

    clock: Clock

    def product(self) -> ProductDatabase: ...

    def project_root(self, project_id: str) -> ProjectRoot: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def project_tenant(self, project_id: str) -> str | None: ...


_log = logging.getLogger(__name__)

SCHEDULES_SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules (
    schedule_id   TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    name          TEXT NOT NULL,
    project_id    TEXT NOT NULL,
    mode          TEXT NOT NULL CHECK (mode IN ('interval', 'daily')),
    every_minutes INTEGER CHECK (every_minutes BETWEEN 1 AND 1440),
    at            TEXT,
    enabled       INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    armed_at      TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS schedule_fires (
    schedule_id  TEXT NOT NULL,
    scheduled_at TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    fired_at     TEXT NOT NULL,
    PRIMARY KEY (schedule_id, scheduled_at)
);
"""

#: ``sch_`` and 32 hex digits (a UUID4 without dashes).
SCHEDULE_ID_PATTERN = r"^sch_[0-9a-f]{32}$"
#: Unique within a tenant; the subscriptions' alphabet.
SCHEDULE_NAME_PATTERN = SUBSCRIPTION_NAME_PATTERN
#: ``HH:MM``, 24-hour, UTC.
TIME_OF_DAY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
#: A day: an interval longer than that is a daily schedule.
MAX_EVERY_MINUTES = 1440
#: The sweep's own tick, as a schedule (its ID, name and mode).
SWEEP_SCHEDULE_ID = "sweep"

_ACTOR = "system:clock"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAME = re.compile(SCHEDULE_NAME_PATTERN)
_TIME_OF_DAY = re.compile(TIME_OF_DAY_PATTERN)
_PROJECT = re.compile(PROJECT_ID_PATTERN.pattern)


class ScheduleSettings(BaseSettings):
    """Where the sweep's tick lands, and how long fires are remembered.

    Kept here, like :class:`~rhumbatron.reactions.config.ReactionSettings`, until
    :class:`~rhumbatron.core.settings.Settings` takes them; same ``RHUMBATRON_*`` variables.
    """

    model_config = SettingsConfigDict(env_prefix="RHUMBATRON_", frozen=True, extra="ignore")

    clock_project_id: str = Field(
        default="rhumbatron-clock",
        pattern=PROJECT_ID_PATTERN.pattern,
        description="The reserved project whose stream carries the sweep's tick facts.",
    )
    clock_tenant_id: str = Field(
        default="platform",
        min_length=1,
        max_length=64,
        description="The tenant that owns the clock project (its subscriptions see the ticks).",
    )
    sweep_tick_facts: bool = Field(
        default=True, description="Every sweep tick lands one schedule.fired (schedule sweep)."
    )
    schedule_fire_retention_days: int = Field(
        default=7,
        # At least two days: a schedule's last fire is at most a day old, and must be kept to
        # tell the next tick it already fired.
        ge=2,
        description="Fires older than this are forgotten (schedule_fires rows).",
    )


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
    """What :meth:`ScheduleRegistry.create` did; ``created`` is False when the same schedule
    existed already."""

    record: ScheduleRecord
    created: bool


def latest_due(timing: ScheduleTiming, at: datetime) -> datetime:
    """The latest time ``timing`` is due at or before ``at`` (UTC, whole minutes)."""
    minute = _minute(at)
    if timing.mode == "interval":
        assert timing.every_minutes is not None
        minutes = int((minute - _EPOCH).total_seconds()) // 60
        return _EPOCH + timedelta(minutes=minutes - minutes % timing.every_minutes)
    assert timing.at is not None
    hour, of_hour = (int(part) for part in timing.at.split(":"))
    due = minute.replace(hour=hour, minute=of_hour)
    return due if due <= minute else due - timedelta(days=1)


# -- the registry ----------------------------------------------------------------------------


class ScheduleRegistry:
    """Schedules in ``store`` (the product database: :data:`SCHEDULES_SCHEMA`).

    ``project_tenant`` answers the tenant owning a project, or None
    (:meth:`~rhumbatron.runtime.bootstrap.Rhumbatron.project_tenant`): a schedule fires into
    one of its own tenant's projects only.
    """

    def __init__(
        self, store: SqliteStore, clock: Clock, *, project_tenant: Callable[[str], str | None]
    ) -> None:
        self._store = store
        self._clock = clock
        self._project_tenant = project_tenant

    def create(
        self,
        tenant_id: str,
        name: str,
        project_id: str,
        timing: ScheduleTiming,
        *,
        enabled: bool = True,
    ) -> ScheduleCreated:
        """Create the tenant's schedule ``name``; the same content again changes nothing.

        ``project_id`` must be a project of ``tenant_id``. Raises
        :class:`ScheduleConflictError` when ``name`` holds other content.
        """
        _check_tenant(tenant_id)
        _check_name(name)
        self._check_project(tenant_id, project_id)
        with self._store.transaction() as connection:
            current = _read_by_name(connection, tenant_id, name)
            if current is not None:
                if (current.project_id, current.timing, current.enabled) == (
                    project_id,
                    timing,
                    enabled,
                ):
                    return ScheduleCreated(current, created=False)
                raise ScheduleConflictError(
                    f"tenant {tenant_id!r} has a schedule named {name!r} "
                    f"({current.schedule_id}) with other content; choose another name, or "
                    "delete that one first",
                    field="name",
                )
            now = self._clock.now()
            record = ScheduleRecord(
                schedule_id=f"sch_{uuid.uuid4().hex}",
                tenant_id=tenant_id,
                name=name,
                project_id=project_id,
                timing=timing,
                enabled=enabled,
                armed_at=now,
                created_at=now,
                updated_at=now,
            )
            connection.execute(
                "INSERT INTO schedules (schedule_id, tenant_id, name, project_id, mode, "
                "every_minutes, at, enabled, armed_at, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.schedule_id,
                    tenant_id,
                    name,
                    project_id,
                    timing.mode,
                    timing.every_minutes,
                    timing.at,
                    int(enabled),
                    now.isoformat(),
                    now.isoformat(),
                    now.isoformat(),
                ),
            )
        return ScheduleCreated(record, created=True)

    def get(self, tenant_id: str | None, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, if ``tenant_id`` owns it (None: any tenant's); else None."""
        row = self._store.connection.execute(
            "SELECT * FROM schedules WHERE schedule_id = ?", (schedule_id,)
        ).fetchone()
        if row is None or tenant_id not in (None, row["tenant_id"]):
            return None
        return _record(row)

    def list(
        self, tenant_id: str | None, *, enabled_only: bool = False
    ) -> builtins.list[ScheduleRecord]:
        """The tenant's schedules (every tenant's for None), by tenant then name."""
        clauses, values = [], []
        if tenant_id is not None:
            clauses.append("tenant_id = ?")
            values.append(tenant_id)
        if enabled_only:
            clauses.append("enabled = 1")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._store.connection.execute(
            f"SELECT * FROM schedules{where} ORDER BY tenant_id, name", values
        ).fetchall()
        return [_record(row) for row in rows]

    def set_enabled(self, tenant_id: str | None, schedule_id: str, enabled: bool) -> ScheduleRecord:
        """Enable or disable the schedule; asking for what is already so changes nothing.

        Enabling re-arms it: it fires for due times from now on, never for those it was off.
        """
        with self._store.transaction() as connection:
            current = _owned(connection, tenant_id, schedule_id)
            if current.enabled == enabled:
                return current
            now = self._clock.now()
            armed_at = now if enabled else current.armed_at
            connection.execute(
                "UPDATE schedules SET enabled = ?, armed_at = ?, updated_at = ? "
                "WHERE schedule_id = ?",
                (int(enabled), armed_at.isoformat(), now.isoformat(), schedule_id),
            )
            return current.model_copy(
                update={"enabled": enabled, "armed_at": armed_at, "updated_at": now}
            )

    def delete(self, tenant_id: str | None, schedule_id: str) -> ScheduleRecord:
        """Delete the schedule and its fires; return what it was. Raises
        :class:`ScheduleNotFoundError` when the tenant has no such schedule."""
        with self._store.transaction() as connection:
            current = _owned(connection, tenant_id, schedule_id)
            connection.execute("DELETE FROM schedules WHERE schedule_id = ?", (schedule_id,))
            connection.execute("DELETE FROM schedule_fires WHERE schedule_id = ?", (schedule_id,))
            return current

    def last_fired(self, schedule_id: str) -> datetime | None:
        """The due time of the schedule's latest fire, if it fired (within the retention)."""
        row = self._store.connection.execute(
            "SELECT MAX(scheduled_at) FROM schedule_fires WHERE schedule_id = ?", (schedule_id,)
        ).fetchone()
        return None if row[0] is None else datetime.fromisoformat(row[0])

    def _check_project(self, tenant_id: str, project_id: str) -> None:
        if not _PROJECT.fullmatch(project_id):
            raise ScheduleRegistryError(
                f"project ID {project_id[:80]!r} is invalid: use 1 to 64 characters of A-Z, "
                "a-z, 0-9, '_' and '-', starting with a letter or digit",
                field="project_id",
            )
        # One answer for "no such project" and "another tenant's": the caller learns nothing
        # of other tenants' projects.
        if self._project_tenant(project_id) != tenant_id:
            raise ScheduleRegistryError(
                f"project {project_id!r} is not one of tenant {tenant_id!r}'s projects; "
                "create it first (POST /projects), or name one of yours",
                field="project_id",
            )


# -- firing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """One ``schedule.fired`` this tick wrote. ``written`` is False when the project's outbox
    already held that Event ID (the fire of an earlier attempt of the same tick)."""

    schedule_id: str
    name: str
    mode: str
    tenant_id: str
    project_id: str
    scheduled_at: datetime
    event_id: str
    written: bool


@dataclass
class FireReport:
    """What one tick fired, and the schedules that could not fire (ID -> why); those fire at
    a later tick (the latest due time then)."""

    fired: list[ScheduleFire] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def schedule_event_id(schedule_id: str, scheduled_at: datetime) -> str:
    """The Event ID of ``schedule_id``'s fire for ``scheduled_at``: the same on every attempt.

    ``stable_event_id(schedule_id, "schedule.fired", key=<UTC minute>)``: ``evt_`` + 32 hex,
    and never a Change Event's (the type is part of the hash).
    """
    return stable_event_id(schedule_id, "schedule.fired", None, _minute_key(scheduled_at))


def schedule_fired_event(
    *,
    schedule_id: str,
    name: str,
    mode: str,
    tenant_id: str,
    project_id: str,
    scheduled_at: datetime,
    now: datetime,
) -> Event:
    """The ``schedule.fired`` fact of one fire, with its stable ID (:func:`schedule_event_id`)."""
    due = _minute(scheduled_at)
    caller = Caller(tenant_id, _ACTOR, f"schedule:{schedule_id}:{_minute_key(due)}")
    payload = {"scheduleId": schedule_id, "name": name, "mode": mode, "scheduledAt": due}
    # A fire's ID is the same on every attempt of its tick, so the outbox's INSERT OR IGNORE
    # and JetStream's duplicate window drop a repeat.
    return FactContext(caller, project_id, now).fact(
        "schedule.fired", payload, event_id=schedule_event_id(schedule_id, due)
    )


def fire_due_schedules(
    app: ScheduleContext, at: datetime, *, settings: ScheduleSettings | None = None
) -> FireReport:
    """Fire what is due at the tick of ``at`` (its UTC minute): the sweep's tick, and each
    enabled schedule whose latest due time is at or before it and after its last fire.

    One schedule's failure is reported and does not stop the others; it fires at a later
    tick. Raises only when the product database cannot be read.
    """
    settings = settings or ScheduleSettings()
    minute = _minute(at)
    product = app.product()
    due: list[_Due] = []
    if settings.sweep_tick_facts:
        due.append(
            _Due(
                SWEEP_SCHEDULE_ID,
                SWEEP_SCHEDULE_ID,
                "sweep",
                settings.clock_tenant_id,
                settings.clock_project_id,
                minute,
            )
        )
    registry = ScheduleRegistry(product, app.clock, project_tenant=app.project_tenant)
    for record in registry.list(None, enabled_only=True):
        when = latest_due(record.timing, minute)
        if when >= record.armed_at:
            due.append(
                _Due(
                    record.schedule_id,
                    record.name,
                    record.timing.mode,
                    record.tenant_id,
                    record.project_id,
                    when,
                )
            )
    last = _last_fires(product.connection)
    report = FireReport()
    for item in due:
        previous = last.get(item.schedule_id)
        if previous is not None and previous >= item.scheduled_at:
            continue  # fired for this due time (or a later one: an older tick retried late)
        try:
            report.fired.append(_fire(app, item, settings))
        except (RhumbatronError, sqlite3.Error) as exc:
            _log.error(
                "schedule %s could not fire for %s: %s; a later tick fires it",
                item.schedule_id,
                item.scheduled_at.isoformat(),
                exc,
            )
            report.failed[item.schedule_id] = f"{type(exc).__name__}: {exc}"
    horizon = minute - timedelta(days=settings.schedule_fire_retention_days)
    with product.transaction() as db:
        db.execute("DELETE FROM schedule_fires WHERE scheduled_at < ?", (horizon.isoformat(),))
    return report


@dataclass(frozen=True, slots=True)
class _Due:
    schedule_id: str
    name: str
    mode: str
    tenant_id: str
    project_id: str
    scheduled_at: datetime


def _fire(app: ScheduleContext, item: _Due, settings: ScheduleSettings) -> ScheduleFire:
    """Write the fact, then record the fire: a crash between the two fires again at the next
    tick with the same Event ID, which the outbox or JetStream drops."""
    owner = app.project_tenant(item.project_id)
    if owner is None and item.schedule_id == SWEEP_SCHEDULE_ID:
        caller = Caller(item.tenant_id, _ACTOR, f"clock-project:{item.project_id}")
        app.project_root(item.project_id).create_project(caller, name="Rhumbatron clock")
        owner = app.project_tenant(item.project_id)
    if owner != item.tenant_id:
        # Fail closed: a schedule never writes into a project its tenant does not own.
        where = (
            "set RHUMBATRON_CLOCK_PROJECT_ID to an unused project ID"
            if item.schedule_id == SWEEP_SCHEDULE_ID
            else "delete the schedule, or recreate it on one of the tenant's projects"
        )
        held = "no tenant (it does not exist)" if owner is None else f"tenant {owner!r}"
        raise _NotOwnedError(
            f"project {item.project_id!r} belongs to {held}, not to tenant "
            f"{item.tenant_id!r}; {where}"
        )
    fact = schedule_fired_event(
        schedule_id=item.schedule_id,
        name=item.name,
        mode=item.mode,
        tenant_id=item.tenant_id,
        project_id=item.project_id,
        scheduled_at=item.scheduled_at,
        now=app.clock.now(),
    )
    shard = app.resource_shard(item.project_id, project_admin_key(item.project_id))
    result = shard.transact(lambda db: Transition(facts=(fact,)))
    with app.product().transaction() as db:
        db.execute(
            "INSERT OR IGNORE INTO schedule_fires (schedule_id, scheduled_at, event_id, "
            "fired_at) VALUES (?, ?, ?, ?)",
            (
                item.schedule_id,
                item.scheduled_at.isoformat(),
                fact.event_id,
                app.clock.now().isoformat(),
            ),
        )
    _log.info("schedule %s fired for %s (%s)", item.schedule_id, item.scheduled_at, fact.event_id)
    return ScheduleFire(
        schedule_id=item.schedule_id,
        name=item.name,
        mode=item.mode,
        tenant_id=item.tenant_id,
        project_id=item.project_id,
        scheduled_at=item.scheduled_at,
        event_id=fact.event_id,
        written=result.events_added > 0,
    )


class _NotOwnedError(ScheduleRegistryError):
    """The schedule's project is not (or no longer) its tenant's."""


# -- helpers ---------------------------------------------------------------------------------


def _minute(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"{moment.isoformat()} has no timezone; a tick's time must be UTC")
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _minute_key(moment: datetime) -> str:
    return _minute(moment).strftime("%Y-%m-%dT%H:%MZ")


def _last_fires(connection: sqlite3.Connection) -> dict[str, datetime]:
    rows = connection.execute(
        "SELECT schedule_id, MAX(scheduled_at) FROM schedule_fires GROUP BY schedule_id"
    ).fetchall()
    return {row[0]: datetime.fromisoformat(row[1]) for row in rows}


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


def _check_tenant(tenant_id: str) -> None:
    if not tenant_id.strip() or len(tenant_id) > 64:
        raise ScheduleRegistryError(
            f"a schedule needs a tenant ID of 1 to 64 characters, got {tenant_id[:80]!r}",
            field="tenant_id",
        )


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ScheduleRegistryError(
            f"schedule name {name[:120]!r} is invalid: use 1 to 100 characters of A-Z, a-z, "
            "0-9, '.', '_' and '-', starting with a letter or digit",
            field="name",
        )


def _owned(
    connection: sqlite3.Connection, tenant_id: str | None, schedule_id: str
) -> ScheduleRecord:
    row = connection.execute(
        "SELECT * FROM schedules WHERE schedule_id = ?", (schedule_id,)
    ).fetchone()
    if row is None or tenant_id not in (None, row["tenant_id"]):
        raise ScheduleNotFoundError(
            f"no schedule {schedule_id!r}; `GET /schedules` (or `rhumbatron schedules list`) "
            "lists them"
        )
    return _record(row)


def _read_by_name(
    connection: sqlite3.Connection, tenant_id: str, name: str
) -> ScheduleRecord | None:
    row = connection.execute(
        "SELECT * FROM schedules WHERE tenant_id = ? AND name = ?", (tenant_id, name)
    ).fetchone()
    return None if row is None else _record(row)


def _record(row: sqlite3.Row) -> ScheduleRecord:
    return ScheduleRecord(
        schedule_id=row["schedule_id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        project_id=row["project_id"],
        timing=ScheduleTiming(mode=row["mode"], every_minutes=row["every_minutes"], at=row["at"]),
        enabled=bool(row["enabled"]),
        armed_at=datetime.fromisoformat(row["armed_at"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        updated_at=datetime.fromisoformat(row["updated_at"]),
    )
