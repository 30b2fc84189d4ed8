"""Every durable cursor and its lag, against a real nats-server: the listing
(:func:`rhumbatron.messaging.cursors.read_cursors`) and ``GET /consumers``.

The API is called through httpx's ASGI transport on the test's event loop, so the test can
publish and consume between requests.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.clock import ManualClock, SystemClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import CursorNotFoundError
from rhumbatron.messaging.cursors import (
    CursorKind,
    CursorLag,
    durable_cursors,
    find_cursor,
    read_cursors,
)
from rhumbatron.messaging.event_log import EventLogClient, Subscription, consumer_config
from rhumbatron.messaging.pull import Puller, ensure_consumer
from rhumbatron.messaging.queue_consumer import queue_consumer_config
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_name,
    event_stream_subject,
    stream_index,
)
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, consumer_name
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

PROJECT = "acme-web"
STREAM = stream_index(PROJECT)
OTHER_STREAM = (STREAM + 1) % EVENT_STREAM_COUNT
AT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
CALLER = Caller("tenant-a", "system:test", correlation_id="corr-consumers")
PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR
WATCHER = "consumers-token-ffffffffffff"
NO_SCOPE = "operator-token-ffffffffffff"
REPAIRER = "repairer-token-ffffffffffff"
TENANT_REPAIRER = "repairer-token-aaaaaaaaaaaa"
TOKENS: dict[str, dict[str, Any]] = {
    WATCHER: {"tenant": "*", "scopes": ["consumers:read"]},
    NO_SCOPE: {"tenant": "*", "scopes": ["dead-letters:read", "replay:write"]},
    REPAIRER: {"tenant": "*", "scopes": ["consumers:write", "audit:read"]},
    TENANT_REPAIRER: {"tenant": "tenant-a", "scopes": ["consumers:write"]},
}
EVERY_CURSOR = EVENT_STREAM_COUNT * len(Subscription) + len(QUEUE_CONSUMERS)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest_asyncio.fixture
async def runtime(tmp_path: Path, nats_server: NatsServerProcess) -> AsyncIterator[Rhumbatron]:
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, api_tokens=TOKENS
    )
    app = bootstrap(settings, clock=ManualClock(AT), alarms=RecordingAlarmSink())
    await app.ensure_streams()
    yield app
    await app.close()


@pytest_asyncio.fixture
async def api(runtime: Rhumbatron) -> AsyncIterator[httpx.AsyncClient]:
    asgi = create_api(runtime, StaticTokenAuth(runtime.settings.api_tokens), manage_runtime=False)
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        yield client


def events(count: int) -> list[Event]:
    ctx = FactContext(CALLER, PROJECT, AT)
    return [
        ctx.fact("agent.woke", {"agentId": f"agent-{i}"}, change_id="chg-1", key=str(i))
        for i in range(count)
    ]


def command(command_type: str, payload: dict[str, Any]) -> Command:
    return Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type=command_type,
        project_id=PROJECT,
        change_id="chg-1",
        task_id="tsk-1",
        created_at=AT,
        payload=payload,
    )


async def publish(app: Rhumbatron, batch: list[Event]) -> None:
    js = (await app.nats()).jetstream()
    for event in batch:
        await js.publish(
            event_stream_subject(STREAM), event.to_json(), headers={"Nats-Msg-Id": event.event_id}
        )


async def arrange_partial_consume(app: Rhumbatron) -> None:
    """5 events on the project's stream: the projector fetched 2 and acknowledged 1.
    3 commands on integration: its consumer fetched 1, not acknowledged. 1 command on
    verification, whose consumer was never created."""
    await publish(app, events(5))
    bus = await app.command_bus()
    for _ in range(3):
        await bus.send("integration", command("change.settle", {"reason": "task_failed"}))
    await bus.send("verification", command("verification.start", {"candidateId": "cand-1"}))

    nc = await app.nats()
    log = EventLogClient(nc, app.settings)
    puller = Puller(nc, COMMAND_STREAM, consumer_name("integration"), timeout_s=5.0)
    try:
        fetched = await log.fetch(STREAM, PROJECTOR, 2)
        assert len(fetched) == 2
        # ack_sync: the server has counted the ack before the listing reads it
        await fetched[0].ack_sync()
        js = nc.jetstream()
        await ensure_consumer(
            js, COMMAND_STREAM, queue_consumer_config("integration", app.settings)
        )
        assert len(await puller.pull(1)) == 1
    finally:
        await log.close()
        await puller.close()


def by_name(lags: list[CursorLag]) -> dict[tuple[str, str], CursorLag]:
    return {(lag.cursor.stream, lag.cursor.consumer): lag for lag in lags}


async def test_the_listing_shows_every_cursor_with_its_pending_counts(
    runtime: Rhumbatron,
) -> None:
    # GIVEN a partial consume of an event stream and of a queue (see arrange_partial_consume)
    await arrange_partial_consume(runtime)

    # WHEN every cursor is read
    lags = await read_cursors((await runtime.nats()).jetstream())

    # THEN every event stream x subscription and every queue is listed, in that order
    assert len(lags) == EVERY_CURSOR
    assert [lag.cursor for lag in lags] == durable_cursors()
    found = by_name(lags)
    # AND the projector on the stream: 3 not delivered, 1 delivered but not acknowledged,
    # the last delivery at sequence 2
    projector = found[(event_stream_name(STREAM), PROJECTOR.value)]
    assert projector.exists
    assert (projector.num_pending, projector.num_ack_pending) == (3, 1)
    assert projector.last_delivered_seq == 2
    assert projector.last_delivered_at is not None and projector.last_delivered_at.tzinfo
    # AND a subscription that never read the stream lags by all of it, created or not
    for subscription in Subscription:
        if subscription is not PROJECTOR:
            unread = found[(event_stream_name(STREAM), subscription.value)]
            assert (
                unread.exists,
                unread.num_pending,
                unread.num_ack_pending,
                unread.last_delivered_seq,
                unread.last_delivered_at,
            ) == (False, 5, 0, 0, None)
    assert found[(event_stream_name(OTHER_STREAM), PROJECTOR.value)].num_pending == 0
    # AND the queues: integration 2 waiting and 1 in flight; verification's 1 command waits
    # for a consumer not created yet; the others have nothing
    integration = found[(COMMAND_STREAM, "q-integration")]
    assert (
        integration.cursor.kind is CursorKind.COMMAND and integration.cursor.reads == "integration"
    )
    assert (integration.exists, integration.num_pending, integration.num_ack_pending) == (
        True,
        2,
        1,
    )
    assert integration.last_delivered_seq >= 1
    verification = found[(COMMAND_STREAM, "q-verification")]
    assert (verification.exists, verification.num_pending) == (False, 1)
    assert found[(COMMAND_STREAM, "q-agent-wakeups")].num_pending == 0


async def test_a_cursor_that_read_everything_lags_by_nothing(runtime: Rhumbatron) -> None:
    # GIVEN 2 events the projector fetched and acknowledged
    await publish(runtime, events(2))
    log = EventLogClient(await runtime.nats(), runtime.settings)
    try:
        for message in await log.fetch(STREAM, PROJECTOR, 10):
            await message.ack_sync()
    finally:
        await log.close()

    # WHEN every cursor is read
    lags = by_name(await read_cursors((await runtime.nats()).jetstream()))

    # THEN the projector exists with nothing waiting and nothing in flight, and its last
    # delivery is the second event
    projector = lags[(event_stream_name(STREAM), PROJECTOR.value)]
    assert (projector.exists, projector.num_pending, projector.num_ack_pending) == (True, 0, 0)
    assert projector.last_delivered_seq == 2


async def test_before_the_streams_exist_every_cursor_is_listed_with_nothing_to_read(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN a server on which no stream was ensured yet
    settings = load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url)
    app = bootstrap(settings, clock=ManualClock(AT), alarms=RecordingAlarmSink())
    try:
        # WHEN every cursor is read
        lags = await read_cursors((await app.nats()).jetstream())
    finally:
        await app.close()

    # THEN each is listed, not created, with nothing to read and nothing delivered
    assert [lag.cursor for lag in lags] == durable_cursors()
    assert {
        (
            lag.exists,
            lag.num_pending,
            lag.num_ack_pending,
            lag.last_delivered_seq,
            lag.last_delivered_at,
        )
        for lag in lags
    } == {(False, 0, 0, 0, None)}


async def test_get_consumers_lists_every_consumer_with_its_lag(
    runtime: Rhumbatron, api: httpx.AsyncClient
) -> None:
    # GIVEN the same partial consume
    await arrange_partial_consume(runtime)

    # WHEN an operator with consumers:read lists the consumers
    response = await api.get("/consumers", headers=bearer(WATCHER))

    # THEN every consumer is there with its lag, as the listing reads it
    assert response.status_code == 200, response.text
    consumers = response.json()["consumers"]
    assert len(consumers) == EVERY_CURSOR
    rows = {(c["stream"], c["consumer"]): c for c in consumers}
    projector = rows[(event_stream_name(STREAM), PROJECTOR.value)]
    assert projector["kind"] == "event" and projector["subscription"] == PROJECTOR.value
    assert projector["queue"] is None
    assert (projector["numPending"], projector["numAckPending"]) == (3, 1)
    assert projector["lastDeliveredSeq"] == 2 and projector["exists"] is True
    assert datetime.fromisoformat(projector["lastDeliveredAt"]).tzinfo is not None
    integration = rows[(COMMAND_STREAM, "q-integration")]
    assert (integration["kind"], integration["queue"], integration["subscription"]) == (
        "command",
        "integration",
        None,
    )
    assert (integration["numPending"], integration["numAckPending"]) == (2, 1)
    verification = rows[(COMMAND_STREAM, "q-verification")]
    assert (verification["exists"], verification["numPending"]) == (False, 1)
    assert verification["lastDeliveredAt"] is None


async def test_get_consumers_needs_a_token_with_consumers_read(api: httpx.AsyncClient) -> None:
    # WHEN the consumers are asked for without a token, and with a token lacking the scope
    anonymous = await api.get("/consumers")
    unscoped = await api.get("/consumers", headers=bearer(NO_SCOPE))
    # THEN 401 and 403, and neither lists anything
    assert anonymous.status_code == 401, anonymous.text
    assert unscoped.status_code == 403, unscoped.text
    assert "consumers:read" in unscoped.text
    assert "consumers" not in anonymous.json() and "consumers" not in unscoped.json()


async def test_get_capacity_shows_the_ceilings_and_needs_consumers_read(
    runtime: Rhumbatron, api: httpx.AsyncClient
) -> None:
    # GIVEN events on the streams
    await arrange_partial_consume(runtime)
    # WHEN an operator with consumers:read asks for the capacity
    response = await api.get("/capacity", headers=bearer(WATCHER))
    # THEN it shows every ceiling the settings allow, the sizing, and no warning at the
    #   default sizing (a few events over seconds tell no rate: streams spanning under a
    #   minute are left out)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ceilings"] == {
        "archiveEventsPerDay": 144_000,
        "analyticsEventsPerDay": 115_100,
        "sweepApplyEventsPerDay": 288_000,
        "sweepApplyCallsPerDay": 21_600,
        "reactionsEventsPerDay": 1_152_000,
        "pruneEventsPerDay": 1_000,
    }
    assert (body["expectedEventsPerDay"], body["observedEventsPerDay"]) == (1_000, 0)
    assert (body["tickPruneRows"], body["warnings"], body["drainMode"]) == (0, [], False)
    # AND without the scope it is refused, listing nothing
    unscoped = await api.get("/capacity", headers=bearer(NO_SCOPE))
    assert unscoped.status_code == 403, unscoped.text
    assert "consumers:read" in unscoped.text and "ceilings" not in unscoped.json()


async def test_get_reconciliation_proves_the_published_events_and_needs_consumers_read(
    runtime: Rhumbatron, api: httpx.AsyncClient
) -> None:
    # GIVEN a project whose creation was published from its outbox
    runtime.project_root(PROJECT).create_project(CALLER, name="Web")
    await runtime.fire_due_alarms()
    # WHEN an operator with consumers:read asks for the proof of the project's stream
    response = await api.get(f"/reconciliation?stream={STREAM}", headers=bearer(WATCHER))
    # THEN the one server's copy holds the one event published, and there is no gap
    assert response.status_code == 200, response.text
    body = response.json()
    [stream] = body["streams"]
    assert (stream["stream"], stream["expected"], stream["gap"]) == (
        event_stream_name(STREAM),
        1,
        False,
    )
    [replica] = stream["replicas"]
    assert (replica["found"], replica["missing"], replica["holes"]) == (1, [], 0)
    assert replica["catchingUp"] == []
    assert body["gap"] is False and body["unreadNodes"] == []
    # AND a stream index outside 0-7 is refused, naming the parameter
    outside = await api.get("/reconciliation?stream=8", headers=bearer(WATCHER))
    assert outside.status_code == 422, outside.text
    assert "stream" in outside.text
    # AND without the scope it is refused, proving nothing
    unscoped = await api.get("/reconciliation", headers=bearer(NO_SCOPE))
    assert unscoped.status_code == 403, unscoped.text
    assert "consumers:read" in unscoped.text and "streams" not in unscoped.json()


async def test_a_repair_of_a_whole_log_does_nothing_says_so_and_is_audited(
    runtime: Rhumbatron, api: httpx.AsyncClient
) -> None:
    # GIVEN a published event on the one server, whose copy holds it (no gap)
    runtime.project_root(PROJECT).create_project(CALLER, name="Web")
    await runtime.fire_due_alarms()
    # WHEN a platform operator asks for a repair, first as a dry run, then for real
    dry = await api.post(
        "/reconciliation/repair",
        json={"streams": [STREAM], "dryRun": True},
        headers=bearer(REPAIRER),
    )
    real = await api.post("/reconciliation/repair", json={}, headers=bearer(REPAIRER))
    # THEN there is nothing to repair, and each answer says which kind of call it was
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"dryRun": True, "gap": False, "steps": []}
    assert real.json() == {"dryRun": False, "gap": False, "steps": []}
    # AND both calls are in the audit, by the operator's principal
    audit = (await api.get("/audit", headers=bearer(REPAIRER))).json()["items"]
    assert [(e["operation"], e["outcome"]) for e in audit] == [
        ("repair_log", "succeeded"),
        ("repair_log", "succeeded"),
    ]
    # AND a stream index outside 0-7 is refused, naming the field
    outside = await api.post(
        "/reconciliation/repair", json={"streams": [8]}, headers=bearer(REPAIRER)
    )
    assert outside.status_code == 422, outside.text
    assert outside.json()["error"]["field"] == "streams"
    # AND a token without consumers:write, or of one tenant, is refused
    for token in (WATCHER, TENANT_REPAIRER):
        refused = await api.post("/reconciliation/repair", json={}, headers=bearer(token))
        assert refused.status_code == 403, refused.text


async def test_a_paused_cursor_is_delivered_nothing_until_resumed_and_both_are_audited(
    runtime: Rhumbatron, api: httpx.AsyncClient
) -> None:
    # GIVEN the projector's cursor on the project's stream, with events waiting
    await publish(runtime, events(3))
    nc = await runtime.nats()
    await ensure_consumer(
        nc.jetstream(), event_stream_name(STREAM), consumer_config(PROJECTOR, runtime.settings)
    )
    path = f"/consumers/{event_stream_name(STREAM)}/{PROJECTOR.value}"
    log = EventLogClient(nc, runtime.settings)
    try:
        # WHEN a platform operator pauses it for an hour (by the servers' clock)
        until = SystemClock().now() + timedelta(hours=1)
        paused = await api.post(
            f"{path}/pause", json={"until": until.isoformat()}, headers=bearer(REPAIRER)
        )
        # THEN it is paused until then: listed so, and a fetch gets nothing, nothing lost
        assert paused.status_code == 200, paused.text
        assert datetime.fromisoformat(paused.json()["pausedUntil"]) == until
        listed = (await api.get("/consumers", headers=bearer(WATCHER))).json()["consumers"]
        mine = next(
            c
            for c in listed
            if c["stream"] == event_stream_name(STREAM) and c["consumer"] == PROJECTOR.value
        )
        assert datetime.fromisoformat(mine["pausedUntil"]) == until and mine["numPending"] == 3
        assert await log.fetch(STREAM, PROJECTOR, 10) == []
        # WHEN it is resumed THEN the waiting events are delivered
        resumed = await api.post(f"{path}/resume", headers=bearer(REPAIRER))
        assert (resumed.status_code, resumed.json()["pausedUntil"]) == (200, None)
        assert len(await log.fetch(STREAM, PROJECTOR, 10)) == 3
    finally:
        await log.close()
    # AND both are audited; a pause in the past, or past 7 days, is refused naming `until`
    audit = (await api.get("/audit", headers=bearer(REPAIRER))).json()["items"]
    assert [e["operation"] for e in audit] == ["resume_consumer", "pause_consumer"]
    for when in (SystemClock().now() - timedelta(minutes=1), until + timedelta(days=7)):
        refused = await api.post(
            f"{path}/pause", json={"until": when.isoformat()}, headers=bearer(REPAIRER)
        )
        assert (refused.status_code, refused.json()["error"]["field"]) == (422, "until")
    # AND a cursor the system does not have is not found; a watcher may not pause
    unknown = await api.post(
        "/consumers/EVENTS_00/nobody/pause",
        json={"until": until.isoformat()},
        headers=bearer(REPAIRER),
    )
    assert unknown.status_code == 404
    watcher = await api.post(f"{path}/resume", headers=bearer(WATCHER))
    assert watcher.status_code == 403


async def test_the_log_reads_a_record_by_its_place_and_says_when_the_stream_lost_it(
    runtime: Rhumbatron,
) -> None:
    # GIVEN a record and an empty one on stream 4
    nc = await runtime.nats()
    js = nc.jetstream()
    stored = await js.publish(event_stream_subject(4), b'{"a": 1}')
    empty = await js.publish(event_stream_subject(4), b"")
    log = EventLogClient(nc, runtime.settings)
    # THEN each is read back by its sequence, byte for byte, and a place the stream does
    # not hold (never written, or gone with its max age) reads as None
    assert await log.read_at(4, stored.seq) == b'{"a": 1}'
    assert await log.read_at(4, empty.seq) == b""
    assert await log.read_at(4, empty.seq + 100) is None


async def test_a_prefetch_asks_a_read_consumer_for_the_next_fetch_and_leaves_others_alone(
    runtime: Rhumbatron,
) -> None:
    # GIVEN five events, the projector's cursor read once (one record, not acked)
    await publish(runtime, events(5))
    nc = await runtime.nats()
    log = EventLogClient(nc, runtime.settings)
    js = nc.jetstream()
    try:
        assert len(await log.fetch(STREAM, PROJECTOR, 1)) == 1
        # WHEN the next fetch's three are asked for ahead, and the causal router's, never read
        #   in this process, too
        await log.prefetch(STREAM, PROJECTOR, 3)
        await log.prefetch(STREAM, Subscription.CAUSAL_ROUTER, 3)
        # THEN the server delivers the projector's three at once (it serves pulls on a queue
        #   of its own: asked a bounded number of times), and the next fetch hands them out
        for _ in range(200):
            info = await js.consumer_info(event_stream_name(STREAM), PROJECTOR.value)
            if info.num_ack_pending == 4:
                break
        assert (info.num_ack_pending, info.num_pending) == (4, 1)
        assert len(await log.fetch(STREAM, PROJECTOR, 3)) == 3
        # AND the causal router's consumer was not even created
        lags = by_name(await read_cursors(js))
        assert lags[(event_stream_name(STREAM), Subscription.CAUSAL_ROUTER.value)].exists is False
        # AND a cursor never pulled here has nothing kept to release
        assert await log.release_held(STREAM, Subscription.CAUSAL_ROUTER) == []
    finally:
        await log.close()


def test_an_unknown_cursor_is_refused_naming_it_and_where_the_cursors_are_listed() -> None:
    with pytest.raises(CursorNotFoundError) as refused:
        find_cursor("EVENTS_00", "no-such-consumer")
    assert str(refused.value) == (
        "no durable cursor 'no-such-consumer' on 'EVENTS_00'; GET /consumers lists them"
    )
