"""Many rows in a few SQLite statements, for the hot paths that write a batch of rows.

Python's ``sqlite3`` gives up the GIL around each ``sqlite3_step``, and ``executemany`` steps
once per row. On a worker thread (the publisher's and the projector's commits run there)
every row is then a hand-over of the GIL to the event loop's thread and back, and when that
thread is busy too, each hand-over waits for it: measured on ``publish_due``, the event loop's
outbox read of about 94 rows took 2.0 ms of wall time for 0.8 ms of CPU while the other
actors' commits marked their rows one ``UPDATE`` per row (``docs/performance.md``). One
statement over many rows steps once.

:func:`values_chunks` cuts a batch into ``VALUES`` lists of 64, 32, 16, 8, 4, 2 and 1 rows, at
most one of each size below 64, so a statement shape keeps at most seven texts in the
connection's statement cache. :func:`write_rows` runs an ``INSERT … VALUES (?, …) …``
statement (an upsert clause included) for a batch of rows that way; SQLite inserts the rows of
one statement in order, each seeing the ones before it, as ``executemany`` did. An
``UPDATE … FROM (VALUES …)`` needs SQLite 3.33 (:data:`UPDATE_FROM`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

__all__ = ["CHUNK_ROWS", "UPDATE_FROM", "values_chunks", "write_rows"]

#: Whether this SQLite runs ``UPDATE … FROM`` (3.33 and later; the Lambda runtime's has it).
UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)

#: Rows per statement, largest first (see the module's docstring).
CHUNK_ROWS = (64, 32, 16, 8, 4, 2, 1)

# One ``VALUES`` group of placeholders only, as the batched INSERT statements write it.
_ONE_VALUES_GROUP = re.compile(r"\bVALUES\s*\((\s*\?\s*(?:,\s*\?\s*)*)\)", re.IGNORECASE)


@lru_cache(maxsize=64)
def _values_list(width: int, rows: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return ", ".join([one] * rows)


def values_chunks(rows: Sequence[Sequence[Any]]) -> Iterator[tuple[str, list[Any]]]:
    """``rows`` (each of the same width) as a few ``VALUES`` lists, in order: for each chunk,
    ``("(?, ?), (?, ?)", [row 1's values, row 2's values])``."""
    if not rows:
        return
    width = len(rows[0])
    start, left = 0, len(rows)
    for size in CHUNK_ROWS:
        while left >= size:
            chunk = rows[start : start + size]
            yield _values_list(width, size), [value for row in chunk for value in row]
            start, left = start + size, left - size


@lru_cache(maxsize=128)
def _split(sql: str) -> tuple[str, str] | None:
    """``(head, tail)`` around the one ``VALUES (?, …)`` group of ``sql``, or None when it
    has no such group (an ``UPDATE``, a ``DELETE``) or more than one."""
    groups = list(_ONE_VALUES_GROUP.finditer(sql))
    if len(groups) != 1 or not sql.lstrip().upper().startswith("INSERT"):
        return None
    match = groups[0]
    if match.group(1).count("?") != sql.count("?"):
        return None  # a parameter outside the row (``DO UPDATE SET x = ?``): not per row
    return sql[: match.start()] + "VALUES ", sql[match.end() :]


def write_rows(db: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``sql`` once per row of ``rows``, in order, with as few statements as
    :func:`values_chunks` allows when ``sql`` is an ``INSERT`` with one ``VALUES (?, …)``
    group; any other statement goes through ``executemany``."""
    if not rows:
        return
    if len(rows) == 1 or _split(sql) is None:
        db.executemany(sql, rows)
        return
    for values, parameters in values_chunks(rows):
        db.execute(_statement(sql, values), parameters)


@lru_cache(maxsize=256)
def _statement(sql: str, values: str) -> str:
    head, tail = _split(sql) or ("", "")
    return head + values + tail
