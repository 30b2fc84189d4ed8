"""Time events: every schedule fire lands a ``schedule.fired`` fact on the log (S2 §6, E3).

Two producers fire, both once per sweep tick (:func:`fire_due_schedules`):

* the **sweep's own tick**: schedule ``sweep`` (name ``sweep``, mode ``sweep``) fires at every
  tick's minute, in the reserved clock project (``RHUMBATRON_CLOCK_PROJECT_ID``, owned by
  ``RHUMBATRON_CLOCK_TENANT_ID``; the sweep creates it on first use);
* **user-defined schedules**, kept per tenant in the product database
  (:mod:`~rhumbatron.reactions.schedule_registry`) beside the subscriptions: ``interval``
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

import logging
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from rhumbatron.core.clock import Clock
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.transition import Transition
from rhumbatron.errors import RhumbatronError, ScheduleRegistryError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN, stable_event_id
from rhumbatron.reactions.schedule_models import ScheduleRecord, latest_due, utc_minute
from rhumbatron.reactions.schedule_registry import ScheduleRegistry

if TYPE_CHECKING:
    from rhumbatron.actors.project_root import ProjectRoot
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.product.database import ProductDatabase

__all__ = [
    "SWEEP_SCHEDULE_ID",
    "FireReport",
    "ScheduleContext",
    "ScheduleFire",
    "ScheduleSettings",
    "ensure_clock_project",
    "fire_due_schedules",
    "fire_now",
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

#: The sweep's own tick, as a schedule (its ID, name and mode).
SWEEP_SCHEDULE_ID = "sweep"

_ACTOR = "system:clock"


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
    due = utc_minute(scheduled_at)
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
    minute = utc_minute(at)
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


def fire_now(
    app: ScheduleContext, record: ScheduleRecord, *, settings: ScheduleSettings | None = None
) -> ScheduleFire:
    """An operator's fire of ``record`` now, enabled or not: its ``schedule.fired`` for the
    current UTC minute. Its Event ID is the schedule's for that minute, so a second fire in
    the same minute, or the schedule's own due fire at it, adds nothing; and it is not
    recorded as a due fire, so the schedule's timing goes on as it was."""
    item = _Due(
        record.schedule_id,
        record.name,
        record.timing.mode,
        record.tenant_id,
        record.project_id,
        utc_minute(app.clock.now()),
    )
    return _fire(app, item, settings or ScheduleSettings(), record_fire=False)


def _fire(
    app: ScheduleContext, item: _Due, settings: ScheduleSettings, *, record_fire: bool = True
) -> ScheduleFire:
    """Write the fact, then record the fire: a crash between the two fires again at the next
    tick with the same Event ID, which the outbox or JetStream drops."""
    owner = (
        ensure_clock_project(app, settings)
        if item.schedule_id == SWEEP_SCHEDULE_ID
        else app.project_tenant(item.project_id)
    )
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
    if not record_fire:
        _log.info("schedule %s fired now by an operator (%s)", item.schedule_id, fact.event_id)
    else:
        _record_fire(app, item, fact.event_id)
        _log.info(
            "schedule %s fired for %s (%s)", item.schedule_id, item.scheduled_at, fact.event_id
        )
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


def _record_fire(app: ScheduleContext, item: _Due, event_id: str) -> None:
    with app.product().transaction() as db:
        db.execute(
            "INSERT OR IGNORE INTO schedule_fires (schedule_id, scheduled_at, event_id, "
            "fired_at) VALUES (?, ?, ?, ?)",
            (
                item.schedule_id,
                item.scheduled_at.isoformat(),
                event_id,
                app.clock.now().isoformat(),
            ),
        )


def ensure_clock_project(app: ScheduleContext, settings: ScheduleSettings) -> str | None:
    """The tenant that owns the clock project (whose stream carries the sweep's facts), the
    project made for the clock tenant first if it does not exist yet."""
    project_id = settings.clock_project_id
    owner = app.project_tenant(project_id)
    if owner is None:
        caller = Caller(settings.clock_tenant_id, _ACTOR, f"clock-project:{project_id}")
        app.project_root(project_id).create_project(caller, name="Rhumbatron clock")
        owner = app.project_tenant(project_id)
    return owner


class _NotOwnedError(ScheduleRegistryError):
    """The schedule's project is not (or no longer) its tenant's."""


# -- helpers ---------------------------------------------------------------------------------


def _minute_key(moment: datetime) -> str:
    return utc_minute(moment).strftime("%Y-%m-%dT%H:%MZ")


def _last_fires(connection: sqlite3.Connection) -> dict[str, datetime]:
    rows = connection.execute(
        "SELECT schedule_id, MAX(scheduled_at) FROM schedule_fires GROUP BY schedule_id"
    ).fetchall()
    return {row[0]: datetime.fromisoformat(row[1]) for row in rows}
