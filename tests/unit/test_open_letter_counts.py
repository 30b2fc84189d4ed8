"""The open dead letters per (queue, kind) that the sweep gives the dashboards and the
open-dead-letters alarm (spec "Dead-letter path"), over a real product-database file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.settings import load_settings
from rhumbatron.product.dead_letters import (
    DEAD_LETTERS_SCHEMA,
    command_dead_letter_id,
    dismiss_dead_letter,
    record_command_dead_letter,
    record_poison_event,
    record_reaction_dead_letter,
)
from rhumbatron.queues.dead_letter import open_letter_counts, record_undecodable_command

NOW_S = 1_800_000_000.0

#: Every pair that reads zero with no letters: the four queues that move their failures to the
#: dead-letter queue, the five subscriptions of the event streams, the webhook deliveries.
NONE_OPEN = {
    ("agent-wakeups", "command"): 0,
    ("integration", "command"): 0,
    ("verification", "command"): 0,
    ("release", "command"): 0,
    ("causal-router", "poison_event"): 0,
    ("project-view-projector", "poison_event"): 0,
    ("audit-archiver", "poison_event"): 0,
    ("analytics-projector", "poison_event"): 0,
    ("reactions", "poison_event"): 0,
    ("reactions", "reaction"): 0,
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    store = SqliteStore(
        tmp_path / "product.sqlite", load_settings(state_dir=tmp_path), DEAD_LETTERS_SCHEMA
    )
    yield store.connection
    store.close()


def command_letter(db: sqlite3.Connection, command_id: str, queue: str) -> None:
    record_command_dead_letter(
        db,
        command_id=command_id,
        command_type="change.settle",
        queue=queue,
        attempt=1,
        reason="boom",
        body="{}",
        now_s=NOW_S,
    )


def test_with_no_letters_every_pair_that_can_have_one_reads_zero(
    db: sqlite3.Connection,
) -> None:
    assert open_letter_counts(db) == NONE_OPEN


def test_open_letters_are_counted_by_queue_and_kind_and_closed_ones_are_not(
    db: sqlite3.Connection,
) -> None:
    # GIVEN two open command letters of integration, one of release dismissed, a poison
    # event of the archiver, a webhook delivery's letter, and an undecodable body of indexing
    command_letter(db, "cmd_1", "integration")
    command_letter(db, "cmd_2", "integration")
    command_letter(db, "cmd_3", "release")
    dismiss_dead_letter(db, command_dead_letter_id("cmd_3"), now_s=NOW_S)
    record_poison_event(
        db,
        consumer="audit-archiver",
        event_key="evt_x",
        stream="EVENTS_0",
        stream_seq=4,
        reason="boom",
        body="{}",
        now_s=NOW_S,
    )
    record_reaction_dead_letter(
        db,
        delivery_key="sub_x:evt_y",
        tenant_id="acme",
        project_id="acme-web",
        attempts=7,
        reason="answered 500",
        body="{}",
        now_s=NOW_S,
    )
    record_undecodable_command(
        db, queue="indexing", stream_seq=3, reason="junk", body="junk", now_s=NOW_S
    )
    # THEN each open letter counts under its pair; the dismissed one does not
    assert open_letter_counts(db) == NONE_OPEN | {
        ("integration", "command"): 2,
        ("audit-archiver", "poison_event"): 1,
        ("reactions", "reaction"): 1,
        # a pair outside the zeros appears once it has letters
        ("indexing", "command"): 1,
    }
