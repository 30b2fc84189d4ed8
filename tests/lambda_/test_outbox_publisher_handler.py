"""The outbox publisher Lambda handler, run the way Lambda runs it.

``functions/outbox_publisher/app.py`` is loaded from its path (as the runtime does), its
settings come from ``RHUMBATRON_*`` environment variables, its events from ``events/``, and a
real nats-server stores what it publishes. Handlers are synchronous, so these tests are too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import nats
import pytest

from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AcquireClaim, ReleaseClaim
from rhumbatron.core import event_loop
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import EnvelopeError, NatsUnavailableError
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import FakeLambdaContext, load_app, sample_event

PROJECT = "acme-web"
CALLER = Caller(tenant_id="tenant-1", actor="agent:test", correlation_id="corr-1")


@pytest.fixture
def lambda_env(
    tmp_path: Path, nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The function's environment as template.yaml sets it, pointed at this test's server."""
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RHUMBATRON_JOURNAL_MODE", "DELETE")
    monkeypatch.setenv("RHUMBATRON_NETWORK_FILESYSTEM", "true")
    monkeypatch.setenv("RHUMBATRON_NATS_URL", nats_server.url)
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "outbox-publisher")
    return load_settings()


@pytest.fixture
def handler(lambda_env: Settings) -> Iterator[ModuleType]:
    """A fresh container: the handler module loaded, no runtime cached yet."""
    process.reset_for_tests()
    yield load_app("outbox_publisher")
    process.reset_for_tests()


@pytest.fixture
def writer(lambda_env: Settings) -> Iterator[Rhumbatron]:
    """Another role (the API, a queue handler) writing through the actors in the same state."""
    app = bootstrap(lambda_env)
    yield app
    asyncio.run(app.close())


def _outbox_ids(app: Rhumbatron) -> list[str]:
    """Every outbox row of every actor of PROJECT, in each actor's outbox order."""
    ids: list[str] = []
    for ref in app.actor_refs():
        rows = app.actor(ref).connection.execute("SELECT event_id FROM outbox ORDER BY seq")
        ids += [row[0] for row in rows]
    return ids


def _stored_ids(url: str, project_id: str = PROJECT) -> list[str]:
    """The Nats-Msg-Id of every message on the project's event stream, in stream order."""

    async def read() -> list[str]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            stream = event_stream_name(stream_index(project_id))
            state = (await js.stream_info(stream)).state
            ids = []
            for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
                message = await js.get_msg(stream, seq)
                ids.append((message.headers or {})["Nats-Msg-Id"])
            return ids
        finally:
            await nc.close()

    return asyncio.run(read())


def _claim(app: Rhumbatron, resource: str) -> None:
    app.resource_shard(PROJECT, resource).apply(
        CALLER, AcquireClaim(resource=resource, agent_id="agent-1", ttl=timedelta(minutes=5))
    )


def _resource_on_shard(shard: int, shard_count: int) -> str:
    """A resource key that lands on ``shard`` (to use the sample alarm event as it is)."""
    for i in range(10_000):
        key = f"src/module_{i}.py"
        if ResourceShard.ref_for(PROJECT, key, shard_count).shard == shard:
            return key
    raise AssertionError(f"no resource key maps to shard {shard}")


# -- the schedule ----------------------------------------------------------------------------


def test_schedule_event_publishes_every_due_outbox_row_in_order(
    handler: ModuleType, writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a project root and a resource shard with unpublished events
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    _claim(writer, "src/app.py")
    shard = writer.resource_shard(PROJECT, "src/app.py")
    shard.apply(CALLER, ReleaseClaim(resource="src/app.py", agent_id="agent-1"))
    written = _outbox_ids(writer)
    assert len(written) == 3

    # WHEN the every-minute schedule invokes the function
    summary = handler.lambda_handler(
        sample_event("outbox_publisher_schedule.json"), FakeLambdaContext()
    )

    # THEN both actors published their rows, and the stream holds them, each actor's in order
    assert summary["job"] == "fire_due_alarms"
    assert summary["totals"]["published"] == 3
    assert summary["stopped_early"] is False
    assert sorted((a["actor"], a["alarm"], a["published"]) for a in summary["actors"]) == [
        (f"project_root:{PROJECT}", "fire", 1),
        (shard.ref.key, "fire", 2),
    ]
    stored = _stored_ids(nats_server.url)
    assert sorted(stored) == sorted(written)
    shard_ids = [r[0] for r in shard.connection.execute("SELECT event_id FROM outbox ORDER BY seq")]
    assert [i for i in stored if i in shard_ids] == shard_ids
    json.dumps(summary)  # the summary is what Lambda returns: it must be JSON


def test_warm_invocation_reuses_loop_and_connection_and_republishes_nothing(
    handler: ModuleType, writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a first (cold) invocation that published the project's first event
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    schedule = sample_event("outbox_publisher_schedule.json")
    assert handler.lambda_handler(schedule, FakeLambdaContext())["totals"]["published"] == 1
    loop = event_loop.get_loop()
    connection = event_loop.run(process.process_runtime().nats())
    connections_before = nats_server.varz()["total_connections"]

    # WHEN the schedule invokes the warm container again
    again = handler.lambda_handler(schedule, FakeLambdaContext())

    # THEN nothing new is published, on the same loop and the same NATS connection
    assert again["totals"]["published"] == 0
    assert again["actors"] == []  # the alarm was deleted: nothing due
    assert event_loop.get_loop() is loop
    assert event_loop.run(process.process_runtime().nats()) is connection
    assert nats_server.varz()["total_connections"] == connections_before

    # AND a write between warm invocations is published by the next one, exactly once
    _claim(writer, "src/app.py")
    third = handler.lambda_handler(schedule, FakeLambdaContext())
    assert third["totals"]["published"] == 1
    assert nats_server.varz()["total_connections"] == connections_before
    assert sorted(_stored_ids(nats_server.url)) == sorted(_outbox_ids(writer))


def test_schedule_stops_before_the_remaining_time_runs_out(
    handler: ModuleType, writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN two actors with due events
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    _claim(writer, "src/app.py")

    # WHEN the schedule arrives with less time left than one actor may take
    short = handler.lambda_handler(
        sample_event("outbox_publisher_schedule.json"), FakeLambdaContext(remaining_ms=1_000)
    )

    # THEN it starts no actor and says so; the rows wait for the next tick
    assert short["stopped_early"] is True
    assert short["actors_left"] == 2
    assert short["totals"]["published"] == 0
    assert _stored_ids(nats_server.url) == []

    # AND the next tick, with time to spare, publishes them
    full = handler.lambda_handler(
        sample_event("outbox_publisher_schedule.json"), FakeLambdaContext()
    )
    assert full["totals"]["published"] == 2
    assert full["stopped_early"] is False


def test_warm_invocation_after_a_nats_restart_reconnects_and_publishes(
    handler: ModuleType, writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN a warm container whose NATS server restarted while the container was idle
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    schedule = sample_event("outbox_publisher_schedule.json")
    assert handler.lambda_handler(schedule, FakeLambdaContext())["totals"]["published"] == 1
    nats_server.restart()
    _claim(writer, "src/app.py")

    # WHEN the schedule invokes it
    summary = handler.lambda_handler(schedule, FakeLambdaContext())

    # THEN it reconnects first and publishes the new row
    assert summary["totals"] == {
        "published": 1,
        "duplicates": 0,
        "retry_wait": 0,
        "failed": 0,
        "busy": 0,
        "unavailable": 0,
    }
    assert sorted(_stored_ids(nats_server.url)) == sorted(_outbox_ids(writer))


# -- the alarm invoke ------------------------------------------------------------------------


def test_alarm_event_fires_that_actor_only(
    handler: ModuleType, writer: Rhumbatron, nats_server: NatsServerProcess
) -> None:
    # GIVEN the sample alarm event's actor and another actor, both with due events
    event = sample_event("outbox_publisher_alarm.json")
    shard_count = writer.settings.resource_shard_count
    resource = _resource_on_shard(int(event["actor"].rsplit(":", 1)[1]), shard_count)
    _claim(writer, resource)
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    shard = writer.resource_shard(PROJECT, resource)
    assert shard.ref.key == event["actor"]

    # WHEN the alarm invoke for the shard arrives
    summary = handler.lambda_handler(event, FakeLambdaContext())

    # THEN that shard's event is on the stream, and the project root's still waits
    assert summary["job"] == "fire_alarm"
    assert [(a["actor"], a["alarm"], a["published"]) for a in summary["actors"]] == [
        (event["actor"], "fire", 1)
    ]
    shard_ids = [r[0] for r in shard.connection.execute("SELECT event_id FROM outbox")]
    assert _stored_ids(nats_server.url) == shard_ids


# -- bad input and an unreachable NATS -------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "names"),
    [
        ({"source": "schedule", "job": "fire_all"}, ["'job'", "'fire_all'"]),
        ({"source": "cron", "job": "fire_due_alarms"}, ["'source'", "'cron'"]),
        ({"job": "fire_due_alarms"}, ["'source' is missing"]),
        ({"actor": "shard:acme-web"}, ["'actor'", "'shard:acme-web'"]),
        ({"actor": "project_root:acme-web", "retry": True}, ["'retry'", "True"]),
        ({}, ["'source' is missing", "'job' is missing"]),
        (["fire_due_alarms"], ["JSON object", "list"]),
    ],
)
def test_bad_event_is_refused_naming_the_field_and_value(
    handler: ModuleType, event: Any, names: list[str]
) -> None:
    with pytest.raises(EnvelopeError) as refused:
        handler.lambda_handler(event, FakeLambdaContext())
    for name in names:
        assert name in str(refused.value)
    assert '{"source": "schedule", "job": "fire_due_alarms"}' in str(refused.value)


def test_unreachable_nats_on_a_cold_start_fails_loudly_and_counts_no_attempt(
    handler: ModuleType, writer: Rhumbatron, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a due event and a NATS URL where nobody listens
    writer.project_root(PROJECT).create_project(CALLER, name="Acme web")
    monkeypatch.setenv("RHUMBATRON_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.25")

    # WHEN the schedule invokes the function THEN the invocation fails, naming the URL
    with pytest.raises(NatsUnavailableError, match=r"nats://127\.0\.0\.1:1"):
        handler.lambda_handler(sample_event("outbox_publisher_schedule.json"), FakeLambdaContext())

    # AND the row stays pending with no attempt counted
    root = writer.project_root(PROJECT).connection
    rows = root.execute("SELECT state, attempts FROM outbox").fetchall()
    assert [tuple(row) for row in rows] == [("pending", 0)]


# -- the process's event loop ----------------------------------------------------------------


async def test_event_loop_run_refuses_to_nest_inside_a_running_loop() -> None:
    async def answer() -> int:
        return 42

    with pytest.raises(RuntimeError, match="await the coroutine instead"):
        event_loop.run(answer())


def test_event_loop_run_reuses_one_loop_per_process() -> None:
    async def current() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    first = event_loop.run(current())
    assert event_loop.run(current()) is first
    assert first is event_loop.get_loop()
