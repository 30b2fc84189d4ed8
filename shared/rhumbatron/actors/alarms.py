"""Actor alarms and AlarmGuard.

A write that adds outbox rows sets the actor's alarm (one per actor, like a Durable Object
alarm: setting an earlier time replaces a later one). When the alarm fires, AlarmGuard decides:

* no alarm, or not yet due → nothing;
* no due work → the alarm is deleted;
* 2,000 fires already this UTC day → refused and counted (the every-minute scan for due
  actors publishes them without counting a fire, see DECISIONS);
* otherwise the fire is counted and the publisher runs.

Setting an alarm also tells an :class:`AlarmSink` (an async Lambda invoke in the cloud, an
in-process queue locally), but only when the alarm moved earlier: repeated writes while an
alarm is pending cost nothing more.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from rhumbatron.actors.outbox import next_due_at
from rhumbatron.core.clock import utc_day

__all__ = [
    "ALARM_SCHEMA",
    "AlarmGuard",
    "AlarmSink",
    "FireDecision",
    "NoAlarmSink",
    "RecordingAlarmSink",
    "alarm_due_at",
    "delete_alarm",
    "set_alarm",
]

ALARM_SCHEMA = """
CREATE TABLE IF NOT EXISTS alarm (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    due_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS alarm_fires (
    day     TEXT PRIMARY KEY,
    fires   INTEGER NOT NULL DEFAULT 0,
    refused INTEGER NOT NULL DEFAULT 0
);
"""


class AlarmSink(Protocol):
    """Where a newly set (or earlier) alarm is announced, so something fires it."""

    def alarm_set(self, actor_key: str, due_at: datetime) -> None: ...


class NoAlarmSink:
    """Announces nothing: the every-minute scan for due actors still fires alarms."""

    def alarm_set(self, actor_key: str, due_at: datetime) -> None:
        return None


@dataclass
class RecordingAlarmSink:
    """Keeps every announcement in order; the local invoker drains it."""

    announced: list[tuple[str, datetime]] = field(default_factory=list)

    def alarm_set(self, actor_key: str, due_at: datetime) -> None:
        self.announced.append((actor_key, due_at))

    def drain(self) -> list[str]:
        """The distinct actor keys announced so far, in first-announced order; clears them."""
        keys = list(dict.fromkeys(key for key, _ in self.announced))
        self.announced.clear()
        return keys


def alarm_due_at(connection: sqlite3.Connection) -> float | None:
    row = connection.execute("SELECT due_at FROM alarm WHERE id = 1").fetchone()
    return None if row is None else float(row[0])


def set_alarm(connection: sqlite3.Connection, due_at_s: float) -> bool:
    """Set the alarm to ``due_at_s`` unless it is already set earlier; True if it moved."""
    current = alarm_due_at(connection)
    if current is not None and current <= due_at_s:
        return False
    connection.execute(
        "INSERT INTO alarm (id, due_at) VALUES (1, ?) "
        "ON CONFLICT (id) DO UPDATE SET due_at = excluded.due_at",
        (due_at_s,),
    )
    return True


def replace_alarm(connection: sqlite3.Connection, due_at_s: float | None) -> None:
    """Set the alarm to exactly ``due_at_s`` (None deletes it): after a publisher run."""
    if due_at_s is None:
        delete_alarm(connection)
    else:
        connection.execute(
            "INSERT INTO alarm (id, due_at) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET due_at = excluded.due_at",
            (due_at_s,),
        )


def delete_alarm(connection: sqlite3.Connection) -> None:
    connection.execute("DELETE FROM alarm WHERE id = 1")


class FireDecision(StrEnum):
    FIRE = "fire"
    NOT_DUE = "not_due"
    NO_WORK = "no_work"
    CAPPED = "capped"


@dataclass(frozen=True)
class AlarmGuard:
    """Caps alarm fires per actor per UTC day and deletes alarms with no due work."""

    max_fires_per_day: int = 2_000

    def decide(self, connection: sqlite3.Connection, now: datetime) -> FireDecision:
        """The decision for a fire at ``now``, from reads only; writes nothing."""
        now_s = now.timestamp()
        due = alarm_due_at(connection)
        if due is None or due > now_s:
            return FireDecision.NOT_DUE
        work_at = next_due_at(connection, now_s=now_s)
        if work_at is None:
            return FireDecision.NO_WORK
        if work_at > now_s:
            return FireDecision.NOT_DUE
        fires, _ = self.fires_on(connection, utc_day(now))
        return FireDecision.CAPPED if fires >= self.max_fires_per_day else FireDecision.FIRE

    def admit(self, connection: sqlite3.Connection, now: datetime) -> FireDecision:
        """Decide a fire inside the caller's write transaction, and write what it implies.

        No work: the alarm is deleted. Only backoffs: the alarm moves to the first retry.
        Capped: the refusal is counted. A fire: the fire is counted. Deciding and writing in
        one transaction matters: a writer adding rows between a read and a delete would
        otherwise lose its alarm.
        """
        decision = self.decide(connection, now)
        now_s = now.timestamp()
        if decision is FireDecision.NO_WORK:
            delete_alarm(connection)
        elif decision is FireDecision.NOT_DUE:
            work_at = next_due_at(connection, now_s=now_s)
            due = alarm_due_at(connection)
            if work_at is not None and due is not None and due <= now_s < work_at:
                replace_alarm(connection, work_at)  # only backoffs remain: wake when one ends
        elif decision is FireDecision.CAPPED:
            self._count(connection, utc_day(now), "refused")
        else:
            self.count_fire(connection, now)
        return decision

    def count_fire(self, connection: sqlite3.Connection, now: datetime) -> None:
        """Count one admitted fire on the UTC day of ``now`` (inside a write transaction)."""
        self._count(connection, utc_day(now), "fires")

    @staticmethod
    def _count(connection: sqlite3.Connection, day: str, column: str) -> None:
        connection.execute(
            f"INSERT INTO alarm_fires (day, {column}) VALUES (?, 1) "
            f"ON CONFLICT (day) DO UPDATE SET {column} = {column} + 1",
            (day,),
        )
        # Only today's count caps fires; yesterday's stays for the operator. Older days go
        # here, in the fire's own transaction (a key range of a table of two or three rows),
        # or an actor file would keep a row for every day it ever fired.
        connection.execute("DELETE FROM alarm_fires WHERE day < date(?, '-1 day')", (day,))

    @staticmethod
    def fires_on(connection: sqlite3.Connection, day: str) -> tuple[int, int]:
        """``(fires, refused)`` counted on the UTC ``day``."""
        row = connection.execute(
            "SELECT fires, refused FROM alarm_fires WHERE day = ?", (day,)
        ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))
