"""The due-actor index: which actor files may hold an alarm, and from when, unopened.

The every-minute scan used to open every actor file to read its alarm. On EFS each open is
several metadata operations, and a deployment of thousands of projects paid them every minute
for the handful of actors with work. The index is a directory, ``<state>/alarms/``, holding
one empty file per actor that may have an alarm, named by the actor's key, whose mtime is no
later than that alarm. One listing of the directory (the mtimes come with it) names the
actors the scan must visit; nothing else is opened.

The invariant: **an actor whose file holds an alarm due at t has a marker whose mtime is at
most t.** It is kept like this:

* A write that moves an alarm earlier marks it *inside* its write transaction, before COMMIT
  (:meth:`DueIndex.mark`). A writer killed between the mark and the commit leaves a marker
  that is too early, which only costs the scan a visit.
* Only a visit settles a marker (:meth:`DueIndex.settle`), and only under the actor's write
  lock, from the alarm it reads there: no alarm and the marker goes; a later alarm and its
  mtime moves to it. No writer can come between that read and the settle, so no committed
  alarm is ever left without its marker.
* A state directory from before the index has no ``.complete`` stamp: the first scan walks
  every actor file, settles each one's marker, then writes the stamp (:meth:`mark_complete`).
  The walk is repeated once a day (:data:`FULL_WALK_EVERY_S`): a marker's directory entry is
  not fsynced, so a power cut on a local disk could lose one whose alarm's commit survived;
  the day's walk finds it again. On EFS each create and utime is durable when it returns.

A marker whose alarm was deleted by a fire stays until the next scan visits it once; the fire
path pays nothing for the index, and the scan's visits are bounded by the actors that had
work since the last scan, not by the actor files on disk.

The index also names every actor whose outbox holds a ``failed`` row, which has no alarm: its
marker stands at :data:`NEVER_DUE_S`, so the scan never visits it for that, while the outbox
backlog gauge, which reads every marker (:meth:`DueIndex.marked`), does. So **every actor with an
open outbox row (pending, retry_wait or failed) has a marker**, and the gauge opens those
actors, not every actor file. The transaction that fails a row marks it; a settle keeps it for
as long as a failed row is left.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.paths import path_under

__all__ = ["FULL_WALK_EVERY_S", "NEVER_DUE_S", "DueIndex"]

_COMPLETE = ".complete"
_NS = 1_000_000_000

#: How long a full walk's stamp stands before the scan walks every actor file again.
FULL_WALK_EVERY_S = 86_400.0

#: The mtime of the marker of an actor whose outbox holds failed rows and no alarm
#: (2100-01-01): listed by :meth:`DueIndex.marked`, never due. Far below the 2**63 ns a file
#: time holds.
NEVER_DUE_S = 4_102_444_800.0


@functools.lru_cache(maxsize=65_536)
def _marker_path(root: Path, actor_key: str) -> Path:
    # Checked once per process and key: every write that moves an alarm marks its actor, and
    # path_under resolves two paths (several syscalls) each time.
    return path_under(root, actor_key)


def _ns(at_s: float) -> int:
    # Down, never up: a marker must never come out later than the alarm it stands for. The
    # float product ``at_s * 1e9`` is rounded (to 256 ns at today's epoch), and its floor can
    # land above the alarm; the exact ratio of the float cannot.
    numerator, denominator = at_s.as_integer_ratio()
    return numerator * _NS // denominator


@dataclass(frozen=True, slots=True)
class DueIndex:
    """The markers under ``root`` (``<state>/alarms``)."""

    root: Path

    @classmethod
    def of_state_dir(cls, state_dir: Path) -> DueIndex:
        """The index of the actors under ``state_dir``."""
        return cls(state_dir / "alarms")

    def _marker(self, actor_key: str) -> Path:
        return _marker_path(self.root, actor_key)

    def mark(self, actor_key: str, due_at_s: float) -> None:
        """Make sure the marker of ``actor_key`` is due no later than ``due_at_s``.

        Call it inside the write transaction that sets the alarm (see the module docstring).
        An existing marker already as early costs one ``stat``.
        """
        marker = self._marker(actor_key)
        due_ns = _ns(due_at_s)
        try:
            if marker.stat().st_mtime_ns <= due_ns:
                return
        except FileNotFoundError:
            self._create(marker)
        os.utime(marker, ns=(due_ns, due_ns))

    def settle(self, actor_key: str, alarm_at_s: float | None, *, failed_rows: int) -> None:
        """Set the marker of ``actor_key`` to the alarm its file holds; with no alarm, to
        :data:`NEVER_DUE_S` while it holds ``failed_rows``, else remove it.

        Only under the actor's write lock, with both read under that same lock.
        """
        marker = self._marker(actor_key)
        if alarm_at_s is None:
            if not failed_rows:
                marker.unlink(missing_ok=True)
                return
            alarm_at_s = NEVER_DUE_S
        if not marker.exists():
            self._create(marker)
        due_ns = _ns(alarm_at_s)
        os.utime(marker, ns=(due_ns, due_ns))

    def forget(self, actor_key: str) -> None:
        """Drop the marker of an actor whose file is gone."""
        self._marker(actor_key).unlink(missing_ok=True)

    def marked(self) -> list[str]:
        """The keys of every marked actor, due or not: the actors with an alarm or a failed
        outbox row (and, until a visit settles them, those whose alarm a fire deleted)."""
        try:
            return sorted(e.name for e in os.scandir(self.root) if not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def is_complete(self) -> bool:
        """Whether a full walk ever settled every actor's marker (a state directory from
        before the index has none until its first scan)."""
        return (self.root / _COMPLETE).exists()

    def due(self, now_s: float) -> list[str]:
        """The keys of the actors whose marker is due at ``now_s``, the longest-due first.

        Names are returned as they are: the caller parses each as an actor key, and skips
        (and forgets) a stray one.
        """
        now_ns = _ns(now_s)
        due: list[tuple[int, str]] = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                mtime_ns = entry.stat().st_mtime_ns
            except FileNotFoundError:
                continue  # settled by another scan since the listing
            if mtime_ns > now_ns:
                continue
            due.append((mtime_ns, entry.name))
        due.sort()
        return [key for _, key in due]

    def needs_full_walk(self, now_s: float) -> bool:
        """Whether the scan must walk every actor file: never walked, or the last full walk
        is :data:`FULL_WALK_EVERY_S` old."""
        try:
            walked_ns = (self.root / _COMPLETE).stat().st_mtime_ns
        except FileNotFoundError:
            return True
        return walked_ns + _ns(FULL_WALK_EVERY_S) <= _ns(now_s)

    def mark_complete(self, now_s: float) -> None:
        """Record that a full walk at ``now_s`` settled every actor's marker."""
        stamp = self.root / _COMPLETE
        self._create(stamp)
        os.utime(stamp, ns=(_ns(now_s), _ns(now_s)))

    def _create(self, path: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
