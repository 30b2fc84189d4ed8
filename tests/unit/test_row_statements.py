"""Many rows in a few statements (``actors.row_statements``): the rows land as one statement
each would land them, in order, an upsert's later rows seeing its earlier ones; a batch takes
a statement per 64 rows and at most one of each smaller size; anything but an
``INSERT … VALUES (?, …)`` goes row by row. The outbox's publish marks go that way too."""

from __future__ import annotations

import random
import sqlite3

import pytest

from rhumbatron.actors.outbox import OUTBOX_SCHEMA, mark_published
from rhumbatron.actors.row_statements import CHUNK_ROWS, values_chunks, write_rows

_TASKS = """
CREATE TABLE tasks (
    project_id  TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    status      TEXT NOT NULL,
    updated_seq INTEGER NOT NULL,
    PRIMARY KEY (project_id, task_id)
) WITHOUT ROWID;
"""
# The view projections' shape: an upsert that keeps the newest sequence per key.
_UPSERT = (
    "INSERT INTO tasks (project_id, task_id, status, updated_seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (project_id, task_id) DO UPDATE SET status = excluded.status, "
    "updated_seq = excluded.updated_seq WHERE excluded.updated_seq > tasks.updated_seq"
)
# An upsert whose result is the order its rows came in: any reordering shows.
_APPEND = (
    "INSERT INTO tasks (project_id, task_id, status, updated_seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (project_id, task_id) DO UPDATE SET status = tasks.status || ',' || "
    "excluded.status, updated_seq = tasks.updated_seq + excluded.updated_seq"
)


def _database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(_TASKS)
    return db


def _statements(db: sqlite3.Connection) -> list[str]:
    """The statements ``db`` runs from now on (one entry per execution: an ``executemany``
    over N rows is N)."""
    ran: list[str] = []
    db.set_trace_callback(ran.append)
    return ran


def test_a_batch_is_cut_into_values_lists_of_64_32_16_8_4_2_and_1_rows_in_order() -> None:
    rows = [(n, f"r{n}") for n in range(100)]
    chunks = list(values_chunks(rows))
    assert [values.count("(") for values, _ in chunks] == [64, 32, 4]
    assert chunks[2][0] == "(?, ?), (?, ?), (?, ?), (?, ?)"
    assert [value for _, parameters in chunks for value in parameters] == [
        value for row in rows for value in row
    ]
    assert CHUNK_ROWS == (64, 32, 16, 8, 4, 2, 1)
    assert [values.count("(") for values, _ in values_chunks([(n,) for n in range(127)])] == [
        64,
        32,
        16,
        8,
        4,
        2,
        1,
    ]
    assert list(values_chunks([])) == []


@pytest.mark.parametrize("sql", [_UPSERT, _APPEND], ids=["newest-wins", "in-order"])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 45, 64, 65, 100, 130])
def test_rows_written_together_end_as_row_by_row_even_when_they_upsert_each_other(
    count: int, sql: str
) -> None:
    # GIVEN a batch where the same keys come back, with sequences up and down (an upsert
    #   that keeps the newest): each row must see the rows before it
    rng = random.Random(count)
    rows = [
        (f"p{rng.randrange(3)}", f"t{rng.randrange(12)}", f"s{n}", rng.randrange(50))
        for n in range(count)
    ]
    one_by_one, together = _database(), _database()
    for row in rows:
        one_by_one.execute(sql, row)
    # WHEN the batch is written together
    write_rows(together, sql, rows)
    # THEN the table is the one the rows written one by one leave
    table = "SELECT * FROM tasks ORDER BY project_id, task_id"
    assert together.execute(table).fetchall() == one_by_one.execute(table).fetchall()


@pytest.mark.parametrize(("count", "statements"), [(1, 1), (2, 1), (3, 2)])
def test_a_few_rows_take_a_statement_per_values_list(count: int, statements: int) -> None:
    # GIVEN an upsert of one, two or three rows
    db = _database()
    ran = _statements(db)
    # WHEN they are written together
    write_rows(db, _UPSERT, [("p", f"t{n}", "ready", n) for n in range(count)])
    # THEN two rows are one statement of two VALUES groups, three are a 2 and a 1
    assert len(ran) == statements


def test_a_batch_of_100_rows_is_three_statements_and_an_update_stays_row_by_row() -> None:
    db = _database()
    ran = _statements(db)
    write_rows(db, _UPSERT, [("p", f"t{n}", "ready", n) for n in range(100)])
    assert len(ran) == 3  # 64 + 32 + 4 rows
    ran.clear()
    update = "UPDATE tasks SET status = ? WHERE task_id = ?"
    write_rows(db, update, [("done", f"t{n}") for n in range(5)])
    assert len(ran) == 5
    assert all(statement.startswith("UPDATE tasks SET status = 'done'") for statement in ran)
    assert db.execute("SELECT COUNT(*) FROM tasks WHERE status = 'done'").fetchone() == (5,)


def test_a_parameter_outside_the_row_keeps_the_statement_row_by_row() -> None:
    db = _database()
    ran = _statements(db)
    sql = (
        "INSERT INTO tasks (project_id, task_id, status, updated_seq) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (project_id, task_id) DO UPDATE SET status = ?"
    )
    write_rows(db, sql, [("p", "t", "ready", 1, "x"), ("p", "t", "ready", 2, "again")])
    assert len(ran) == 2
    assert db.execute("SELECT status, updated_seq FROM tasks").fetchall() == [("again", 1)]


def test_publish_marks_of_150_rows_are_a_few_statements_each_row_with_its_sequence() -> None:
    # GIVEN an outbox (its real schema: the state counts kept by triggers) of 200 pending rows
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(OUTBOX_SCHEMA)
    db.executemany(
        "INSERT INTO outbox (event_id, project_id, event_type, stream_index, envelope, "
        "next_attempt_at, created_at) VALUES (?, 'prj', 'task.ready', 0, x'7b7d', 9.0, 1.0)",
        [(f"evt-{n}",) for n in range(200)],
    )
    # WHEN the first 150 are marked stored, only the last one's position known (a fast batch)
    sent = [(seq, 1_000 if seq == 150 else None) for seq in range(1, 151)]
    ran = _statements(db)
    mark_published(db, sent, now_s=42.0)
    # THEN that is five statements (64 + 64 + 16 + 4 + 2 rows), each row marked with its
    #   own position, the rest untouched, and the state counts moved with them
    assert len(set(ran)) == 5  # (the triggers' steps are traced with their statement's text)
    rows = db.execute("SELECT seq, state, published_at, stream_seq, next_attempt_at FROM outbox")
    by_seq = {row[0]: row[1:] for row in rows}
    assert all(by_seq[seq] == ("published", 42.0, None, None) for seq in range(1, 150))
    assert by_seq[150] == ("published", 42.0, 1_000, None)
    assert all(by_seq[seq] == ("pending", None, None, 9.0) for seq in range(151, 201))
    assert dict(db.execute("SELECT state, n FROM outbox_counts")) == {
        "pending": 50,
        "published": 150,
        "retry_wait": 0,
        "failed": 0,
    }
    # AND a seq sent twice keeps its last position, as one UPDATE per row did
    mark_published(db, [(151, 7), (152, None), (151, 8)], now_s=43.0)
    assert db.execute("SELECT stream_seq FROM outbox WHERE seq = 151").fetchone() == (8,)
