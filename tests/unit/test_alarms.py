"""Actor alarms and AlarmGuard (spec: "AlarmGuard limits each actor to 2,000 alarm fires per
UTC day. The guard deletes an alarm that has no due work."; DECISIONS: fires beyond the cap are
refused and counted, and the every-minute scan publishes due rows without counting a fire)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import (
    AlarmGuard,
    FireDecision,
    RecordingAlarmSink,
    alarm_due_at,
    set_alarm,
)
from rhumbatron.actors.outbox import RowState, counts_by_state
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.publisher import OutboxPublisher
from rhumbatron.actors.storage import write_transaction
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.transition import Transition
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.testing import MemorySender, RefusingSender

CALLER = Caller("acme", "system:test", correlation_id="corr-alarms")
PROJECT = "acme-web"


def offline(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", **overrides)


def project_root(settings: Settings, clock: ManualClock, sink: RecordingAlarmSink) -> ProjectRoot:
    return ProjectRoot(ProjectRoot.ref_for(PROJECT), settings, clock=clock, alarms=sink)


def admit(root: ProjectRoot, guard: AlarmGuard, now: datetime) -> FireDecision:
    with write_transaction(root.connection, root.path) as db:
        return guard.admit(db, now)


# --------------------------------------------------------------------------- setting alarms


def test_a_write_sets_the_alarm_and_announces_it(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN a fresh ProjectRoot
    sink = RecordingAlarmSink()
    root = project_root(offline(tmp_path), clock, sink)
    # WHEN a transaction writes a fact
    root.create_project(CALLER, name="Acme")
    # THEN the actor's alarm is due now and was announced once, after the commit
    assert alarm_due_at(root.connection) == clock.now().timestamp()
    assert sink.announced == [(root.ref.key, clock.now())]
    root.close()


def test_a_write_while_the_alarm_is_due_at_that_very_time_announces_nothing_more(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a project whose first write set its alarm to now
    sink = RecordingAlarmSink()
    root = project_root(offline(tmp_path), clock, sink)
    root.create_project(CALLER, name="Acme")
    # WHEN another write lands at the same instant
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # THEN the alarm stays, and it was announced once
    assert alarm_due_at(root.connection) == clock.now().timestamp()
    assert sink.announced == [(root.ref.key, clock.now())]
    root.close()


def test_a_second_write_while_the_alarm_is_pending_does_not_announce_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a write whose alarm is still pending
    sink = RecordingAlarmSink()
    root = project_root(offline(tmp_path), clock, sink)
    root.create_project(CALLER, name="Acme")
    first_due = alarm_due_at(root.connection)
    # WHEN another write lands a second later
    clock.advance(seconds=1)
    result = root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # THEN its rows are in the outbox but the alarm neither moves nor is announced again
    assert result.events_added == 2
    assert alarm_due_at(root.connection) == first_due
    assert len(sink.announced) == 1
    root.close()


def test_a_transaction_without_facts_sets_no_alarm(tmp_path: Path, clock: ManualClock) -> None:
    sink = RecordingAlarmSink()
    root = project_root(offline(tmp_path), clock, sink)
    result = root.transact(lambda db: Transition())
    assert result.events_added == 0
    assert alarm_due_at(root.connection) is None
    assert sink.announced == []
    root.close()


# --------------------------------------------------------------------------- AlarmGuard


def test_guard_without_an_alarm_answers_not_due(tmp_path: Path, clock: ManualClock) -> None:
    root = project_root(offline(tmp_path), clock, RecordingAlarmSink())
    assert admit(root, AlarmGuard(), clock.now()) is FireDecision.NOT_DUE
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (0, 0)
    root.close()


def test_guard_before_the_alarm_time_answers_not_due_and_counts_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an alarm due now with due work
    root = project_root(offline(tmp_path), clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    # WHEN it is asked one second early
    decision = admit(root, AlarmGuard(), clock.now() - timedelta(seconds=1))
    # THEN the fire is not due and not counted; the alarm stays
    assert decision is FireDecision.NOT_DUE
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (0, 0)
    assert alarm_due_at(root.connection) == clock.now().timestamp()
    root.close()


def test_guard_deletes_a_due_alarm_that_has_no_work(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN an actor whose alarm is due but whose outbox is empty
    root = project_root(offline(tmp_path), clock, RecordingAlarmSink())
    with write_transaction(root.connection, root.path) as db:
        set_alarm(db, clock.now().timestamp())
    # WHEN it fires
    decision = admit(root, AlarmGuard(), clock.now())
    # THEN AlarmGuard answers NO_WORK and deletes the alarm (S0-045), counting no fire
    assert decision is FireDecision.NO_WORK
    assert alarm_due_at(root.connection) is None
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (0, 0)
    root.close()


def test_guard_caps_fires_per_utc_day_and_counts_the_refused_ones(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a cap of 3 fires a day and an actor with due work
    settings = offline(tmp_path, alarm_max_fires_per_day=3)
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    guard = AlarmGuard(settings.alarm_max_fires_per_day)
    # WHEN the alarm fires five times in one UTC day
    decisions = []
    for _ in range(5):
        decisions.append(admit(root, guard, clock.now()))
        clock.advance(seconds=1)
    # THEN three fires are admitted, the next two refused and counted as refused
    assert decisions == [FireDecision.FIRE] * 3 + [FireDecision.CAPPED] * 2
    assert AlarmGuard.fires_on(root.connection, "2026-01-01") == (3, 2)
    # AND the capped alarm is kept, so the work is not forgotten
    assert alarm_due_at(root.connection) is not None
    root.close()


def test_guard_fires_again_on_the_next_utc_day(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN an actor that used its whole cap late on 1 January (UTC)
    settings = offline(tmp_path, alarm_max_fires_per_day=2)
    clock.set(datetime(2026, 1, 1, 23, 59, 58, tzinfo=UTC))
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    guard = AlarmGuard(settings.alarm_max_fires_per_day)
    assert [admit(root, guard, clock.now()) for _ in range(3)] == [
        FireDecision.FIRE,
        FireDecision.FIRE,
        FireDecision.CAPPED,
    ]
    # WHEN the clock crosses UTC midnight
    clock.advance(seconds=2)
    # THEN the alarm fires again and counts on the new day
    assert admit(root, guard, clock.now()) is FireDecision.FIRE
    assert AlarmGuard.fires_on(root.connection, "2026-01-01") == (2, 1)
    assert AlarmGuard.fires_on(root.connection, "2026-01-02") == (1, 0)
    root.close()


def test_an_actor_keeps_the_fire_counts_of_today_and_yesterday_only(
    tmp_path: Path, clock: ManualClock
) -> None:
    settings = offline(tmp_path)
    clock.set(datetime(2026, 1, 1, 12, tzinfo=UTC))
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    guard = AlarmGuard(settings.alarm_max_fires_per_day)
    for _ in range(30):  # a month of daily fires
        admit(root, guard, clock.now())
        clock.advance(days=1)
    days = [day for (day,) in root.connection.execute("SELECT day FROM alarm_fires ORDER BY day")]
    assert days == ["2026-01-29", "2026-01-30"]
    root.close()


def test_guard_at_the_default_cap_admits_2000_fires_and_refuses_the_2001st(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN the default guard and an actor with due work
    guard = AlarmGuard()
    assert guard.max_fires_per_day == 2_000 == load_settings().alarm_max_fires_per_day
    root = project_root(offline(tmp_path), clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    # WHEN its alarm fires 2,001 times in one UTC day (one transaction, straight on the file)
    with write_transaction(root.connection, root.path) as db:
        decisions = Counter(guard.admit(db, clock.now()) for _ in range(2_001))
    # THEN 2,000 fires are admitted and the 2,001st is refused
    assert decisions == {FireDecision.FIRE: 2_000, FireDecision.CAPPED: 1}
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (2_000, 1)
    root.close()


async def test_only_backoff_work_moves_the_alarm_to_the_retry_time(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a row that failed its first send (backoff 1 s, no jitter)
    settings = offline(tmp_path, outbox_backoff_jitter=0)
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    publisher = OutboxPublisher(RefusingSender(), settings, clock=clock, rng=random.Random(1))
    report = await publisher.publish_due(root)
    assert report.retry_wait == 1
    retry_at = clock.now().timestamp() + 1
    # THEN the publisher left the alarm at the retry time
    assert alarm_due_at(root.connection) == retry_at
    # WHEN an alarm due now fires anyway (an earlier alarm was set)
    with write_transaction(root.connection, root.path) as db:
        set_alarm(db, clock.now().timestamp())
    decision = admit(root, AlarmGuard(), clock.now())
    # THEN the guard moves the alarm to the retry time instead of firing
    assert decision is FireDecision.NOT_DUE
    assert alarm_due_at(root.connection) == retry_at
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (0, 0)
    root.close()


async def test_a_capped_fire_publishes_nothing(tmp_path: Path, clock: ManualClock) -> None:
    # GIVEN a cap of one fire a day, already used
    settings = offline(tmp_path, alarm_max_fires_per_day=1)
    sender = MemorySender()
    publisher = OutboxPublisher(sender, settings, clock=clock)
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    first = await publisher.fire_alarm(root)
    assert (first.alarm, first.published) == (FireDecision.FIRE, 1)
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # WHEN the alarm fires again the same day
    second = await publisher.fire_alarm(root)
    # THEN the guard refuses it and nothing is sent; the rows stay pending
    assert (second.alarm, second.published) == (FireDecision.CAPPED, 0)
    assert len(sender.sent) == 1
    assert counts_by_state(root.connection)[RowState.PENDING] == 2
    root.close()


async def test_each_admitted_fire_is_counted_once_with_the_rows_it_published(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor whose writes keep setting its alarm
    settings = offline(tmp_path)
    publisher = OutboxPublisher(MemorySender(), settings, clock=clock)
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    # WHEN its alarm fires, a write comes, and it fires again; then a fire finds nothing
    await publisher.fire_alarm(root)
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    await publisher.fire_alarm(root)
    await publisher.fire_alarm(root)
    # THEN the two fires that published are counted, the empty one is not
    assert AlarmGuard.fires_on(root.connection, utc_day(clock.now())) == (2, 0)
    assert counts_by_state(root.connection)[RowState.PUBLISHED] == 3
    root.close()


async def test_a_fire_with_no_due_work_deletes_the_alarm_and_sends_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    settings = offline(tmp_path)
    sender = MemorySender()
    publisher = OutboxPublisher(sender, settings, clock=clock)
    root = project_root(settings, clock, RecordingAlarmSink())
    root.create_project(CALLER, name="Acme")
    await publisher.fire_alarm(root)  # publishes the one row
    with write_transaction(root.connection, root.path) as db:
        set_alarm(db, clock.now().timestamp())  # a stale alarm
    report = await publisher.fire_alarm(root)
    assert report.alarm is FireDecision.NO_WORK
    assert alarm_due_at(root.connection) is None
    assert len(sender.sent) == 1
    root.close()


# --------------------------------------------------------------------------- the minute scan


@pytest.mark.integration
async def test_every_minute_scan_publishes_capped_actors_without_counting_a_fire(
    tmp_path: Path, nats_server: NatsServerProcess, clock: ManualClock
) -> None:
    # GIVEN a cap of one alarm fire a day, used by the first publish
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, alarm_max_fires_per_day=1
    )
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    try:
        await app.ensure_streams()
        root = app.project_root(PROJECT)
        root.create_project(CALLER, name="Acme")
        assert (await app.fire_alarm(root.ref.key)).alarm is FireDecision.FIRE
        # AND new rows whose own alarm fire is refused by the cap
        root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
        refused = await app.fire_alarm(root.ref.key)
        assert (refused.alarm, refused.published) == (FireDecision.CAPPED, 0)
        # WHEN the every-minute scan runs
        clock.advance(minutes=1)
        reports = (await app.fire_due_alarms()).reports
        # THEN it publishes the capped actor's rows, and no fire beyond the cap is counted
        assert [(r.actor_key, r.alarm, r.published) for r in reports] == [
            (root.ref.key, FireDecision.CAPPED, 2)
        ]
        fires, refused_count = AlarmGuard.fires_on(root.connection, utc_day(clock.now()))
        assert fires == 1
        assert refused_count >= 1
        assert counts_by_state(root.connection)[RowState.PUBLISHED] == 3
        nc = await app.nats()
        info = await nc.jetstream().stream_info("EVENTS_00")
        assert info.state.messages == 3
    finally:
        await app.close()


@pytest.mark.integration
async def test_every_minute_scan_skips_actors_whose_alarm_is_not_due(
    tmp_path: Path, nats_server: NatsServerProcess, clock: ManualClock
) -> None:
    settings = load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url)
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    try:
        await app.ensure_streams()
        root = app.project_root(PROJECT)
        root.create_project(CALLER, name="Acme")
        assert (await app.fire_due_alarms()).reports[0].published == 1
        # WHEN nothing new was written, the next scan fires nothing
        clock.advance(minutes=1)
        assert (await app.fire_due_alarms()).reports == []
    finally:
        await app.close()


@pytest.mark.integration
async def test_the_scan_stops_when_asked_and_reports_the_actors_it_did_not_reach(app) -> None:  # type: ignore[no-untyped-def]
    # GIVEN three actors with due alarms
    for project in ("p-one", "p-two", "p-three"):
        app.project_root(project).create_project(Caller("t", "system:test", "c"), name=project)
    await app.close()  # a fresh container: no actor file open yet
    asked = []

    def stop_after_two() -> bool:
        asked.append(1)
        return len(asked) > 2

    # WHEN the scan is told to stop before the third actor
    scan = await app.fire_due_alarms(should_stop=stop_after_two)

    # THEN two actors published, one is reported as left for the next scan,
    # and no actor file stays open after the scan
    assert [r.published for r in scan.reports] == [1, 1]
    assert scan.actors_left == 1
    assert app.open_actor_count == 0
