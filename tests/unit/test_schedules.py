"""Time events without NATS: the schedule registry on a real product file (idempotent per
(tenant, name), conflicts refused, tenancy closed, timings checked naming the field), the due
times of the two modes, the stable Event ID of a fire, and :func:`fire_due_schedules` writing
``schedule.fired`` into real actor outboxes — the sweep's tick in the clock project, a user
schedule at its due time and not before, once after downtime, never twice for one due time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.cli import EXIT_CANNOT, EXIT_ERROR, EXIT_NOT_FOUND, main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import ScheduleConflictError, ScheduleNotFoundError, ScheduleRegistryError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import EVENT_ID_PATTERN, stable_event_id
from rhumbatron.reactions import schedule_firing as schedules_module
from rhumbatron.reactions.schedule_firing import (
    SWEEP_SCHEDULE_ID,
    ScheduleFire,
    ScheduleSettings,
    fire_due_schedules,
    fire_now,
    schedule_event_id,
    schedule_fired_event,
)
from rhumbatron.reactions.schedule_models import ScheduleTiming, latest_due, utc_minute
from rhumbatron.reactions.schedule_registry import ScheduleRegistry
from rhumbatron.reactions.selectors import Selector, event_selector_matches
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

TENANT, OTHER = "acme", "globex"
PROJECT, OTHER_PROJECT = "acme-web", "globex-web"
DAY = datetime(2026, 3, 2, tzinfo=UTC)
EVERY_5 = ScheduleTiming.of("interval", every_minutes=5)
#: The sweep's tick off: the tests about user schedules count only theirs.
NO_TICKS = ScheduleSettings(sweep_tick_facts=False)


def at(hour: int, minute: int, second: int = 0, *, days: int = 0) -> datetime:
    return DAY + timedelta(days=days, hours=hour, minutes=minute, seconds=second)


@pytest.fixture
def app(offline_settings: Settings, clock: ManualClock) -> Iterator[Rhumbatron]:
    """The composition root without NATS: actor files and the product file are real."""
    clock.set(at(10, 0, 30))
    runtime = bootstrap(offline_settings, clock=clock, alarms=RecordingAlarmSink())
    for tenant, project in ((TENANT, PROJECT), (OTHER, OTHER_PROJECT)):
        runtime.project_root(project).create_project(Caller(tenant, "user:ann", "c1"), name=project)
    yield runtime
    asyncio.run(runtime.close())


@pytest.fixture
def registry(app: Rhumbatron) -> ScheduleRegistry:
    return ScheduleRegistry(app.product(), app.clock, project_tenant=app.project_tenant)


def fired_facts(app: Rhumbatron, project: str) -> list[Event]:
    """The schedule.fired facts in the outbox of the project's admin shard."""
    shard = app.resource_shard(project, project_admin_key(project))
    rows = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'schedule.fired' ORDER BY seq"
    ).fetchall()
    return [Event.parse(row[0]) for row in rows]


def tick(app: Rhumbatron, clock: ManualClock, when: datetime, **settings: Any) -> Any:
    """One sweep tick's firing at ``when``, the clock moved there first."""
    clock.set(when)
    return fire_due_schedules(app, when, settings=ScheduleSettings(**settings))


# -- due times -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timing", "now", "due"),
    [
        (ScheduleTiming.of("interval", every_minutes=1), at(10, 7, 59), at(10, 7)),
        (EVERY_5, at(10, 7), at(10, 5)),
        (EVERY_5, at(10, 5), at(10, 5)),
        (ScheduleTiming.of("interval", every_minutes=60), at(10, 59), at(10, 0)),
        (ScheduleTiming.of("interval", every_minutes=1440), at(23, 59), at(0, 0)),
        (ScheduleTiming.of("daily", at="09:30"), at(9, 29), at(9, 30, days=-1)),
        (ScheduleTiming.of("daily", at="09:30"), at(9, 30), at(9, 30)),
        (ScheduleTiming.of("daily", at="00:00"), at(23, 59), at(0, 0)),
    ],
)
def test_the_latest_due_time_is_the_last_slot_at_or_before_the_tick(
    timing: ScheduleTiming, now: datetime, due: datetime
) -> None:
    # GIVEN a timing and a tick  WHEN its latest due time is asked
    # THEN it is the last whole-minute slot at or before the tick (intervals on the UTC epoch)
    assert latest_due(timing, now) == due


@pytest.mark.parametrize(
    ("mode", "every", "time_of_day", "field", "quoted"),
    [
        ("interval", None, None, "every_minutes", "None"),
        ("interval", 0, None, "every_minutes", "0"),
        ("interval", 1441, None, "every_minutes", "1441"),
        ("interval", 5, "09:00", "at", "'09:00'"),
        ("daily", None, "24:00", "at", "'24:00'"),
        ("daily", None, "9:30", "at", "'9:30'"),
        ("daily", 5, "09:30", "every_minutes", "5"),
        ("cron", None, None, "mode", "'cron'"),
    ],
)
def test_a_timing_without_its_one_rule_is_refused_naming_the_field_and_value(
    mode: str, every: int | None, time_of_day: str | None, field: str, quoted: str
) -> None:
    # GIVEN a timing whose fields do not make its mode  WHEN it is built
    with pytest.raises(ScheduleRegistryError) as caught:
        ScheduleTiming.of(mode, every_minutes=every, at=time_of_day)
    # THEN it is refused, naming the field and the value
    assert caught.value.field == field
    assert quoted in str(caught.value)


# -- the registry ----------------------------------------------------------------------------


def test_creating_the_same_schedule_again_returns_the_stored_one(
    registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a schedule created once
    first = registry.create(TENANT, "every-5", PROJECT, EVERY_5)
    clock.advance(60)
    # WHEN the same content is created again under the same name
    again = registry.create(TENANT, "every-5", PROJECT, EVERY_5)
    # THEN the first is returned unchanged, and only one is stored
    assert first.created and not again.created
    assert again.record == first.record
    assert first.record.schedule_id.startswith("sch_") and len(first.record.schedule_id) == 36
    assert first.record.armed_at == first.record.created_at == at(10, 0, 30)
    assert registry.list(TENANT) == [first.record]


def test_other_content_under_a_taken_name_is_a_conflict(registry: ScheduleRegistry) -> None:
    # GIVEN a schedule named nightly
    registry.create(TENANT, "nightly", PROJECT, ScheduleTiming.of("daily", at="02:00"))
    # WHEN another timing or state is created under the name
    # THEN each is refused naming the tenant and the name, and the first stays
    for timing, enabled in ((ScheduleTiming.of("daily", at="03:00"), True), (EVERY_5, True)):
        with pytest.raises(ScheduleConflictError) as caught:
            registry.create(TENANT, "nightly", PROJECT, timing, enabled=enabled)
        assert "'acme' has a schedule named 'nightly'" in str(caught.value)
        assert caught.value.field == "name"
    with pytest.raises(ScheduleConflictError):
        registry.create(
            TENANT, "nightly", PROJECT, ScheduleTiming.of("daily", at="02:00"), enabled=False
        )
    [stored] = registry.list(TENANT)
    assert stored.timing.at == "02:00" and stored.enabled


@pytest.mark.parametrize("project", [OTHER_PROJECT, "no-such-project", "../etc"])
def test_a_schedule_fires_only_into_a_project_of_its_own_tenant(
    registry: ScheduleRegistry, project: str
) -> None:
    # GIVEN another tenant's project, a missing one and a malformed ID
    # WHEN a schedule is created on it
    with pytest.raises(ScheduleRegistryError) as caught:
        registry.create(TENANT, "mine", project, EVERY_5)
    # THEN it is refused on project_id, naming it, and nothing is stored
    assert caught.value.field == "project_id"
    assert repr(project) in str(caught.value)
    assert registry.list(None) == []


def test_another_tenants_schedule_is_not_found(registry: ScheduleRegistry) -> None:
    # GIVEN a schedule of each tenant
    mine = registry.create(TENANT, "ci", PROJECT, EVERY_5).record
    theirs = registry.create(OTHER, "ci", OTHER_PROJECT, EVERY_5).record
    # WHEN the other tenant reads, governs or deletes mine
    # THEN it is not found; each tenant lists only its own; a platform operator sees both
    assert registry.get(OTHER, mine.schedule_id) is None
    with pytest.raises(ScheduleNotFoundError):
        registry.set_enabled(OTHER, mine.schedule_id, False)
    with pytest.raises(ScheduleNotFoundError):
        registry.delete(OTHER, mine.schedule_id)
    assert registry.list(TENANT) == [mine] and registry.list(OTHER) == [theirs]
    assert registry.list(None) == [mine, theirs]


@pytest.mark.parametrize("name", ["", "has space", "-leading", "x" * 101])
def test_an_invalid_name_is_refused_naming_it(registry: ScheduleRegistry, name: str) -> None:
    # GIVEN an invalid name  WHEN a schedule is created with it  THEN it is refused on name
    with pytest.raises(ScheduleRegistryError) as caught:
        registry.create(TENANT, name, PROJECT, EVERY_5)
    assert caught.value.field == "name"
    assert repr(name[:120]) in str(caught.value)


def test_enabling_again_re_arms_and_the_same_state_changes_nothing(
    registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a schedule
    record = registry.create(TENANT, "ci", PROJECT, EVERY_5).record
    # WHEN it is disabled, disabled again, then enabled later
    clock.advance(60)
    off = registry.set_enabled(TENANT, record.schedule_id, False)
    again = registry.set_enabled(TENANT, record.schedule_id, False)
    clock.advance(600)
    on = registry.set_enabled(TENANT, record.schedule_id, True)
    # THEN disabling keeps its arming time; the repeat is a no-op; enabling re-arms it now
    assert not off.enabled and off.armed_at == record.armed_at
    assert again == off
    assert on.enabled and on.armed_at == on.updated_at == clock.now()
    assert registry.get(TENANT, record.schedule_id) == on


# -- the fact ---------------------------------------------------------------------------------


def test_a_fires_event_id_is_stable_per_schedule_and_due_minute() -> None:
    # GIVEN the same fire built twice, at different times of the same minute and of writing
    def build(due: datetime, now: datetime, schedule: str = "sch_" + "a" * 32) -> Event:
        return schedule_fired_event(
            schedule_id=schedule,
            name="ci",
            mode="interval",
            tenant_id=TENANT,
            project_id=PROJECT,
            scheduled_at=due,
            now=now,
        )

    first, again = build(at(10, 5), at(10, 5, 1)), build(at(10, 5, 40), at(10, 9))
    # WHEN their IDs are compared with another minute's and another schedule's
    # THEN the same fire has the same ID; any other fire has another
    assert first.event_id == again.event_id == schedule_event_id("sch_" + "a" * 32, at(10, 5))
    assert EVENT_ID_PATTERN.fullmatch(first.event_id)
    assert build(at(10, 6), at(10, 6)).event_id != first.event_id
    assert build(at(10, 5), at(10, 5), "sch_" + "b" * 32).event_id != first.event_id
    # AND the fact is about the schedule, with the due minute, on the project's log
    assert first.event_type == "schedule.fired" and first.actor == "system:clock"
    assert first.to_wire()["payload"] == {
        "scheduleId": "sch_" + "a" * 32,
        "name": "ci",
        "mode": "interval",
        "scheduledAt": "2026-03-02T10:05:00Z",
    }
    selector = Selector.create(
        ["schedule.fired"], {"payload.scheduleId": "sch_" + "a" * 32, "subject.projectId": PROJECT}
    )
    assert event_selector_matches(selector, first)


# -- firing ----------------------------------------------------------------------------------


def test_a_sweep_tick_lands_one_schedule_fired_in_the_clock_project_it_claims(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN no clock project yet
    assert app.project_tenant("rhumbatron-clock") is None
    # WHEN the 10:01 tick fires, twice (a retried tick)
    first = tick(app, clock, at(10, 1, 2))
    again = tick(app, clock, at(10, 1, 2))
    # THEN one schedule.fired for the tick's minute, in the clock project the sweep created
    assert [f.schedule_id for f in first.fired] == [SWEEP_SCHEDULE_ID]
    assert (again.fired, again.failed) == ([], {})
    assert app.project_tenant("rhumbatron-clock") == "platform"
    [fact] = fired_facts(app, "rhumbatron-clock")
    assert fact.event_id == schedule_event_id(SWEEP_SCHEDULE_ID, at(10, 1))
    assert fact.tenant_id == "platform"
    assert fact.to_wire()["payload"]["scheduledAt"] == "2026-03-02T10:01:00Z"
    assert fact.to_wire()["payload"]["mode"] == "sweep"
    state = app.project_root("rhumbatron-clock").state()
    assert state is not None and state.name == "Rhumbatron clock"


def test_sweep_tick_facts_can_be_turned_off(app: Rhumbatron, clock: ManualClock) -> None:
    # GIVEN sweep ticks off  WHEN a tick fires  THEN nothing is written, no clock project made
    assert tick(app, clock, at(10, 1), sweep_tick_facts=False).fired == []
    assert app.project_tenant("rhumbatron-clock") is None


def test_a_schedule_fires_at_its_due_time_and_not_before(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN an every-5-minutes schedule created at 10:00:30 (the 10:00 slot is before it)
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    # WHEN the ticks of 10:00:40 to 10:04 and then 10:05 fire
    early = [
        fire_due_schedules(app, when, settings=NO_TICKS).fired
        for when in (at(10, 0, 40), at(10, 1), at(10, 4))
    ]
    clock.set(at(10, 5, 3))
    due = fire_due_schedules(app, at(10, 5), settings=NO_TICKS)
    # THEN nothing fires before 10:05; at 10:05 one fact, for 10:05, in the tenant's project
    assert early == [[], [], []]
    [fire] = due.fired
    assert fire == ScheduleFire(
        schedule_id=record.schedule_id,
        name="every-5",
        mode="interval",
        tenant_id=TENANT,
        project_id=PROJECT,
        scheduled_at=at(10, 5),
        event_id=schedule_event_id(record.schedule_id, at(10, 5)),
        written=True,
    )
    [fact] = fired_facts(app, PROJECT)
    assert (fact.event_id, fact.tenant_id, fact.project_id) == (fire.event_id, TENANT, PROJECT)
    assert fact.timestamp == at(10, 5, 3)
    assert registry.last_fired(record.schedule_id) == at(10, 5)


def test_after_downtime_a_schedule_fires_once_for_its_latest_due_time(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN an every-5-minutes schedule that fired at 10:05
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    tick(app, clock, at(10, 5), sweep_tick_facts=False)
    # WHEN no tick runs until 11:02, then 11:02 and 11:03 tick
    late = tick(app, clock, at(11, 2), sweep_tick_facts=False)
    later = tick(app, clock, at(11, 3), sweep_tick_facts=False)
    # THEN one fire for 11:00 (the latest slot), none for the eleven missed, none at 11:03
    assert [(f.schedule_id, f.scheduled_at) for f in late.fired] == [
        (record.schedule_id, at(11, 0))
    ]
    assert later.fired == []
    assert [f.to_wire()["payload"]["scheduledAt"] for f in fired_facts(app, PROJECT)] == [
        "2026-03-02T10:05:00Z",
        "2026-03-02T11:00:00Z",
    ]


def test_an_older_tick_retried_late_fires_nothing(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN an every-minute schedule that fired for 10:07
    registry.create(TENANT, "each", PROJECT, ScheduleTiming.of("interval", every_minutes=1))
    tick(app, clock, at(10, 7), sweep_tick_facts=False)
    # WHEN the 10:05 tick is retried after it  THEN it fires nothing (10:05 is past the last)
    assert fire_due_schedules(app, at(10, 5), settings=NO_TICKS).fired == []
    assert len(fired_facts(app, PROJECT)) == 1


def test_a_disabled_schedule_does_not_fire_and_never_catches_up_when_enabled(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN an every-5-minutes schedule, disabled before 10:05
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    registry.set_enabled(TENANT, record.schedule_id, False)
    # WHEN 10:05 ticks; it is enabled at 10:07; 10:08 and 10:10 tick
    off = tick(app, clock, at(10, 5), sweep_tick_facts=False)
    clock.set(at(10, 7))
    registry.set_enabled(TENANT, record.schedule_id, True)
    before = tick(app, clock, at(10, 8), sweep_tick_facts=False)
    after = tick(app, clock, at(10, 10), sweep_tick_facts=False)
    # THEN it fired neither while off nor for the 10:05 slot it missed; it fires at 10:10
    assert (off.fired, before.fired) == ([], [])
    assert [f.scheduled_at for f in after.fired] == [at(10, 10)]


def test_a_fire_whose_record_was_lost_writes_the_same_event_id_and_the_outbox_drops_it(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a fire written for 10:05, and its schedule_fires row lost (a crash before it)
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    [first] = tick(app, clock, at(10, 5), sweep_tick_facts=False).fired
    with app.product().transaction() as db:
        db.execute("DELETE FROM schedule_fires")
    # WHEN the tick runs again
    [again] = tick(app, clock, at(10, 5, 30), sweep_tick_facts=False).fired
    # THEN it builds the same Event ID, which the outbox already holds: no second fact
    assert again.event_id == first.event_id and again.schedule_id == record.schedule_id
    assert (first.written, again.written) == (True, False)
    assert len(fired_facts(app, PROJECT)) == 1


def test_a_schedule_that_fired_for_this_tick_does_not_keep_the_next_from_firing(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN an hourly schedule and, after it by name, an every-5-minutes one; both fired at 11:00
    hourly = registry.create(
        TENANT, "a-hourly", PROJECT, ScheduleTiming.of("interval", every_minutes=60)
    )
    every_5 = registry.create(TENANT, "b-every-5", PROJECT, EVERY_5).record
    both = tick(app, clock, at(11, 0), sweep_tick_facts=False)
    # WHEN the 11:05 tick fires (the hourly one's latest due time is still 11:00)
    report = tick(app, clock, at(11, 5), sweep_tick_facts=False)
    # THEN the hourly one is passed over and the other still fires
    assert [f.schedule_id for f in both.fired] == [hourly.record.schedule_id, every_5.schedule_id]
    assert [f.schedule_id for f in report.fired] == [every_5.schedule_id]


def test_an_operators_fire_now_is_logged_and_leaves_the_schedules_timing_as_it_was(
    app: Rhumbatron,
    registry: ScheduleRegistry,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN an every-5-minutes schedule
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    clock.set(at(10, 3, 20))
    # WHEN an operator fires it now
    with caplog.at_level("INFO", logger=schedules_module.__name__):
        fire = fire_now(app, record)
    # THEN it fires for the current minute, says so, and is not taken for its due fire
    assert (fire.scheduled_at, fire.name, fire.mode) == (at(10, 3), "every-5", "interval")
    assert caplog.messages == [
        f"schedule {record.schedule_id} fired now by an operator ({fire.event_id})"
    ]
    assert registry.last_fired(record.schedule_id) is None
    assert [f.scheduled_at for f in tick(app, clock, at(10, 5), sweep_tick_facts=False).fired] == [
        at(10, 5)
    ]


def test_a_schedule_whose_project_is_gone_fails_closed_saying_what_to_do(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a schedule whose project's root file is gone (a state directory restored without it)
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    root = app.project_root(PROJECT)
    root.close()
    for path in root.path.parent.glob(root.path.name + "*"):
        path.unlink()
    # WHEN its due tick fires  THEN it writes nothing and says why and what to do
    report = tick(app, clock, at(10, 5), sweep_tick_facts=False)
    assert report.fired == []
    assert report.failed == {
        record.schedule_id: f"_NotOwnedError: project {PROJECT!r} belongs to no tenant (it "
        f"does not exist), not to tenant {TENANT!r}; delete the schedule, or recreate it on "
        "one of the tenant's projects"
    }


def test_a_schedule_that_cannot_fire_is_reported_and_the_others_still_fire(
    app: Rhumbatron,
    registry: ScheduleRegistry,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN the clock project taken by a tenant, and a user schedule due at 10:05
    app.project_root("their-clock").create_project(Caller(OTHER, "user:bo", "c2"), name="x")
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    # WHEN the 10:05 tick fires with the sweep's ticks aimed at that project
    with caplog.at_level("INFO", logger=schedules_module.__name__):
        report = tick(app, clock, at(10, 5), clock_project_id="their-clock")
    # THEN the sweep's fire fails closed, naming the project and what to do; the user's fires
    assert [f.schedule_id for f in report.fired] == [record.schedule_id]
    why = (
        "project 'their-clock' belongs to tenant 'globex', not to tenant 'platform'; set "
        "RHUMBATRON_CLOCK_PROJECT_ID to an unused project ID"
    )
    assert report.failed == {"sweep": f"_NotOwnedError: {why}"}
    assert fired_facts(app, "their-clock") == []
    (fired,) = report.fired
    assert caplog.messages == [
        f"schedule sweep could not fire for {at(10, 5).isoformat()}: {why}; a later tick fires it",
        f"schedule {record.schedule_id} fired for {at(10, 5)} ({fired.event_id})",
    ]


def test_fires_older_than_the_retention_are_forgotten(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a daily schedule that fired on days 0 and 1
    registry.create(TENANT, "nightly", PROJECT, ScheduleTiming.of("daily", at="11:00"))
    tick(app, clock, at(11, 0), sweep_tick_facts=False)
    tick(app, clock, at(11, 0, days=1), sweep_tick_facts=False)
    # WHEN a tick runs with a retention of 2 days, 2 days and a minute after the first fire
    tick(app, clock, at(11, 1, days=2), sweep_tick_facts=False, schedule_fire_retention_days=2)
    # THEN the first fire is forgotten; the later two are remembered
    rows = app.product().connection.execute(
        "SELECT scheduled_at FROM schedule_fires ORDER BY scheduled_at"
    )
    assert [row[0] for row in rows] == [
        at(11, 0, days=1).isoformat(),
        at(11, 0, days=2).isoformat(),
    ]


def test_deleting_a_schedule_forgets_its_fires(
    app: Rhumbatron, registry: ScheduleRegistry, clock: ManualClock
) -> None:
    # GIVEN a schedule that fired
    record = registry.create(TENANT, "every-5", PROJECT, EVERY_5).record
    tick(app, clock, at(10, 5), sweep_tick_facts=False)
    # WHEN it is deleted  THEN it and its fires are gone, and it fires no more
    assert registry.delete(TENANT, record.schedule_id) == record
    assert registry.last_fired(record.schedule_id) is None
    assert tick(app, clock, at(10, 10), sweep_tick_facts=False).fired == []


def test_the_settings_refuse_a_retention_shorter_than_two_days() -> None:
    # GIVEN a retention of 1 day (a daily schedule's last fire would be forgotten)
    # WHEN the settings are built  THEN they are refused
    with pytest.raises(ValueError, match="schedule_fire_retention_days"):
        ScheduleSettings(schedule_fire_retention_days=1)


def test_the_module_exports_what_it_defines() -> None:
    # GIVEN the module's __all__  WHEN each name is looked up  THEN it exists
    for name in schedules_module.__all__:
        assert hasattr(schedules_module, name), name


# -- the CLI ---------------------------------------------------------------------------------


def test_the_cli_creates_lists_disables_shows_and_deletes_a_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a state directory with the tenant's project, and a schedule's JSON in the API's form
    state = tmp_path / "cli-state"
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(state))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", "nats://127.0.0.1:1")
    owner = bootstrap(alarms=RecordingAlarmSink())
    owner.project_root(PROJECT).create_project(Caller(TENANT, "user:ann", "c1"), name="Web")
    owner.project_root(PROJECT).close()
    body = {"name": "nightly", "projectId": PROJECT, "mode": "daily", "at": "02:00"}
    (tmp_path / "s.json").write_text(json.dumps(body))
    create = ["schedules", "create", "--tenant", TENANT, "--file", str(tmp_path / "s.json")]
    # WHEN it is created
    assert main(create) == 0
    created = json.loads(capsys.readouterr().out)
    schedule_id = created["scheduleId"]
    # THEN it is listed, disabled, hidden from another tenant, and deleted
    assert (created["mode"], created["at"], created["enabled"]) == ("daily", "02:00", True)
    assert main(["schedules", "list"]) == 0
    listed = capsys.readouterr().out
    assert f"{schedule_id}  {TENANT}  nightly  enabled  daily at 02:00 UTC  -> {PROJECT}" in listed
    assert main(["schedules", "disable", schedule_id]) == 0
    assert json.loads(capsys.readouterr().out)["enabled"] is False
    assert main(["schedules", "show", schedule_id, "--tenant", OTHER]) == EXIT_NOT_FOUND
    assert schedule_id in capsys.readouterr().err
    # AND other content under the name is 3; a project not the tenant's is 1, naming it
    (tmp_path / "s.json").write_text(json.dumps({**body, "at": "03:00"}))
    assert main(create) == EXIT_CANNOT
    (tmp_path / "s.json").write_text(json.dumps({**body, "name": "x", "projectId": "nope"}))
    assert main(create) == EXIT_ERROR
    assert "'nope'" in capsys.readouterr().err
    assert main(["schedules", "delete", schedule_id]) == 0
    capsys.readouterr()
    assert main(["schedules", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_firings_event_id_is_the_schedules_and_its_utc_minute_whatever_the_second() -> None:
    # GIVEN one schedule's due times: two in one minute, one the next
    schedule = "sch_" + "a" * 32
    early, late = (datetime(2026, 3, 2, 10, 0, s, tzinfo=UTC) for s in (0, 41))
    next_minute = datetime(2026, 3, 2, 10, 1, tzinfo=UTC)
    # WHEN their event IDs are derived  THEN they are the stable ID of (schedule,
    # schedule.fired, its UTC minute): one per minute, the same in every release
    expected = stable_event_id(schedule, "schedule.fired", None, "2026-03-02T10:00Z")
    assert schedule_event_id(schedule, early) == schedule_event_id(schedule, late) == expected
    assert schedule_event_id(schedule, next_minute) == stable_event_id(
        schedule, "schedule.fired", None, "2026-03-02T10:01Z"
    )


def test_each_refusal_of_the_schedule_registry_says_word_for_word_what_to_do(
    registry: ScheduleRegistry,
) -> None:
    # GIVEN a schedule named nightly, disabled
    nightly = ScheduleTiming.of("daily", at="02:00")
    record = registry.create(TENANT, "nightly", PROJECT, nightly, enabled=False).record

    def refusal(call: Any) -> tuple[str, str | None]:
        with pytest.raises(ScheduleRegistryError) as caught:
            call()
        return str(caught.value), caught.value.field

    # WHEN it is asked for with other content, read by another tenant, placed on another
    # tenant's project or a malformed one, or created for a tenant ID that is too long
    # THEN each refusal names what is wrong and the way out
    assert refusal(lambda: registry.create(TENANT, "nightly", PROJECT, EVERY_5)) == (
        f"tenant 'acme' has a schedule named 'nightly' ({record.schedule_id}) with other "
        "content; choose another name, or delete that one first",
        "name",
    )
    assert refusal(lambda: registry.set_enabled(OTHER, record.schedule_id, True)) == (
        f"no schedule {record.schedule_id!r}; `GET /schedules` (or `rhumbatron schedules "
        "list`) lists them",
        None,
    )
    assert refusal(lambda: registry.create(TENANT, "x", OTHER_PROJECT, EVERY_5)) == (
        "project 'globex-web' is not one of tenant 'acme''s projects; create it first "
        "(POST /projects), or name one of yours",
        "project_id",
    )
    assert refusal(lambda: registry.create(TENANT, "x", "-" * 100, EVERY_5)) == (
        f"project ID {'-' * 80!r} is invalid: use 1 to 64 characters of A-Z, a-z, 0-9, '_' "
        "and '-', starting with a letter or digit",
        "project_id",
    )
    assert refusal(lambda: registry.create("t" * 65, "x", PROJECT, EVERY_5)) == (
        f"a schedule needs a tenant ID of 1 to 64 characters, got {'t' * 65!r}",
        "tenant_id",
    )
    assert refusal(lambda: registry.create("t" * 100, "x", PROJECT, EVERY_5))[0].endswith(
        f"got {'t' * 80!r}"
    )
    assert refusal(lambda: registry.create(TENANT, "_" * 130, PROJECT, EVERY_5)) == (
        f"schedule name {'_' * 120!r} is invalid: use 1 to 100 characters of A-Z, a-z, 0-9, "
        "'.', '_' and '-', starting with a letter or digit",
        "name",
    )
    assert refusal(lambda: registry.create("  ", "x", PROJECT, EVERY_5))[1] == "tenant_id"
    # AND the same content again is the stored schedule, not a new one; a listing holds
    # disabled schedules unless told otherwise
    again = registry.create(TENANT, "nightly", PROJECT, nightly, enabled=False)
    assert again.created is False and again.record == record
    assert registry.list(TENANT) == [record]
    assert registry.list(TENANT, enabled_only=True) == []


def test_a_tenant_id_of_64_characters_is_one(app: Rhumbatron, registry: ScheduleRegistry) -> None:
    # GIVEN a tenant whose ID has 64 characters, and its project
    tenant = "t" * 64
    app.project_root("long-web").create_project(Caller(tenant, "user:al", "c1"), name="x")
    # WHEN it creates a schedule  THEN it is stored
    assert registry.create(tenant, "x", "long-web", EVERY_5).record.tenant_id == tenant


@pytest.mark.parametrize(
    ("mode", "every_minutes", "at", "refusal"),
    [
        (
            "interval",
            1441,
            None,
            "an interval schedule needs every_minutes from 1 to 1440, got 1441; for a time "
            "of day use mode daily",
        ),
        (
            "interval",
            5,
            "0" * 30,
            f"an interval schedule takes no at (got {'0' * 20!r}); leave it out, or use mode daily",
        ),
        (
            "daily",
            None,
            "9" * 30,
            f"a daily schedule needs at as HH:MM (UTC, 00:00 to 23:59), got {'9' * 20!r}",
        ),
        ("daily", None, None, "a daily schedule needs at as HH:MM (UTC, 00:00 to 23:59), got None"),
        (
            "daily",
            5,
            "02:00",
            "a daily schedule takes no every_minutes (got 5); leave it out, or use mode interval",
        ),
        ("c" * 50, None, None, f"schedule mode {'c' * 40!r} is unknown; use interval or daily"),
    ],
)
def test_a_timing_that_cannot_be_is_refused_word_for_word(
    mode: str, every_minutes: int | None, at: str | None, refusal: str
) -> None:
    with pytest.raises(ScheduleRegistryError) as caught:
        ScheduleTiming.of(mode, every_minutes=every_minutes, at=at)
    assert str(caught.value) == refusal


def test_an_interval_of_a_whole_day_is_the_longest_and_falls_on_whole_days() -> None:
    # GIVEN the longest interval, 1,440 minutes  WHEN its latest due time is asked at 10:41:30
    timing = ScheduleTiming.of("interval", every_minutes=1440)
    due = latest_due(timing, datetime(2026, 3, 2, 10, 41, 30, 999, tzinfo=UTC))
    # THEN it is that day's midnight UTC, to the microsecond
    assert due == datetime(2026, 3, 2, tzinfo=UTC)


def test_a_tick_time_without_a_timezone_is_refused_naming_it() -> None:
    with pytest.raises(ValueError) as caught:
        utc_minute(datetime(2026, 3, 2, 10, 41))
    assert str(caught.value) == "2026-03-02T10:41:00 has no timezone; a tick's time must be UTC"
    assert utc_minute(datetime(2026, 3, 2, 10, 41, 7, 123, tzinfo=UTC)) == datetime(
        2026, 3, 2, 10, 41, tzinfo=UTC
    )


@pytest.mark.usefixtures("local_time_far_from_utc")
def test_a_tick_times_minute_is_in_utc_whatever_the_hosts_time_zone() -> None:
    # GIVEN a tick at 03:00:07 UTC, given two hours east of it, on a host five hours west
    moment = datetime(2026, 3, 2, 5, 0, 7, tzinfo=timezone(timedelta(hours=2)))
    # WHEN its minute is taken  THEN it is written in UTC: the same day and hour as UTC's
    minute = utc_minute(moment)
    assert (minute.tzinfo, minute.date().isoformat(), minute.hour) == (UTC, "2026-03-02", 3)
