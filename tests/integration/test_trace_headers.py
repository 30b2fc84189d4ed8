"""Trace context from the actor's transaction to the stream: the outbox row keeps the
``traceparent`` of the work that wrote it, and the publisher sends it beside ``Nats-Msg-Id``
on every send path (one by one, atomic batch, fast batch)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.js.client import JetStreamContext

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import AppendChangeEvents
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.core.tracing import span
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

CALLER = Caller("acme", "system:test", correlation_id="corr-trace")
WEB = "acme-web"  # stream 0
INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest_asyncio.fixture
async def reader(nats_server: NatsServerProcess) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url, name="test-reader")
    yield nc.jetstream()
    await nc.close()


async def headers_on(js: JetStreamContext, stream: str) -> list[dict[str, str]]:
    info = await js.stream_info(stream)
    return [
        dict((await js.get_msg(stream, seq)).headers or {})
        for seq in range(info.state.first_seq, info.state.last_seq + 1)
    ]


def runtime(tmp_path: Path, nats_url: str, mode: str) -> Rhumbatron:
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_url, publish_batch_mode=mode
    )
    return bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())


@pytest.mark.parametrize("mode", ["off", "atomic", "fast"])
async def test_every_send_path_carries_the_rows_traceparent_beside_its_msg_id(
    mode: str, tmp_path: Path, nats_server: NatsServerProcess, reader: JetStreamContext
) -> None:
    app = runtime(tmp_path, nats_server.url, mode)
    await app.ensure_streams()
    try:
        # GIVEN a project created outside any span, and three Change facts written in a span
        root = app.project_root(WEB)
        root.create_project(CALLER, name="Web")
        shard = app.resource_shard(WEB, change_resource_key("chg-1"))
        facts = tuple(ChangeFact("task.ready", {}, task_id=f"t-{i}") for i in range(3))
        with span("test", parent=TraceContext.parse(INCOMING)) as work:
            shard.apply(
                CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=facts)
            )
        # WHEN both actors are published
        await (await app.publisher()).publish_due(root)
        await (await app.publisher()).publish_due(shard)
        # THEN the project's own events went with no traceparent (no span, no Change) ...
        sent = {
            h["Nats-Msg-Id"]: h.get("traceparent") for h in await headers_on(reader, "EVENTS_00")
        }
        own = [r[0] for r in root.connection.execute("SELECT event_id FROM outbox")]
        assert own and [sent[e] for e in own] == [None] * len(own)
        # ... and each Change event with the Change's trace, the span that wrote it as parent
        expected = f"00-{change_trace_id(WEB, 'chg-1')}-{work.context.span_id}-01"
        rows = shard.connection.execute("SELECT event_id, traceparent FROM outbox").fetchall()
        assert len(rows) >= 3
        assert {sent[e] for e, _ in rows} == {t for _, t in rows} == {expected}
    finally:
        await app.close()


async def test_an_outbox_made_before_trace_context_gets_the_column_and_its_rows_go_without(
    tmp_path: Path, nats_server: NatsServerProcess, reader: JetStreamContext
) -> None:
    # GIVEN an actor file whose outbox has no traceparent column, holding a pending row
    app = runtime(tmp_path, nats_server.url, "auto")
    await app.ensure_streams()
    root = app.project_root(WEB)
    root.create_project(CALLER, name="Web")
    path = root.path
    await app.close()
    old = sqlite3.connect(path)
    old.executescript("PRAGMA user_version = 1; ALTER TABLE outbox DROP COLUMN traceparent;")
    assert "traceparent" not in {c[1] for c in old.execute("PRAGMA table_info(outbox)")}
    old.close()
    app = runtime(tmp_path, nats_server.url, "auto")
    try:
        # WHEN the file is opened by this version and its row published
        root = app.project_root(WEB)
        columns = {c[1] for c in root.connection.execute("PRAGMA table_info(outbox)")}
        report = await (await app.publisher()).publish_due(root)
        # THEN it has the column, the old row's value is NULL, and it went with no header
        assert "traceparent" in columns
        assert [r[0] for r in root.connection.execute("SELECT traceparent FROM outbox")] == [None]
        assert report.published == 1
        assert ["traceparent" in h for h in await headers_on(reader, "EVENTS_00")] == [False]
    finally:
        await app.close()
