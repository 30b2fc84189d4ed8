"""What the SQLite files under a state directory hold (``rhumbatron inspect``, the soak).

Each file is read through ``sqlite-utils`` on a read-only connection (nothing is created or
changed, and a writer is never blocked): its tables with their row counts, the bytes its pages
use (the WAL's included, free pages not) and the size of its WAL file, and for an actor file
its outbox by state. Files are grouped by kind, from where they sit under the state
directory: ``actor`` (``projects/``), ``view`` (``views/``), ``stream_state`` (``router/``),
and the single files by name (``product``, ``causal``, ``workflows``). Not on any hot path.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.errors import ConfigurationError

__all__ = ["FileSummary", "KindTotals", "file_kind", "inspect_file", "inspect_state", "totals"]

_KIND_OF_DIRECTORY = {"projects": "actor", "views": "view", "router": "stream_state"}


@dataclass(frozen=True, slots=True)
class FileSummary:
    """One SQLite file: its kind, rows per table, bytes in use and of its WAL, and (an actor
    file) its outbox rows by state."""

    path: Path
    kind: str
    rows: dict[str, int]
    used_bytes: int
    wal_bytes: int
    outbox: dict[str, int] | None

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "rows": self.rows,
            "usedBytes": self.used_bytes,
            "walBytes": self.wal_bytes,
            "outbox": self.outbox,
        }


@dataclass(frozen=True, slots=True)
class KindTotals:
    """Files summed by kind: rows per ``kind.table``, bytes in use and of WALs per kind."""

    files: dict[str, int]
    rows: dict[str, int]
    used_bytes: dict[str, int]
    wal_bytes: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {
            "files": self.files,
            "rows": self.rows,
            "usedBytes": self.used_bytes,
            "walBytes": self.wal_bytes,
        }


def file_kind(path: Path, state_dir: Path) -> str:
    """The kind of the SQLite file at ``path`` (see the module docstring)."""
    try:
        parts = path.relative_to(state_dir).parts
    except ValueError:
        return path.stem
    if len(parts) > 1:
        return _KIND_OF_DIRECTORY.get(parts[0], parts[0])
    return path.stem


def inspect_file(path: Path, state_dir: Path | None = None) -> FileSummary:
    """The summary of one SQLite file, read only. Raises :class:`ConfigurationError` naming
    the file when it is missing or is not a database."""
    if not path.is_file():
        raise ConfigurationError(f"no file at {path}; name an actor, view or state file")
    try:
        from sqlite_utils import Database
    except ImportError:
        raise ConfigurationError(
            "inspecting state files needs the sqlite-utils package: pip install "
            "'rhumbatron[local]' (or sqlite-utils)"
        ) from None
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        db = Database(connection, execute_plugins=False)
        rows = {table.name: table.count for table in db.tables}
        pages, free, page_size = (
            connection.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_count", "freelist_count", "page_size")
        )
        outbox = None
        if "outbox_counts" in rows:
            outbox = {
                str(state): int(n) for state, n in db.execute("SELECT state, n FROM outbox_counts")
            }
    except sqlite3.DatabaseError as exc:
        raise ConfigurationError(f"{path} is not a readable SQLite database: {exc}") from exc
    finally:
        connection.close()
    wal = path.with_name(path.name + "-wal")
    return FileSummary(
        path=path,
        kind=file_kind(path, state_dir) if state_dir is not None else path.stem,
        rows=rows,
        used_bytes=(pages - free) * page_size,
        wal_bytes=wal.stat().st_size if wal.exists() else 0,
        outbox=outbox,
    )


def inspect_state(state_dir: Path) -> list[FileSummary]:
    """Every SQLite file under ``state_dir``, in path order."""
    if not state_dir.is_dir():
        raise ConfigurationError(
            f"no state directory at {state_dir}; set RHUMBATRON_STATE_DIR or name one"
        )
    return [inspect_file(path, state_dir) for path in sorted(state_dir.rglob("*.sqlite"))]


def totals(summaries: Iterable[FileSummary]) -> KindTotals:
    """``summaries`` summed by kind."""
    files: Counter[str] = Counter()
    rows: Counter[str] = Counter()
    used: Counter[str] = Counter()
    wal: Counter[str] = Counter()
    for summary in summaries:
        files[summary.kind] += 1
        used[summary.kind] += summary.used_bytes
        wal[summary.kind] += summary.wal_bytes
        for table, count in summary.rows.items():
            rows[f"{summary.kind}.{table}"] += count
    return KindTotals(dict(files), dict(rows), dict(used), dict(wal))
