"""The router's two Lambda handlers — nudge and sweep — run the way Lambda runs them.

``functions/router_nudge/app.py`` and ``functions/sweep/app.py`` are loaded from their paths
(as the runtime does), their settings come from ``RHUMBATRON_*`` environment variables as
template.yaml sets them, their events from ``events/``, a real nats-server holds the event
streams and moto's S3 server the archive. Events reach the streams the way they do in the
cloud: written by the actors, published by the outbox publisher's handler. Handlers are
synchronous, so these tests are too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rhumbatron.core import event_loop
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.entrypoints import router_nudge, sweep
from rhumbatron.errors import EnvelopeError, NatsUnavailableError
from rhumbatron.messaging.commands import LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, stream_index
from rhumbatron.router.project_view import ProjectView
from rhumbatron.router.stream_state import StreamState
from rhumbatron.router.view_store import StreamViews, view_store_path
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

from .support import FakeLambdaContext, load_app, sample_event

CALLER = Caller(tenant_id="tenant-1", actor="agent:test", correlation_id="corr-1")
COUNTS = {
    "consumes",
    "fetched",
    "applied",
    "duplicates",
    "deferred",
    "retried",
    "failed",
    "dead_lettered",
}


@dataclass
class Handlers:
    """The three functions' ``app`` modules, as one warm container per test would load them."""

    publisher: ModuleType
    nudge: ModuleType
    sweep: ModuleType


def _project_on_stream(index: int) -> str:
    """A fresh project ID whose events go to stream ``index``."""
    while True:
        project_id = f"proj-{uuid.uuid4().hex[:8]}"
        if stream_index(project_id) == index:
            return project_id


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def bucket(s3_server: S3ServerProcess) -> str:
    name = f"evidence-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def lambda_env(
    tmp_path: Path,
    nats_server: NatsServerProcess,
    s3_server: S3ServerProcess,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    """The router functions' environment as template.yaml sets it, pointed at this test's
    nats-server and bucket."""
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_JOURNAL_MODE": "DELETE",
        "RHUMBATRON_NETWORK_FILESYSTEM": "true",
        "RHUMBATRON_NATS_URL": nats_server.url,
        "RHUMBATRON_S3_ENDPOINT_URL": s3_server.endpoint_url,
        "RHUMBATRON_EVIDENCE_BUCKET": bucket,
        "RHUMBATRON_METRICS_EMF": "true",
        "RHUMBATRON_ARCHIVE_EXPIRY_PASS": "false",
        "POWERTOOLS_SERVICE_NAME": "router",
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings()


@pytest.fixture
def handlers(lambda_env: Settings) -> Iterator[Handlers]:
    """A fresh container: the handler modules loaded, no runtime cached yet.

    The three roles share one runtime per process (``rhumbatron.entrypoints._lambda``), so
    resetting it through any of them starts every role cold.
    """
    process.reset_for_tests()
    yield Handlers(load_app("outbox_publisher"), load_app("router_nudge"), load_app("sweep"))
    process.reset_for_tests()


@pytest.fixture
def writer(lambda_env: Settings) -> Iterator[Rhumbatron]:
    """Another role (the API, a queue handler) writing through the actors in the same state."""
    app = bootstrap(lambda_env)
    yield app
    asyncio.run(app.close())


def _create_projects(writer: Rhumbatron, handlers: Handlers, project_ids: list[str]) -> None:
    """Each project writes its ``project.created``; the publisher's schedule publishes them."""
    for project_id in project_ids:
        writer.project_root(project_id).create_project(CALLER, name=f"Project {project_id}")
    summary = handlers.publisher.lambda_handler(
        sample_event("outbox_publisher_schedule.json"), FakeLambdaContext()
    )
    assert summary["totals"]["published"] == len(project_ids)


def _view_name(settings: Settings, project_id: str) -> str | None:
    """The project's name as its view shows it; None when the view never saw the project."""
    if not view_store_path(settings, stream_index(project_id)).exists():
        return None
    store = StreamViews(settings, stream_index(project_id))
    try:
        name: str | None = ProjectView(store, project_id).snapshot()["name"]
        return name
    finally:
        store.close()


def _emf_metrics(stdout: str) -> list[dict[str, Any]]:
    """The CloudWatch EMF documents among the lines a handler printed."""
    documents = []
    for line in stdout.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            documents.append(json.loads(line))
    return documents


# -- nudge -----------------------------------------------------------------------------------


def test_nudge_applies_the_new_events_of_its_stream_to_the_project_views(
    handlers: Handlers, writer: Rhumbatron, lambda_env: Settings
) -> None:
    # GIVEN two projects on stream 3 (the sample nudge's stream) and one on stream 5,
    # their project.created events published
    event = sample_event("router_nudge.json")
    on_stream = [_project_on_stream(event["streamIndex"]) for _ in range(2)]
    elsewhere = _project_on_stream(5)
    _create_projects(writer, handlers, [*on_stream, elsewhere])

    # WHEN the publisher's async invoke for stream 3 arrives
    summary = handlers.nudge.lambda_handler(event, FakeLambdaContext())

    # THEN the projector and the causal router each applied both events of stream 3
    assert summary["job"] == "nudge"
    assert (summary["stream_index"], summary["stream"]) == (3, "EVENTS_03")
    subscriptions = summary["subscriptions"]
    assert list(subscriptions) == ["project-view-projector", "causal-router"]
    for counts in subscriptions.values():
        assert set(counts) == COUNTS
        assert counts["fetched"] == counts["applied"] == 2
        assert counts["failed"] == counts["dead_lettered"] == counts["deferred"] == 0
    assert summary["totals"]["applied"] == 4
    assert (summary["runs"], summary["merged"], summary["out_of_time"]) == (1, False, False)
    json.dumps(summary)  # the summary is what Lambda returns: it must be JSON

    # AND both projects' views show them; the other stream's project waits for its nudge
    for project_id in on_stream:
        assert _view_name(lambda_env, project_id) == f"Project {project_id}"
    assert _view_name(lambda_env, elsewhere) is None


def test_warm_nudge_reuses_the_connection_and_applies_only_what_is_new(
    handlers: Handlers, writer: Rhumbatron, nats_server: NatsServerProcess, lambda_env: Settings
) -> None:
    # GIVEN a warm container whose first nudge applied stream 3's only event
    first_project = _project_on_stream(3)
    _create_projects(writer, handlers, [first_project])
    nudge = sample_event("router_nudge.json")
    assert handlers.nudge.lambda_handler(nudge, FakeLambdaContext())["totals"]["applied"] == 2
    loop = event_loop.get_loop()
    connection = event_loop.run(process.process_runtime().nats())
    connections_before = nats_server.varz()["total_connections"]

    # WHEN the nudge comes again with nothing new, and once more after a new event
    idle = handlers.nudge.lambda_handler(nudge, FakeLambdaContext())
    second_project = _project_on_stream(3)
    _create_projects(writer, handlers, [second_project])
    busy = handlers.nudge.lambda_handler(nudge, FakeLambdaContext())

    # THEN the idle nudge fetched nothing, the next applied only the new event
    assert idle["totals"]["fetched"] == idle["totals"]["applied"] == 0
    assert busy["subscriptions"]["project-view-projector"]["applied"] == 1
    assert busy["totals"]["duplicates"] == 0
    assert _view_name(lambda_env, second_project) == f"Project {second_project}"

    # AND every invocation ran on the same loop and the same NATS connection
    assert event_loop.get_loop() is loop
    assert event_loop.run(process.process_runtime().nats()) is connection
    assert nats_server.varz()["total_connections"] == connections_before


def test_nudge_with_a_nearly_expired_context_stops_before_fetching(
    handlers: Handlers, writer: Rhumbatron, lambda_env: Settings
) -> None:
    # GIVEN an event published on stream 3
    project_id = _project_on_stream(3)
    _create_projects(writer, handlers, [project_id])

    # WHEN the nudge arrives with less time left than one consume may take
    short = handlers.nudge.lambda_handler(
        sample_event("router_nudge.json"), FakeLambdaContext(remaining_ms=1_000)
    )

    # THEN it fetched nothing and says the time ran out; the view does not know the project
    assert short["out_of_time"] is True
    assert {name: c["consumes"] for name, c in short["subscriptions"].items()} == {
        "project-view-projector": 0,
        "causal-router": 0,
    }
    assert short["totals"]["fetched"] == 0
    assert _view_name(lambda_env, project_id) is None

    # AND the next nudge, with time to spare, applies the event
    full = handlers.nudge.lambda_handler(sample_event("router_nudge.json"), FakeLambdaContext())
    assert full["subscriptions"]["project-view-projector"]["applied"] == 1
    assert _view_name(lambda_env, project_id) == f"Project {project_id}"


def test_a_nudge_while_another_container_runs_the_stream_is_merged_into_that_run(
    handlers: Handlers, writer: Rhumbatron, lambda_env: Settings
) -> None:
    # GIVEN an event published on stream 3, and another container's nudge run holding the
    #   stream's turn (Lambda runs concurrent invokes in separate containers)
    project_id = _project_on_stream(3)
    _create_projects(writer, handlers, [project_id])
    other = StreamState(lambda_env, 3)
    assert other.take_nudge_turn("other-container", now_s=time.time(), hold_s=60)

    # WHEN the nudge for stream 3 arrives here
    merged = handlers.nudge.lambda_handler(sample_event("router_nudge.json"), FakeLambdaContext())

    # THEN it ran nothing beside the run in flight: it was merged, and the holder has one
    #   more run to do when its run ends
    assert (merged["merged"], merged["runs"], merged["totals"]["fetched"]) == (True, 0, 0)
    assert _view_name(lambda_env, project_id) is None
    assert other.next_nudge_turn("other-container", now_s=time.time(), hold_s=60)

    # WHEN that container's second run ends with no nudge merged, and a nudge comes after
    assert not other.next_nudge_turn("other-container", now_s=time.time(), hold_s=60)
    other.close()
    full = handlers.nudge.lambda_handler(sample_event("router_nudge.json"), FakeLambdaContext())

    # THEN that nudge takes the turn, runs, and applies the event
    assert (full["merged"], full["runs"]) == (False, 1)
    assert full["subscriptions"]["project-view-projector"]["applied"] == 1
    assert _view_name(lambda_env, project_id) == f"Project {project_id}"


@pytest.mark.parametrize(
    ("event", "names"),
    [
        ({"streamIndex": 8}, ["'streamIndex'=8", "less than 8"]),
        ({"streamIndex": -1}, ["'streamIndex'=-1", "greater than or equal to 0"]),
        ({"streamIndex": "3"}, ["'streamIndex'='3'", "valid integer"]),
        ({"streamIndex": True}, ["'streamIndex'=True", "valid integer"]),
        ({"stream_index": 3}, ["'streamIndex' is missing", "'stream_index'=3"]),
        ({"streamIndex": 3, "project": "acme"}, ["'project'='acme'", "Extra inputs"]),
        ({}, ["'streamIndex' is missing"]),
        ([3], ["JSON object", "list"]),
    ],
)
def test_bad_nudge_event_is_refused_naming_the_field_and_value(
    handlers: Handlers, event: Any, names: list[str]
) -> None:
    with pytest.raises(EnvelopeError) as refused:
        handlers.nudge.lambda_handler(event, FakeLambdaContext())
    message = str(refused.value)
    for name in names:
        assert name in message
    assert "router nudge" in message
    assert '{"streamIndex": <0..7>}' in message


def test_nudge_with_unreachable_nats_fails_loudly_naming_the_url(
    handlers: Handlers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a NATS URL where nobody listens (a cold start)
    monkeypatch.setenv("RHUMBATRON_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("RHUMBATRON_NATS_CONNECT_TIMEOUT_S", "0.25")

    # WHEN the nudge arrives THEN the invocation fails, naming the URL (the sweep catches up)
    with pytest.raises(NatsUnavailableError, match=r"nats://127\.0\.0\.1:1"):
        handlers.nudge.lambda_handler(sample_event("router_nudge.json"), FakeLambdaContext())


# -- sweep -----------------------------------------------------------------------------------


def test_sweep_applies_archives_and_records_the_lag_of_its_minutes_stream(
    handlers: Handlers,
    writer: Rhumbatron,
    lambda_env: Settings,
    s3_server: S3ServerProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN one published project.created on every stream: whichever minute the tick falls
    # in, its stream holds exactly one event
    projects = {index: _project_on_stream(index) for index in range(EVENT_STREAM_COUNT)}
    _create_projects(writer, handlers, list(projects.values()))
    capsys.readouterr()

    # WHEN EventBridge Scheduler sends the sample schedule event
    summary = handlers.sweep.lambda_handler(
        sample_event("sweep_schedule.json"), FakeLambdaContext()
    )

    # THEN it visited the stream of the tick's minute and applied that stream's event
    index = summary["stream_index"]
    assert summary["job"] == "sweep"
    assert index == summary["minute_of_day"] % EVENT_STREAM_COUNT
    assert summary["stream"] == event_stream_name(index)
    assert summary["out_of_time"] is False
    assert _view_name(lambda_env, projects[index]) == f"Project {projects[index]}"
    visited = {"project-view-projector", "causal-router", "audit-archiver", "reactions"}
    # an ordinary tick also runs the analytics batch; the maintenance and release ticks don't
    assert summary["analytics"] is not (summary["maintenance"] or summary["release_sweep"])
    if summary["analytics"]:
        visited.add("analytics-projector")
    assert set(summary["subscriptions"]) == visited
    for name in visited:
        assert summary["subscriptions"][name]["applied"] == 1, name
    assert summary["totals"]["failed"] == 0

    # AND the archiver wrote that event as one object under the stream's prefix
    ((archived),) = summary["archive_objects"]
    assert archived["events"] == 1
    assert f"/stream-{index:02d}/" in archived["key"]
    listed = s3_server.client().list_objects_v2(Bucket=lambda_env.evidence_bucket)
    assert [entry["Key"] for entry in listed["Contents"]] == [archived["key"]]

    # AND the lag of all 32 consumers: the visited ones caught up, the others lag one event
    lags = {(lag["stream"], lag["consumer"]): lag for lag in summary["lags"]}
    assert len(lags) == EVENT_STREAM_COUNT * 5
    for name in visited:
        lag = lags[(event_stream_name(index), name)]
        assert (lag["num_pending"], lag["num_ack_pending"], lag["exists"]) == (0, 0, True)
    other = event_stream_name((index + 1) % EVENT_STREAM_COUNT)
    assert lags[(other, "project-view-projector")]["num_pending"] == 1

    # AND the outbox backlog is empty (everything published); nothing was pruned off-tick
    assert summary["outbox_backlog"] == {"pending": 0, "retry_wait": 0, "failed": 0}
    if not summary["maintenance"]:
        assert summary["pruned_claims"] == summary["pruned_feed_rows"] == 0
        assert summary["pruned_metric_rows"] == 0
    assert summary["warnings"] == []  # eight events are far below the router's ceilings
    assert summary["archive_objects_expired"] == 0  # the bucket's lifecycle rule expires them
    json.dumps(summary)

    # AND the lag went out as CloudWatch EMF lines too (RHUMBATRON_METRICS_EMF)
    documents = _emf_metrics(capsys.readouterr().out)
    pending = [
        d
        for d in documents
        if "consumer_num_pending" in d
        and d.get("stream") == other
        and d.get("consumer") == "project-view-projector"
    ]
    assert [d["consumer_num_pending"] for d in pending] == [[1.0]]  # EMF keeps a list
    assert pending[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Rhumbatron"


def test_a_sweep_tick_prints_one_emf_document_per_dimension_set_holding_every_point(
    handlers: Handlers,
    writer: Rhumbatron,
    lambda_env: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN one published event on every stream, and the metric rows written so far
    projects = [_project_on_stream(index) for index in range(EVENT_STREAM_COUNT)]
    _create_projects(writer, handlers, projects)
    with writer.product().transaction() as product:
        (before,) = product.execute("SELECT coalesce(max(id), 0) FROM platform_metrics").fetchone()
    capsys.readouterr()

    # WHEN one sweep tick runs
    handlers.sweep.lambda_handler(sample_event("sweep_schedule.json"), FakeLambdaContext())

    # THEN it printed at most one EMF document per namespace, binding and dimension set
    documents = _emf_metrics(capsys.readouterr().out)
    directives = [d["_aws"]["CloudWatchMetrics"] for d in documents]
    assert all(len(directive) == 1 for directive in directives)
    keys = [
        (
            directive[0]["Namespace"],
            tuple(sorted((name, d[name]) for name in directive[0]["Dimensions"][0])),
        )
        for d, directive in zip(documents, directives, strict=True)
    ]
    assert len(keys) == len(set(keys)), sorted(keys)
    # AND together they hold exactly the points the tick recorded: every row, value and unit
    printed = sorted(
        (d["binding"], metric["Name"], metric["Unit"], _dimensions(d), value)
        for d in documents
        for metric in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        for value in d[metric["Name"]]
    )
    with writer.product().transaction() as product:
        rows = product.execute(
            "SELECT binding, name, unit, dimensions, value FROM platform_metrics WHERE id > ?",
            (before,),
        ).fetchall()
    recorded = sorted(
        (binding, name, unit, tuple(sorted(json.loads(dims).items())), value)
        for binding, name, unit, dims, value in rows
    )
    assert printed == recorded
    # AND the 40 consumers' lag, the outbox backlog and the heartbeat are fewer documents
    # than points (one a point printed 95 lines a tick)
    assert len(documents) < len(recorded)


def _dimensions(document: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A document's own dimensions (without the sink's binding and service)."""
    names = document["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]
    return tuple(
        sorted((name, document[name]) for name in names if name not in ("binding", "service"))
    )


def test_sweep_with_a_nearly_expired_context_stops_before_fetching(
    handlers: Handlers, writer: Rhumbatron, lambda_env: Settings
) -> None:
    # GIVEN one published event on every stream
    projects = {index: _project_on_stream(index) for index in range(EVENT_STREAM_COUNT)}
    _create_projects(writer, handlers, list(projects.values()))

    # WHEN the tick arrives with less time left than one consume may take
    summary = handlers.sweep.lambda_handler(
        sample_event("sweep_schedule.json"), FakeLambdaContext(remaining_ms=1_000)
    )

    # THEN no subscription fetched, nothing was archived, and it says the time ran out
    assert summary["out_of_time"] is True
    assert all(counts["consumes"] == 0 for counts in summary["subscriptions"].values())
    assert summary["archive_objects"] == []
    assert _view_name(lambda_env, projects[summary["stream_index"]]) is None
    # AND the lag is still recorded: the stream's consumers still owe its event
    assert len(summary["lags"]) == EVENT_STREAM_COUNT * 5
    assert all(lag["num_pending"] == 1 for lag in summary["lags"])


@pytest.mark.parametrize(
    ("event", "names"),
    [
        ({"source": "schedule", "job": "fire_due_alarms"}, ["'job'", "'fire_due_alarms'"]),
        ({"source": "cron", "job": "sweep"}, ["'source'", "'cron'"]),
        ({"source": "schedule"}, ["'job' is missing"]),
        ({"source": "schedule", "job": "sweep", "now": "04:17"}, ["'now'", "'04:17'"]),
        ({"streamIndex": 3}, ["'source' is missing", "'job' is missing", "'streamIndex'=3"]),
        ("sweep", ["JSON object", "str"]),
    ],
)
def test_bad_sweep_event_is_refused_naming_the_field_and_value(
    handlers: Handlers, event: Any, names: list[str]
) -> None:
    with pytest.raises(EnvelopeError) as refused:
        handlers.sweep.lambda_handler(event, FakeLambdaContext())
    message = str(refused.value)
    for name in names:
        assert name in message
    assert '{"source": "schedule", "job": "sweep"}' in message


# -- the sample events -----------------------------------------------------------------------


def test_sample_events_are_what_the_entrypoints_accept() -> None:
    nudge = router_nudge.parse_invocation(sample_event("router_nudge.json"))
    assert nudge == router_nudge.NudgeRouter(streamIndex=3)
    assert nudge.stream_index == 3
    schedule = sweep.parse_invocation(sample_event("sweep_schedule.json"))
    assert schedule == sweep.ScheduledSweep(source="schedule", job="sweep")


def test_sweep_drains_the_dead_letter_queue_into_dead_letters(
    handlers: Handlers, writer: Rhumbatron, lambda_env: Settings
) -> None:
    # GIVEN a command that another role moved to the dead-letter queue after its retries
    command = Command.create(
        command_id="cmd_demo_sweep_letter",
        command_type="forks.sweep",
        project_id="acme-web",
        created_at=datetime.now(UTC),
        payload={},
    )

    async def dead_letter() -> None:
        bus = await writer.command_bus()
        await writer.ensure_streams()
        await bus.send(
            "dead-letter",
            command,
            headers={ORIGIN_QUEUE_HEADER: "integration", LAST_ERROR_HEADER: "boom"},
        )
        await writer.close()

    asyncio.run(dead_letter())

    # WHEN the sweep runs (the router's role also consumes the dead-letter queue)
    summary = handlers.sweep.lambda_handler(
        sample_event("sweep_schedule.json"), FakeLambdaContext()
    )

    # THEN the command is one open dead letter
    assert summary["dead_letter_queue"]["recorded"] == 1
    product = sqlite3.connect(lambda_env.state_dir / "product.sqlite")
    rows = product.execute("SELECT command_id, queue, status FROM dead_letters").fetchall()
    assert rows == [("cmd_demo_sweep_letter", "integration", "open")]
