"""Outbox rows and their states (spec "Outbox row states", "Idempotency: Event publish"):

    [*] -> pending -> published -> [*]
    pending -> retry_wait (send failed) -> pending after 1 s, 2 s, 4 s ... max 5 min
    retry_wait -> failed (10th failed attempt); pending -> failed (no producer binding)

The publisher runs here through an in-memory EventSender (an injected port); the same state
machine against a real nats-server is in tests/integration/test_publisher.py.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from outbox_rows import append_ready_tasks
from rhumbatron.actors.alarms import AlarmGuard, FireDecision, RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.outbox import (
    RowState,
    backoff_s,
    counts_by_state,
    mark_failed,
    mark_published,
    prune_published,
    published_since,
    requeue_failed,
)
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import OutboxPublisher, PublishReport, requeue_failed_rows
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.actors.storage import write_transaction
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.core.tracing import Span, install_span_sink
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.sender import (
    HEADER_ALLOWANCE_BYTES,
    FastBatchAck,
    OutgoingMessage,
    StoredMessage,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.protocol.tracecontext import TraceContext
from rhumbatron_dev.testing import MemorySender, RefusingSender, SenderWrapper

CALLER = Caller("acme", "system:test", correlation_id="corr-outbox")
PROJECT = "acme-web"  # stream index 0 (fnv1a32 0xc8d18fd0 mod 8)
DAY_S = 86_400.0


def offline(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", **overrides)


def new_root(settings: Settings, clock: ManualClock) -> ProjectRoot:
    return ProjectRoot(
        ProjectRoot.ref_for(PROJECT), settings, clock=clock, alarms=RecordingAlarmSink()
    )


def change_shard(settings: Settings, clock: ManualClock, change_id: str) -> ResourceShard:
    ref = ResourceShard.ref_for(PROJECT, change_resource_key(change_id), 16)
    return ResourceShard(ref, settings, clock=clock, alarms=RecordingAlarmSink())


def rows(connection: sqlite3.Connection) -> list[sqlite3.Row]:
    return list(connection.execute("SELECT * FROM outbox ORDER BY seq"))


def task_facts(count: int) -> tuple[ChangeFact, ...]:
    return tuple(ChangeFact("task.ready", {}, task_id=f"tsk-{i:03d}") for i in range(count))


# --------------------------------------------------------------------------- [*] -> pending


def test_a_fact_is_inserted_pending_in_the_same_transaction_as_its_state_change(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a ProjectRoot
    root = new_root(offline(tmp_path), clock)
    # WHEN the project is created
    result = root.create_project(CALLER, name="Acme")
    # THEN the state row and one pending outbox row exist, the row holding the fact as sent
    assert root.state() is not None
    [row] = rows(root.connection)
    assert result.events_added == 1
    assert row["state"] == RowState.PENDING
    assert row["attempts"] == 0
    assert row["event_type"] == "project.created"
    assert row["project_id"] == PROJECT
    assert row["stream_index"] == 0
    assert row["last_error"] is None
    assert row["created_at"] == clock.now().timestamp()
    assert Event.parse(bytes(row["envelope"])) == result.transition.facts[0]
    assert row["event_id"] == result.transition.facts[0].event_id
    root.close()


def test_appending_the_same_change_fact_twice_leaves_one_row(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a change shard that recorded task.completed for tsk-1
    shard = change_shard(offline(tmp_path), clock, "chg-1")
    fact = ChangeFact("task.completed", {"agentId": "builder-1"}, task_id="tsk-1")
    first = shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,))
    )
    # WHEN a retried workflow step appends the same fact again
    clock.advance(seconds=30)
    second = shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,))
    )
    # THEN the outbox ignores the repeat: one row, with the stable ID; nothing added the 2nd time
    assert (first.events_added, second.events_added) == (1, 0)
    assert [r["event_id"] for r in rows(shard.connection)] == [
        "evt_b842dd8af0a9b557c516a6417d20c1ba"  # sha256sum of chg-1␟task.completed␟tsk-1␟
    ]
    shard.close()


def test_outbox_event_id_is_unique_in_the_schema(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN an outbox row
    root = new_root(offline(tmp_path), clock)
    root.create_project(CALLER, name="Acme")
    [row] = rows(root.connection)
    # WHEN a plain INSERT repeats its event_id
    # THEN SQLite refuses it: event_id is UNIQUE (S0-025, S0-214)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        root.connection.execute(
            "INSERT INTO outbox (event_id, project_id, event_type, stream_index, envelope, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (row["event_id"], PROJECT, "project.created", 0, b"{}", 0.0),
        )
    root.close()


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("envelope", b'{"eventId": "forged"}'),
        ("event_id", "evt_" + "0" * 32),
        ("event_type", "task.completed"),
        ("project_id", "someone-else"),
        ("stream_index", 3),
    ],
)
def test_a_written_fact_cannot_be_updated(
    tmp_path: Path, clock: ManualClock, column: str, value: object
) -> None:
    # GIVEN an outbox row
    root = new_root(offline(tmp_path), clock)
    root.create_project(CALLER, name="Acme")
    before = bytes(rows(root.connection)[0]["envelope"])
    # WHEN anything tries to rewrite the fact
    # THEN the trigger refuses: an Event is an immutable fact (S0-001)
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        root.connection.execute(f"UPDATE outbox SET {column} = ?", (value,))
    assert bytes(rows(root.connection)[0]["envelope"]) == before
    # AND the row's delivery state may still move
    root.connection.execute("UPDATE outbox SET state = 'published'")
    assert rows(root.connection)[0]["state"] == RowState.PUBLISHED
    root.close()


# --------------------------------------------------------------------------- backoff


def test_backoff_doubles_from_one_second_and_caps_at_five_minutes() -> None:
    delays = [
        backoff_s(n, initial_s=1, max_s=300, jitter=0, rng=random.Random(0)) for n in range(1, 13)
    ]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]


def test_backoff_with_jitter_stays_within_twenty_percent() -> None:
    rng = random.Random(2026)
    for attempts in range(1, 12):
        base = min(2 ** (attempts - 1), 300)
        delays = [
            backoff_s(attempts, initial_s=1, max_s=300, jitter=0.2, rng=rng) for _ in range(200)
        ]
        assert all(0.8 * base <= d <= 1.2 * base for d in delays), attempts
        assert len(set(delays)) > 1  # it does spread the retries


async def test_failed_sends_back_off_doubling_and_the_10th_failed_attempt_fails_the_row(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a pending row and a server that refuses every send (backoff without jitter)
    settings = offline(tmp_path, outbox_backoff_jitter=0)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    sender = RefusingSender()
    publisher = OutboxPublisher(sender, settings, clock=clock, rng=random.Random(0))
    delays = []
    # WHEN the publisher tries, each time once the backoff has passed
    for attempt in range(1, 10):
        report = await publisher.publish_due(root)
        [row] = rows(root.connection)
        # THEN each failure is retry_wait with the attempt counted and last_error kept
        assert report.retry_wait == 1
        assert (row["state"], row["attempts"]) == (RowState.RETRY_WAIT, attempt)
        assert f"attempt {attempt} of 10" in row["last_error"]
        delay = row["next_attempt_at"] - clock.now().timestamp()
        delays.append(delay)
        # AND nothing is sent before the backoff ends
        clock.advance(seconds=delay - 0.001)
        assert (await publisher.publish_due(root)).retry_wait == 0
        assert sender.refusals == attempt
        clock.advance(seconds=0.001)
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # AND the 10th failed attempt makes the row failed, last_error kept for the operator
    report = await publisher.publish_due(root)
    [row] = rows(root.connection)
    assert report.failed == 1
    assert (row["state"], row["attempts"]) == (RowState.FAILED, 10)
    assert "attempt 10 of 10" in row["last_error"]
    assert "refused by the test server" in row["last_error"]
    assert row["next_attempt_at"] is None
    root.close()


async def test_the_publisher_caps_a_rows_backoff_at_five_minutes(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a row the server refuses every time, with attempts enough for the doubling to
    # pass 5 minutes (the default 10 stop at 256 s), no jitter and the default cap
    settings = offline(tmp_path, outbox_backoff_jitter=0, outbox_max_attempts=12)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    publisher = OutboxPublisher(RefusingSender(), settings, clock=clock, rng=random.Random(0))
    delays = []
    # WHEN the publisher tries again each time its backoff has passed
    for _ in range(11):
        assert (await publisher.publish_due(root)).retry_wait == 1
        [row] = rows(root.connection)
        delay = row["next_attempt_at"] - clock.now().timestamp()
        delays.append(delay)
        clock.advance(seconds=delay)
    # THEN the delays double from 1 s and stop at 5 minutes (spec S0-050)
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    root.close()


async def test_a_failed_row_is_terminal_and_never_sent_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a row that failed (the cap lowered to one attempt)
    settings = offline(tmp_path, outbox_max_attempts=1)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    sender = RefusingSender()
    publisher = OutboxPublisher(sender, settings, clock=clock)
    assert (await publisher.publish_due(root)).failed == 1
    # WHEN the publisher runs again, much later
    clock.advance(days=1)
    report = await publisher.publish_due(root)
    # THEN nothing is attempted and the alarm is gone (no due work)
    assert (report.published, report.failed, report.retry_wait) == (0, 0, 0)
    assert sender.refusals == 1
    assert alarm_due_at(root.connection) is None
    root.close()


async def test_a_row_waiting_to_retry_blocks_the_later_rows_of_its_project(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN three rows, and a server that refuses
    settings = offline(tmp_path, outbox_backoff_jitter=0)
    shard = change_shard(settings, clock, "chg-1")
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(3))
    )
    publisher = OutboxPublisher(RefusingSender(), settings, clock=clock)
    # WHEN the send fails
    await publisher.publish_due(shard)
    # THEN the first row waits to retry and the rows behind it are still pending, unattempted
    states = [(r["state"], r["attempts"]) for r in rows(shard.connection)]
    assert states == [(RowState.RETRY_WAIT, 1), (RowState.PENDING, 0), (RowState.PENDING, 0)]
    # AND once the backoff has passed a working publisher sends all three, in outbox order
    clock.advance(seconds=1)
    sender = MemorySender()
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(shard)
    assert report.published == 3
    assert [m.message_id for m in sender.sent] == [r["event_id"] for r in rows(shard.connection)]
    shard.close()


class LooksAtTheActorFileAtEachSend(SenderWrapper):
    """At each send, looks at the actor file through a connection of its own: whether the
    rows being sent are committed there, and whether a writer could begin at once."""

    def __init__(self, inner: MemorySender, path: Path) -> None:
        super().__init__(inner)
        self.path = path
        self.seen: list[tuple[bool, bool]] = []

    def _look(self, messages: Sequence[OutgoingMessage]) -> None:
        other = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        try:
            committed = {r[0] for r in other.execute("SELECT event_id FROM outbox")}
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
                free = True
            except sqlite3.OperationalError:
                free = False
        finally:
            other.close()
        self.seen.append((all(m.message_id in committed for m in messages), free))

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self._look([message])
        return await super().send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        self._look(messages)
        return await super().send_batch(stream, messages)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        self._look(messages)
        return await super().send_fast_batch(stream, messages)


@pytest.mark.parametrize("facts", [1, 3], ids=["a lone row", "a batch"])
async def test_rows_are_sent_after_their_transaction_commits_and_outside_any_transaction(
    tmp_path: Path, clock: ManualClock, facts: int
) -> None:
    # GIVEN a Change's facts written with its state change
    settings = offline(tmp_path)
    shard = change_shard(settings, clock, "chg-1")
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(facts))
    )
    sender = LooksAtTheActorFileAtEachSend(MemorySender(), shard.path)
    # WHEN the publisher sends them
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(shard)
    # THEN every send found its rows committed in the actor file and no transaction open on
    # it (spec S0-007: the publisher sends after the transaction, not inside it)
    assert report.published == len(rows(shard.connection)) >= facts
    assert sender.seen
    assert all(seen == (True, True) for seen in sender.seen), sender.seen
    shard.close()


# --------------------------------------------------------------------------- pending -> published


async def test_a_sent_row_becomes_published_and_is_not_sent_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    sender = MemorySender()
    publisher = OutboxPublisher(sender, settings, clock=clock)
    report = await publisher.publish_due(root)
    [row] = rows(root.connection)
    assert report.published == 1
    assert row["state"] == RowState.PUBLISHED
    assert row["published_at"] == clock.now().timestamp()
    assert row["stream_seq"] == 1
    # the message carries the row's event ID and its envelope, on events.00
    assert sender.sent == [OutgoingMessage("events.00", row["event_id"], bytes(row["envelope"]))]
    # published is terminal: the next run sends nothing
    assert (await publisher.publish_due(root)).published == 0
    assert len(sender.sent) == 1
    root.close()


async def test_the_published_rows_since_a_time_name_their_stream_and_place_in_outbox_order(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a project created, then published; and a change's two facts published later
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    publisher = OutboxPublisher(MemorySender(), settings, clock=clock)
    await publisher.publish_due(root)
    created_at = clock.now().timestamp()
    clock.advance(seconds=60)
    root.create_project(CALLER, name="Acme")  # the same fact again: no second row
    # WHEN reconciliation asks for what was published since, before and after the publish
    [(event_id, index, place)] = published_since(root.connection, since_s=created_at)
    later = published_since(root.connection, since_s=created_at + 1)
    # THEN the row is named with its stream index and its stream sequence; none is later
    assert (index, place) == (0, 1)
    assert event_id == rows(root.connection)[0]["event_id"]
    assert later == []
    root.close()


async def test_with_nats_unreachable_no_attempt_is_counted_and_rows_stay_pending(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a publisher whose connection is down
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    # WHEN a state change commits and the publisher runs, many times over a long outage
    root.create_project(CALLER, name="Acme")
    publisher = OutboxPublisher(MemorySender(connected=False), settings, clock=clock)
    for _ in range(20):
        report = await publisher.publish_due(root)
        assert report.unavailable
        clock.advance(minutes=5)
    # THEN the state change stands and the row is still pending with no attempt burnt
    assert root.state() is not None
    [row] = rows(root.connection)
    assert (row["state"], row["attempts"]) == (RowState.PENDING, 0)
    root.close()


# --------------------------------------------------------------------------- pending -> failed


async def test_a_row_without_a_producer_binding_fails_at_once_with_last_error(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a publisher bound only to streams 1 and 2, and a row for stream 0
    settings = offline(tmp_path, producer_bindings=(1, 2))
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    sender = MemorySender()
    # WHEN it publishes
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(root)
    # THEN the row is failed without an attempt, with the reason, and nothing is sent
    [row] = rows(root.connection)
    assert report.failed == 1
    assert (row["state"], row["attempts"]) == (RowState.FAILED, 0)
    assert "no producer binding for stream EVENTS_00" in row["last_error"]
    assert sender.sent == []
    root.close()


async def test_rows_of_two_projects_failed_unsent_in_one_publish_are_each_counted(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN one outbox holding a row of each of two projects (streams 0 and 1), and a
    #   publisher bound to neither of their streams
    settings = offline(tmp_path, producer_bindings=(7,))
    shard = change_shard(settings, clock, "chg-1")
    for project in (PROJECT, "acme-billing"):
        append_ready_tasks(shard, CALLER, project, ["tsk-1"], clock)
    # WHEN it publishes
    report = await OutboxPublisher(MemorySender(), settings, clock=clock).publish_due(shard)
    # THEN both rows failed unsent, and the report counts both
    assert report.failed == 2
    assert counts_by_state(shard.connection)[RowState.FAILED] == 2
    shard.close()


class CountingSender(SenderWrapper):
    """Records each call the publisher makes: ``("one", 1)`` or ``(batch kind, size)``."""

    def __init__(self, inner: MemorySender) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, int]] = []

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self.calls.append(("one", 1))
        return await super().send(stream, message)

    async def send_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> list[StoredMessage]:
        self.calls.append(("atomic", len(messages)))
        return await super().send_batch(stream, messages)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        self.calls.append(("fast", len(messages)))
        return await super().send_fast_batch(stream, messages)


@pytest.mark.parametrize("mode", ["atomic", "fast"])
async def test_two_due_rows_of_a_project_go_as_one_batch_and_a_lone_row_goes_alone(
    tmp_path: Path, clock: ManualClock, mode: str
) -> None:
    # GIVEN a project with two due rows, and a publisher sending batches of one kind
    settings = offline(tmp_path, publish_batch_mode=mode)
    shard = change_shard(settings, clock, "chg-1")
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(2))
    )
    sender = CountingSender(MemorySender())
    publisher = OutboxPublisher(sender, settings, clock=clock)
    # WHEN it publishes, THEN the two rows went in one batch: one round trip
    assert (await publisher.publish_due(shard)).published == 2
    assert sender.calls == [(mode, 2)]
    # WHEN one more row is due, THEN it goes alone (a batch needs two)
    shard.apply(
        CALLER,
        AppendChangeEvents(
            change_id="chg-1", status="planned", facts=(ChangeFact("task.ready", {}, task_id="t9"),)
        ),
    )
    assert (await publisher.publish_due(shard)).published == 1
    assert sender.calls == [(mode, 2), ("one", 1)]
    shard.close()


async def test_an_oversize_row_fails_fast_and_the_other_rows_keep_flowing(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a big change.created row followed by two small rows
    settings = offline(tmp_path)
    shard = change_shard(settings, clock, "chg-1")
    big = ChangeFact(
        "change.created",
        {"title": "x" * 500, "clientRequestId": "req-1", "requestedBy": "user:u"},
    )
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=(big, *task_facts(2)))
    )
    first, *rest = rows(shard.connection)
    # AND a server whose max_payload is smaller than the big row
    sender = MemorySender(max_payload=len(first["envelope"]) - 1)
    # WHEN the publisher runs
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(shard)
    # THEN the big row fails at once with last_error naming max_payload; the others are sent
    assert (report.failed, report.published) == (1, 2)
    states = {r["event_id"]: (r["state"], r["last_error"]) for r in rows(shard.connection)}
    state, error = states[first["event_id"]]
    assert state == RowState.FAILED
    assert "max_payload" in error
    assert [m.message_id for m in sender.sent] == [r["event_id"] for r in rest]
    shard.close()


async def test_an_undecodable_stored_envelope_fails_fast_with_last_error(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a row whose stored envelope is not an Event (a corrupted file, say)
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    root.connection.execute(
        "INSERT INTO outbox (event_id, project_id, event_type, stream_index, envelope, "
        "created_at) VALUES ('evt_ffffffffffffffffffffffffffffffff', ?, 'project.created', 0, "
        "?, 0)",
        (PROJECT, b"not json"),
    )
    sender = MemorySender()
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(root)
    assert (report.published, report.failed) == (1, 1)
    bad = rows(root.connection)[1]
    assert bad["state"] == RowState.FAILED
    assert "stored envelope is not a JSON object" in bad["last_error"]
    root.close()


_DAMAGED_ID = "evt_" + "e" * 32


@pytest.mark.parametrize(
    ("envelope", "error"),
    [
        (b"not json", "stored envelope is not a JSON object; the row is damaged"),
        (
            f'{{"eventId":"{_DAMAGED_ID}","eventType":"project.created","projectId":"{PROJECT}"'
            ", ".encode(),
            "stored envelope is not a JSON object; the row is damaged",
        ),
        (
            f'{{"eventId":"{_DAMAGED_ID}","eventType":"project.created"}}'.encode(),
            "stored envelope lacks this row's projectId; the row is damaged",
        ),
        (
            f'{{"eventId":"{_DAMAGED_ID}","projectId":"{PROJECT}"}}'.encode(),
            "stored envelope lacks this row's eventType; the row is damaged",
        ),
        (
            b'{"eventId":"evt_other"}',
            "stored envelope lacks this row's eventId, eventType, projectId; the row is damaged",
        ),
    ],
    ids=["not json", "cut short", "no projectId", "no eventType", "another event's"],
)
async def test_a_damaged_stored_envelope_fails_unsent_naming_what_it_lacks(
    tmp_path: Path, clock: ManualClock, envelope: bytes, error: str
) -> None:
    # GIVEN a row whose stored envelope is not this row's Event (raw SQL: no API writes one)
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.connection.execute(
        "INSERT INTO outbox (event_id, project_id, event_type, stream_index, envelope, "
        "created_at) VALUES (?, ?, 'project.created', 0, ?, 0)",
        (_DAMAGED_ID, PROJECT, envelope),
    )
    sender = MemorySender()
    # WHEN the publisher runs
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(root)
    # THEN the row fails unsent, and its error says what is wrong with it
    [row] = rows(root.connection)
    assert (report.failed, report.published, sender.sent) == (1, 0, [])
    assert (row["state"], row["attempts"], row["last_error"]) == (RowState.FAILED, 0, error)
    root.close()


@pytest.mark.parametrize(("room", "published"), [(0, 1), (-1, 0)], ids=["fits", "one over"])
async def test_a_row_fits_when_it_and_its_header_allowance_are_exactly_max_payload(
    tmp_path: Path, clock: ManualClock, room: int, published: int
) -> None:
    # GIVEN a row, and a server whose max_payload is its size plus the header allowance
    #   (or one byte less)
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    [row] = rows(root.connection)
    sender = MemorySender(max_payload=len(row["envelope"]) + HEADER_ALLOWANCE_BYTES + room)
    # WHEN the publisher runs, THEN the row is sent only when it fits
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(root)
    assert (report.published, report.failed) == (published, 1 - published)
    root.close()


async def test_an_alarm_fire_while_the_server_is_unreachable_counts_and_keeps_its_alarm(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a project whose alarm is due with a row to send, and no connection to the server
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    due_at = alarm_due_at(root.connection)
    assert due_at is not None
    # WHEN the alarm fires
    report = await OutboxPublisher(MemorySender(connected=False), settings, clock=clock).fire_alarm(
        root
    )
    # THEN the fire is counted, nothing is sent, and the report names the alarm still due
    assert (report.alarm, report.unavailable, report.published) == (FireDecision.FIRE, True, 0)
    assert report.next_alarm_at == due_at == alarm_due_at(root.connection)
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (1, 0)
    assert counts_by_state(root.connection)[RowState.PENDING] == 1
    root.close()


class StoresTheFirstOfAFastBatch(SenderWrapper):
    """A fast batch of which the server kept only the first ``kept`` messages (the rest were
    lost on the way): the publisher sends the rest one by one."""

    def __init__(self, inner: MemorySender, kept: int) -> None:
        super().__init__(inner)
        self.kept = kept
        self.one_by_one: list[str] = []

    async def send(self, stream: str, message: OutgoingMessage) -> StoredMessage:
        self.one_by_one.append(message.message_id)
        return await super().send(stream, message)

    async def send_fast_batch(
        self, stream: str, messages: Sequence[OutgoingMessage]
    ) -> FastBatchAck:
        return await super().send_fast_batch(stream, messages[: self.kept])


async def test_rows_a_fast_batch_kept_and_the_rest_sent_one_by_one_are_all_marked_published(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN three due rows, and a server that keeps the first two of their fast batch
    settings = offline(tmp_path, publish_batch_mode="fast")
    shard = change_shard(settings, clock, "chg-1")
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(3))
    )
    sender = StoresTheFirstOfAFastBatch(MemorySender(), kept=2)
    # WHEN the publisher runs
    report = await OutboxPublisher(sender, settings, clock=clock).publish_due(shard)
    # THEN the third went one by one, and all three count and are marked published
    written = rows(shard.connection)
    assert sender.one_by_one == [written[2]["event_id"]]
    assert report.published == 3
    assert [r["state"] for r in written] == [RowState.PUBLISHED] * 3
    shard.close()


async def test_a_publish_records_a_publish_span_under_each_rows_position(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN two due rows of a Change, each stamped with its own position in the Change's trace
    settings = offline(tmp_path)
    shard = change_shard(settings, clock, "chg-1")
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(2))
    )
    positions = [TraceContext.parse(r["traceparent"]) for r in rows(shard.connection)]
    finished: list[Span] = []
    uninstall = install_span_sink(SimpleNamespace(record=finished.append))
    # WHEN the publisher sends them
    try:
        before = time.time()
        await OutboxPublisher(MemorySender(), settings, clock=clock).publish_due(shard)
        after = time.time()
    finally:
        uninstall()
    # THEN one "publish" span is recorded under each position, timed within the publish
    publishes = [s for s in finished if s.name == "publish"]
    assert [(s.context.trace_id, s.parent_id) for s in publishes] == [
        (p.trace_id, p.span_id) for p in positions if p is not None
    ]
    assert len(publishes) == 2
    assert all(before <= s.start_s <= (s.end_s or 0) <= after for s in publishes)
    shard.close()


# --------------------------------------------------------------------------- operator requeue


async def test_requeue_puts_failed_rows_back_to_pending_with_attempts_reset(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN two failed rows
    settings = offline(tmp_path, outbox_max_attempts=1)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    publisher = OutboxPublisher(RefusingSender(), settings, clock=clock)
    await publisher.publish_due(root)  # row 1 fails
    await publisher.publish_due(root)  # row 2 fails
    await publisher.publish_due(root)  # row 3 fails
    assert counts_by_state(root.connection)[RowState.FAILED] == 3
    ids = [r["event_id"] for r in rows(root.connection)]
    # WHEN the operator requeues two of them by ID, then all the rest
    with write_transaction(root.connection, root.path) as db:
        assert requeue_failed(db, [ids[1], ids[2]]) == 2
    assert [(r["state"], r["attempts"]) for r in rows(root.connection)] == [
        (RowState.FAILED, 1),
        (RowState.PENDING, 0),
        (RowState.PENDING, 0),
    ]
    with write_transaction(root.connection, root.path) as db:
        assert requeue_failed(db) == 1
    # THEN every row is pending again and a working publisher sends them, in outbox order
    assert counts_by_state(root.connection)[RowState.PENDING] == 3
    sender = MemorySender()
    assert (await OutboxPublisher(sender, settings, clock=clock).publish_due(root)).published == 3
    assert [m.message_id for m in sender.sent] == ids
    root.close()


async def test_requeue_failed_rows_sets_and_announces_the_alarm(
    tmp_path: Path, clock: ManualClock
) -> None:
    settings = offline(tmp_path, producer_bindings=(1,))
    sink = RecordingAlarmSink()
    root = ProjectRoot(ProjectRoot.ref_for(PROJECT), settings, clock=clock, alarms=sink)
    root.create_project(CALLER, name="Acme")
    await OutboxPublisher(MemorySender(), settings, clock=clock).publish_due(root)
    assert alarm_due_at(root.connection) is None
    sink.announced.clear()
    clock.advance(seconds=10)
    assert requeue_failed_rows(root, ["evt_of_another_row"]) == 0  # only the rows named
    assert requeue_failed_rows(root) == 1
    assert alarm_due_at(root.connection) == clock.now().timestamp()
    assert sink.announced == [(root.ref.key, clock.now())]
    assert requeue_failed_rows(root) == 0  # nothing failed any more
    root.close()


# --------------------------------------------------------------------------- pruning


async def test_a_publish_deletes_published_rows_older_than_seven_days_in_bounded_passes(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN 3 rows published at t0, a pass of at most 2 rows, and a row that cannot be sent
    #   (it stays pending)
    settings = offline(tmp_path, outbox_prune_batch_rows=2)
    shard = change_shard(settings, clock, "chg-1")
    publisher = OutboxPublisher(MemorySender(), settings, clock=clock)
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(3))
    )
    assert (await publisher.publish_due(shard)).pruned == 0

    def publish_one(task_id: str) -> ChangeFact:
        fact = ChangeFact("task.completed", {"agentId": "a"}, task_id=task_id)
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,)))
        return fact

    # WHEN a row is published exactly 7 days after them
    clock.advance(days=7)
    publish_one("tsk-000")
    # THEN its commit deletes none: they are not older than 7 days yet
    assert (await publisher.publish_due(shard)).pruned == 0
    # WHEN a second later, and then again, a row is published
    clock.advance(seconds=1)
    publish_one("tsk-001")
    first = await publisher.publish_due(shard)
    clock.advance(seconds=1)
    publish_one("tsk-002")
    second = await publisher.publish_due(shard)
    # THEN each commit deleted at most its pass of the old rows (2, then the last 1), and
    #   every younger row is kept
    assert (first.pruned, second.pruned) == (2, 1)
    left = [r["event_id"] for r in rows(shard.connection)]
    assert left == [
        stable_event_id("chg-1", "task.completed", t) for t in ("tsk-000", "tsk-001", "tsk-002")
    ]
    assert counts_by_state(shard.connection)["published"] == 3
    shard.close()


async def test_a_publish_pass_is_never_smaller_than_twice_what_it_published(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN 6 rows published 8 days ago, and a configured pass of 1 row
    settings = offline(tmp_path, outbox_prune_batch_rows=1)
    shard = change_shard(settings, clock, "chg-1")
    publisher = OutboxPublisher(MemorySender(), settings, clock=clock)
    shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=task_facts(6))
    )
    await publisher.publish_due(shard)
    clock.advance(days=8)
    # WHEN a run publishes 2 rows
    facts = tuple(
        ChangeFact("task.completed", {"agentId": "a"}, task_id=f"tsk-00{n}") for n in range(2)
    )
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=facts))
    report = await publisher.publish_due(shard)
    # THEN its commit deleted 4 old rows: an outbox sheds rows faster than it takes them
    assert (report.published, report.pruned) == (2, 4)
    shard.close()


def test_prune_published_never_deletes_pending_or_failed_rows(
    tmp_path: Path, clock: ManualClock
) -> None:
    root = new_root(offline(tmp_path), clock)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    root.connection.execute("UPDATE outbox SET state = 'failed' WHERE seq = 1")
    with write_transaction(root.connection, root.path) as db:
        assert (
            prune_published(db, older_than_s=clock.now().timestamp() + 365 * DAY_S, limit=10) == 0
        )
    assert len(rows(root.connection)) == 3
    root.close()


# --------------------------------------------------------------------------- counts


def test_counts_by_state_reports_every_state(tmp_path: Path, clock: ManualClock) -> None:
    root = new_root(offline(tmp_path), clock)
    assert counts_by_state(root.connection) == {
        "pending": 0,
        "retry_wait": 0,
        "published": 0,
        "failed": 0,
    }
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    root.connection.execute("UPDATE outbox SET state = 'published' WHERE seq = 1")
    root.connection.execute("UPDATE outbox SET state = 'failed' WHERE seq = 2")
    assert counts_by_state(root.connection) == {
        "pending": 1,
        "retry_wait": 0,
        "published": 1,
        "failed": 1,
    }
    root.close()


def actual_counts(connection: sqlite3.Connection) -> dict[str, int]:
    counts = {state.value: 0 for state in RowState}
    for state, count in connection.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state"):
        counts[state] = count
    return counts


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_counts_equal_a_count_of_the_rows_after_any_changes(
    tmp_path: Path, clock: ManualClock, seed: int
) -> None:
    # GIVEN an outbox taking a random mix of the changes its rows go through
    rng = random.Random(seed)
    root = new_root(offline(tmp_path), clock)
    root.create_project(CALLER, name="Acme")
    for step in range(60):
        seqs = [r["seq"] for r in rows(root.connection)]
        with write_transaction(root.connection, root.path) as db:
            match rng.randrange(6):
                case 0:  # the actor appends, sometimes an Event it already holds
                    db.execute(
                        "INSERT OR IGNORE INTO outbox (event_id, project_id, event_type, "
                        "stream_index, envelope, created_at) VALUES (?, 'acme', 't', 0, x'00', 0)",
                        (f"evt-{rng.randrange(40)}",),
                    )
                case 1 if seqs:
                    mark_published(db, [(rng.choice(seqs), None)], now_s=float(step))
                case 2 if seqs:
                    mark_failed(db, rng.choice(seqs), "refused")
                case 3 if seqs:  # a failed attempt with a backoff, as mark_attempt_failed
                    db.execute(
                        "UPDATE outbox SET state = 'retry_wait', attempts = attempts + 1 "
                        "WHERE seq = ? AND state != 'published'",
                        (rng.choice(seqs),),
                    )
                case 4:
                    requeue_failed(db)
                case _:
                    prune_published(db, older_than_s=float(step), limit=rng.randrange(1, 4))
    # THEN the counters the triggers keep equal a count of the rows
    assert counts_by_state(root.connection) == actual_counts(root.connection)
    root.close()


def test_an_outbox_made_before_its_counters_gets_them_from_its_rows(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor file whose outbox holds rows but whose counters are gone (a file made
    #   before them), its schema version reset so the next open brings the schema again
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    root.connection.execute("UPDATE outbox SET state = 'published' WHERE seq = 1")
    for trigger in ("insert", "update", "delete"):
        root.connection.execute(f"DROP TRIGGER outbox_counts_{trigger}")
    root.connection.execute("DROP TABLE outbox_counts")
    root.connection.execute("PRAGMA user_version = 0")
    root.close()
    # WHEN it is opened again
    again = new_root(settings, clock)
    # THEN its counters start from its rows, and keep counting
    assert counts_by_state(again.connection) == actual_counts(again.connection)
    assert counts_by_state(again.connection)["published"] == 1
    again.promote(CALLER, candidate_id="cand-2", artifact_id="art-2", expected_generation=1)
    assert counts_by_state(again.connection) == actual_counts(again.connection)
    again.close()


def test_the_outbox_accepts_only_the_four_states(tmp_path: Path, clock: ManualClock) -> None:
    root = new_root(offline(tmp_path), clock)
    root.create_project(CALLER, name="Acme")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        root.connection.execute("UPDATE outbox SET state = 'sent'")
    assert json.loads(bytes(rows(root.connection)[0]["envelope"]))["eventType"] == "project.created"
    root.close()


def test_the_publish_runs_of_one_alarm_fire_add_up_in_its_report() -> None:
    # GIVEN the report of a first publish run, and a later run of the same fire
    first = PublishReport(
        "project_root:p", published=3, duplicates=1, retry_wait=2, failed=1, nudged=[2], pruned=4
    )
    later = PublishReport(
        "project_root:p",
        published=5,
        duplicates=2,
        retry_wait=1,
        failed=3,
        busy=True,
        unavailable=True,
        nudged=[2, 5],
        next_alarm_at=61.0,
        last_published=5,
        pruned=6,
    )
    # WHEN the fire's report takes the later run in
    first.absorb(later)
    # THEN the counts add up, the streams nudged are each listed once, and the state is the
    # later run's
    assert (first.published, first.duplicates, first.retry_wait, first.failed) == (8, 3, 3, 4)
    assert (first.pruned, first.nudged) == (10, [2, 5])
    assert (first.busy, first.unavailable) == (True, True)
    assert (first.next_alarm_at, first.last_published) == (61.0, 5)


def test_an_outbox_with_no_row_counts_zero_in_every_state(
    tmp_path: Path, clock: ManualClock
) -> None:
    root = new_root(offline(tmp_path), clock)  # its file exists; no fact was ever written
    assert counts_by_state(root.connection) == {state.value: 0 for state in RowState}
    root.close()


def test_an_outbox_made_before_trace_context_gets_its_column_and_keeps_its_rows(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor file whose outbox has no traceparent column (a file made before trace
    #   context) and holds a row, its schema version reset so the next open migrates it
    settings = offline(tmp_path)
    root = new_root(settings, clock)
    root.create_project(CALLER, name="Acme")
    root.connection.execute("ALTER TABLE outbox DROP COLUMN traceparent")
    root.connection.execute("PRAGMA user_version = 0")
    root.close()
    # WHEN it is opened again, and once more after that
    again = new_root(settings, clock)
    columns = [row[1] for row in again.connection.execute("PRAGMA table_info(outbox)")]
    again.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    again.connection.execute("PRAGMA user_version = 0")
    again.close()
    third = new_root(settings, clock)
    # THEN the column is back once, by its name, and the rows written before and after it
    # are kept, the old one with no trace context (it is sent with no header)
    assert columns.count("traceparent") == 1
    rows_kept = third.connection.execute("SELECT event_type, traceparent FROM outbox").fetchall()
    assert [tuple(row) for row in rows_kept] == [
        ("project.created", None),
        ("artifact.promoted", None),
        ("canonical.advanced", None),
    ]
    third.close()
