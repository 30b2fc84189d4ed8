"""Time events end to end (issue #7 item 8; seed 002 §6 "schedules became time events"): each
tick runs through the sweep entrypoint's code path (``sweep._handle``) on a :class:`ManualClock`
against a real nats-server and moto S3, the actors' outboxes are published by the local alarm
invoker, and the event streams are read back from JetStream.

They prove: a sweep tick lands ``schedule.fired`` on the clock project's stream; a user
schedule fires at its due time and not before; a repeated tick — even one that lost the record
of its fire — stores no second fact (the same Event ID); and a subscription on
``schedule.fired`` filtered by ``payload.scheduleId`` reacts through the reactions consumer
with a signed webhook — a time-driven reaction is just a subscription on the clock's tick.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.entrypoints import sweep
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.reactions.schedule_firing import (
    SWEEP_SCHEDULE_ID,
    ScheduleSettings,
    schedule_event_id,
)
from rhumbatron.reactions.schedule_models import ScheduleTiming
from rhumbatron.reactions.schedule_registry import ScheduleRegistry
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import Governance, WebhookReaction
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

from . import test_reactions
from .test_reactions import SECRET, Receiver

#: The reactions tests' loopback webhook receiver, which verifies every signature.
receiver = test_reactions.receiver

pytestmark = pytest.mark.integration

TENANT = "acme"
PROJECT = "acme-clockwork"
CLOCK_PROJECT = ScheduleSettings().clock_project_id
DAY = datetime(2026, 3, 2, tzinfo=UTC)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute, seconds=second)


@pytest_asyncio.fixture
async def app(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess, clock: ManualClock
) -> AsyncIterator[Rhumbatron]:
    """The embedded default on a manual clock at 10:00:30, with the tenant's project."""
    bucket = f"evidence-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=bucket)
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        s3_endpoint_url=s3_server.endpoint_url,
        evidence_bucket=bucket,
        webhook_allowed_hosts=("127.0.0.1",),
    )
    clock.set(at(10, 0, 30))
    # The sweep entrypoint remembers per process that the streams are ensured: start cold.
    process.reset_for_tests()
    runtime = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    await runtime.ensure_streams()
    runtime.project_root(PROJECT).create_project(Caller(TENANT, "user:ann", "c1"), name="Clock")
    yield runtime
    await runtime.close()
    process.reset_for_tests()


@pytest.fixture
def schedules(app: Rhumbatron) -> ScheduleRegistry:
    return ScheduleRegistry(app.product(), app.clock, project_tenant=app.project_tenant)


async def tick(app: Rhumbatron, clock: ManualClock, when: datetime) -> dict[str, Any]:
    """One sweep invocation for ``when`` (the clock moved there), then the local alarm invoker
    publishes what the tick wrote."""
    clock.set(max(when, clock.now()))
    summary = await sweep._handle(app, None, at=when)
    await app.drain_alarms()
    return summary


async def fired_on_stream(app: Rhumbatron, project: str) -> list[tuple[str | None, Event]]:
    """Every schedule.fired JetStream stored on ``project``'s stream: (Nats-Msg-Id, Event)."""
    js = (await app.nats()).jetstream()
    stream = event_stream_name(stream_index(project))
    info = await js.stream_info(stream)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else ():
        raw = await js.get_msg(stream, seq)
        event = Event.parse(raw.data or b"")
        if event.event_type == "schedule.fired" and event.project_id == project:
            found.append(((raw.headers or {}).get("Nats-Msg-Id"), event))
    return found


def scheduled_at(event: Event) -> str:
    value: str = event.to_wire()["payload"]["scheduledAt"]
    return value


async def test_a_sweep_tick_lands_schedule_fired_on_the_clock_projects_stream(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN the runtime, no schedule registered
    # WHEN the 10:01 sweep tick runs
    summary = await tick(app, clock, at(10, 1))
    # THEN its summary names the sweep's fire, and the clock project's stream holds the fact
    assert summary["schedules_fired"] == [SWEEP_SCHEDULE_ID]
    assert summary["schedules_failed"] == {}
    [(msg_id, event)] = await fired_on_stream(app, CLOCK_PROJECT)
    assert msg_id == event.event_id == schedule_event_id(SWEEP_SCHEDULE_ID, at(10, 1))
    assert event.tenant_id == "platform"
    assert event.to_wire()["payload"] == {
        "scheduleId": "sweep",
        "name": "sweep",
        "mode": "sweep",
        "scheduledAt": "2026-03-02T10:01:00Z",
    }


async def test_a_user_schedule_fires_at_its_due_time_and_not_before(
    app: Rhumbatron, clock: ManualClock, schedules: ScheduleRegistry
) -> None:
    # GIVEN an every-5-minutes schedule on the project, created at 10:00:30
    record = schedules.create(
        TENANT, "every-5", PROJECT, ScheduleTiming.of("interval", every_minutes=5)
    ).record
    # WHEN the ticks of 10:01 to 10:04 run
    early = [await tick(app, clock, at(10, m)) for m in range(1, 5)]
    # THEN only the sweep's own tick fired, and the project's stream holds nothing of it
    assert [s["schedules_fired"] for s in early] == [[SWEEP_SCHEDULE_ID]] * 4
    assert await fired_on_stream(app, PROJECT) == []
    # WHEN the 10:05 tick runs
    due = await tick(app, clock, at(10, 5))
    # THEN the schedule fired once, for 10:05, on its project's stream, in its tenant
    assert due["schedules_fired"] == [SWEEP_SCHEDULE_ID, record.schedule_id]
    [(msg_id, event)] = await fired_on_stream(app, PROJECT)
    assert msg_id == event.event_id == schedule_event_id(record.schedule_id, at(10, 5))
    assert (event.tenant_id, scheduled_at(event)) == (TENANT, "2026-03-02T10:05:00Z")
    assert event.to_wire()["payload"]["name"] == "every-5"


async def test_a_schedule_created_exactly_on_a_due_time_fires_for_it(
    app: Rhumbatron, clock: ManualClock, schedules: ScheduleRegistry
) -> None:
    # GIVEN an every-5-minutes schedule created at 10:05:00 sharp, one of its due times
    clock.set(at(10, 5))
    record = schedules.create(
        TENANT, "on-time", PROJECT, ScheduleTiming.of("interval", every_minutes=5)
    ).record
    # WHEN the 10:05 tick runs
    due = await tick(app, clock, at(10, 5))
    # THEN the schedule fired for 10:05: a due time at its creation is one of its own
    assert due["schedules_fired"] == [SWEEP_SCHEDULE_ID, record.schedule_id]
    [(_, event)] = await fired_on_stream(app, PROJECT)
    assert scheduled_at(event) == "2026-03-02T10:05:00Z"


async def test_a_repeated_tick_stores_no_second_fact_even_when_it_lost_its_fire_record(
    app: Rhumbatron, clock: ManualClock, schedules: ScheduleRegistry
) -> None:
    # GIVEN an every-5-minutes schedule that fired at the 10:05 tick
    record = schedules.create(
        TENANT, "every-5", PROJECT, ScheduleTiming.of("interval", every_minutes=5)
    ).record
    await tick(app, clock, at(10, 5))
    # WHEN the same tick runs again (a retried invocation, a minute later)
    clock.advance(60)
    again = await tick(app, clock, at(10, 5))
    # THEN nothing fires a second time
    assert again["schedules_fired"] == []
    # WHEN the record of its fires is lost, and the tick runs once more
    with app.product().transaction() as db:
        db.execute("DELETE FROM schedule_fires")
    lost = await tick(app, clock, at(10, 5))
    # THEN the schedule and the sweep fire again with the same Event IDs, and each stream
    # still stores one fact for the tick
    assert lost["schedules_fired"] == [SWEEP_SCHEDULE_ID, record.schedule_id]
    assert [m for m, _ in await fired_on_stream(app, PROJECT)] == [
        schedule_event_id(record.schedule_id, at(10, 5))
    ]
    assert [m for m, _ in await fired_on_stream(app, CLOCK_PROJECT)] == [
        schedule_event_id(SWEEP_SCHEDULE_ID, at(10, 5))
    ]


async def test_a_subscription_on_one_schedules_fires_reacts_with_a_webhook(
    app: Rhumbatron, clock: ManualClock, schedules: ScheduleRegistry, receiver: Receiver
) -> None:
    # GIVEN two daily schedules due at a minute the project's stream is swept, and a webhook
    # subscription on schedule.fired filtered to the first one's ID
    stream = stream_index(PROJECT)
    minute = next(m for m in range(10 * 60 + 1, 11 * 60) if m % 8 == stream)
    due = at(minute // 60, minute % 60)
    daily = ScheduleTiming.of("daily", at=due.strftime("%H:%M"))
    wanted = schedules.create(TENANT, "wanted", PROJECT, daily).record
    schedules.create(TENANT, "other", PROJECT, daily)
    subscription = (
        SubscriptionRegistry(app.product(), app.settings, clock)
        .create(
            TENANT,
            "on-wanted",
            Selector.create(["schedule.fired"], {"payload.scheduleId": wanted.schedule_id}),
            WebhookReaction(url=receiver.url, secrets=(SECRET,)),
            Governance(cooldown_s=0),
        )
        .record
    )
    # WHEN both fire at their tick, and the sweep visits the project's stream 8 minutes later
    fired = await tick(app, clock, due)
    later = await tick(app, clock, due + timedelta(minutes=8))
    # THEN the reactions consumer delivered one signed pointer to the wanted schedule's fact
    assert len(fired["schedules_fired"]) == 3
    assert later["stream_index"] == stream
    assert later["subscriptions"]["reactions"]["applied"] >= 2
    event_id = schedule_event_id(wanted.schedule_id, due)
    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    assert headers["webhook-id"] == f"{event_id}:{subscription.subscription_id}"
    assert body["eventId"] == event_id and body["kind"] == "schedule.fired"
    assert body["subject"] == {"type": "schedule", "id": wanted.schedule_id}
    assert body["projectId"] == PROJECT
    # AND the fact it points to names its schedule: ID, name and mode
    facts = {event.event_id: event for _, event in await fired_on_stream(app, PROJECT)}
    payload = facts[event_id].to_wire()["payload"]
    assert (payload["scheduleId"], payload["name"], payload["mode"]) == (
        wanted.schedule_id,
        "wanted",
        "daily",
    )
