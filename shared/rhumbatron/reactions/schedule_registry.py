"""The schedule registry: user-defined schedules, kept per tenant in the product database
(:data:`SCHEDULES_SCHEMA`) beside the subscriptions, each firing into one of its own
tenant's projects. Creating is idempotent on ``(tenant, name)``: the same content again
returns the stored record; other content under a taken name is a
:class:`ScheduleConflictError`.

The records are :mod:`~rhumbatron.reactions.schedule_models`'; firing the due ones is
:mod:`~rhumbatron.reactions.schedule_firing`'s.
"""

from __future__ import annotations

import builtins
import re
import sqlite3
import uuid
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.clock import Clock
from rhumbatron.errors import (
    ScheduleConflictError,
    ScheduleNotFoundError,
    ScheduleRegistryError,
)
from rhumbatron.protocol.ids import PROJECT_ID_PATTERN
from rhumbatron.reactions.schedule_models import (
    SCHEDULE_NAME_PATTERN,
    ScheduleCreated,
    ScheduleRecord,
    ScheduleTiming,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["SCHEDULES_SCHEMA", "ScheduleRegistry"]

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

_NAME = re.compile(SCHEDULE_NAME_PATTERN)
_PROJECT = re.compile(PROJECT_ID_PATTERN.pattern)


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
                _check_unchanged(
                    current, project_id, timing, enabled, tenant_id=tenant_id, name=name
                )
                return ScheduleCreated(current, created=False)
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
            _insert(connection, record, now)
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


# -- helpers ---------------------------------------------------------------------------------


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


def _check_unchanged(
    current: ScheduleRecord,
    project_id: str,
    timing: ScheduleTiming,
    enabled: bool,
    *,
    tenant_id: str,
    name: str,
) -> None:
    """Raise :class:`ScheduleConflictError` unless ``current`` holds what is asked for."""
    if (current.project_id, current.timing, current.enabled) == (
        project_id,
        timing,
        enabled,
    ):
        return
    raise ScheduleConflictError(
        f"tenant {tenant_id!r} has a schedule named {name!r} "
        f"({current.schedule_id}) with other content; choose another name, or "
        "delete that one first",
        field="name",
    )


def _insert(connection: sqlite3.Connection, record: ScheduleRecord, now: datetime) -> None:
    """Insert ``record``, created and armed at ``now``."""
    timing = record.timing
    connection.execute(
        "INSERT INTO schedules (schedule_id, tenant_id, name, project_id, mode, "
        "every_minutes, at, enabled, armed_at, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.schedule_id,
            record.tenant_id,
            record.name,
            record.project_id,
            timing.mode,
            timing.every_minutes,
            timing.at,
            int(record.enabled),
            now.isoformat(),
            now.isoformat(),
            now.isoformat(),
        ),
    )
