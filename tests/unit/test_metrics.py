"""Platform metrics (spec, analytics-projector): lifecycle Events map to metric names, one
EVENT_METRICS point per fresh Event, other modules write METRICS, both land in
platform_metrics; in Lambda the points also go out as CloudWatch EMF lines."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import rhumbatron.metrics as metrics_package
from rhumbatron.actors.storage import SqliteStore, open_database
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import ActorError
from rhumbatron.metrics import (
    ANALYTICS_METRICS,
    CLOUDWATCH_UNITS,
    EVENT_METRICS_PER_TICK,
    MAX_DIMENSIONS,
    PLATFORM_METRICS_SCHEMA,
    DataPoint,
    EmfSink,
    MetricBinding,
    MetricsRecorder,
    RecordingSink,
    analytics_point,
    metric_counts,
    recent_points,
    record_event_points,
    write_points,
)
from rhumbatron.metrics.emf import MAX_HOLD_S
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.event_types import EVENT_TYPES
from rhumbatron.protocol.ids import stable_event_id

SNAKE_CASE = r"^[a-z][a-z0-9_]{0,62}$"
NOW_S = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


def make_event(event_type: str, payload: dict[str, Any], *, task_id: str = "tsk-1") -> Event:
    """A valid Event of ``event_type`` in project acme-web, change chg-1."""
    return Event.create(
        event_id=stable_event_id("chg-1", event_type, task_id),
        event_type=event_type,
        event_version=1,
        tenant_id="acme",
        project_id="acme-web",
        change_id="chg-1",
        task_id=task_id,
        actor="agent:builder-1",
        correlation_id="corr-1",
        timestamp=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        payload=payload,
    )


def task_completed(task_id: str = "tsk-1") -> Event:
    return make_event("task.completed", {"agentId": "builder-1"}, task_id=task_id)


def metrics_file(path: Path) -> sqlite3.Connection:
    """A real SQLite file with the platform_metrics schema, in autocommit mode."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.executescript(PLATFORM_METRICS_SCHEMA)
    return connection


def rows(connection: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in connection.execute(
            "SELECT binding, name, value, unit, dimensions, event_id, project_id, recorded_at_s "
            "FROM platform_metrics ORDER BY id"
        )
    ]


# --------------------------------------------------------------------------- the mapping


def test_every_mapped_event_type_is_registered_and_named_in_snake_case() -> None:
    # GIVEN the analytics mapping
    # WHEN each entry is checked against the closed registry
    # THEN every key is a registered Event type and every metric name is snake_case
    assert set(ANALYTICS_METRICS) <= set(EVENT_TYPES)
    for event_type, metric in ANALYTICS_METRICS.items():
        assert re.match(SNAKE_CASE, metric), (event_type, metric)
    # AND no two Event types share a metric name (each count means one thing)
    assert len(set(ANALYTICS_METRICS.values())) == len(ANALYTICS_METRICS)


def test_the_spec_metric_families_are_all_mapped() -> None:
    # GIVEN the metric names the spec lists for the analytics projector
    # WHEN the mapping is read
    # THEN the named ones are there, from the Event types that carry them
    assert ANALYTICS_METRICS["change.created"] == "change_created"
    assert ANALYTICS_METRICS["agent.woke"] == "agent_wakeup"
    assert ANALYTICS_METRICS["model.routed"] == "model_route"
    assert ANALYTICS_METRICS["release.completed"] == "release_completed"
    # AND every registered task.*, candidate.* and promotion.* type maps to <subject>_<verb>
    for family in ("task", "candidate", "promotion"):
        members = [name for name in EVENT_TYPES if name.startswith(family + ".")]
        assert members, family
        for event_type in members:
            assert ANALYTICS_METRICS[event_type] == event_type.replace(".", "_")


def test_analytics_point_counts_one_per_mapped_event() -> None:
    # GIVEN a task.completed Event
    event = task_completed()
    # WHEN its analytics point is built
    point = analytics_point(event)
    # THEN it is a count of 1 for task_completed, keyed by the Event, dimensioned by type
    # only (a project dimension would make one CloudWatch metric per project), with the
    # project in its own column
    assert point == DataPoint(
        name="task_completed",
        value=1.0,
        unit="Count",
        dimensions={"event_type": "task.completed"},
        event_id=event.event_id,
        project_id="acme-web",
    )


def test_analytics_point_is_none_for_an_unmapped_event() -> None:
    # GIVEN an intermediate state move, informational and not a counted lifecycle step
    event = make_event("change.status_changed", {"fromStatus": "planned", "toStatus": "verifying"})
    assert event.spec.informational
    # WHEN its analytics point is built
    # THEN there is none
    assert analytics_point(event) is None


# --------------------------------------------------------------------------- platform_metrics


def test_writing_the_same_events_point_twice_leaves_one_row(tmp_path: Path) -> None:
    # GIVEN a metrics file and the analytics points of two distinct Events
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    first, second = (analytics_point(task_completed(task)) for task in ("tsk-1", "tsk-2"))
    assert first is not None and second is not None
    # WHEN the first is written, then both are written (a redelivery plus a fresh Event)
    written_once = write_points(connection, MetricBinding.EVENT_METRICS, [first], now_s=NOW_S)
    written_again = write_points(
        connection, MetricBinding.EVENT_METRICS, [first, second, second], now_s=NOW_S + 1
    )
    # THEN each Event has exactly one row and the returns count only new rows
    assert (written_once, written_again) == (1, 1)
    assert metric_counts(connection) == {"task_completed": 2}
    assert [row[5] for row in rows(connection)] == [first.event_id, second.event_id]


def test_points_without_an_event_id_always_append(tmp_path: Path) -> None:
    # GIVEN a METRICS point with no Event behind it
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    point = DataPoint("outbox_published", 3, dimensions={"stream": "events-00"})
    # WHEN it is written twice
    counts = [write_points(connection, MetricBinding.METRICS, [point], now_s=NOW_S) for _ in "ab"]
    # THEN both are kept: only Event-keyed points are deduplicated
    assert counts == [1, 1]
    assert metric_counts(connection) == {"outbox_published": 2}


def test_both_bindings_land_in_platform_metrics_with_their_binding(tmp_path: Path) -> None:
    # GIVEN an Event's analytics point and a module's own point about the same Event
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    event_point = analytics_point(task_completed())
    assert event_point is not None
    module_point = DataPoint(
        "task_completed", 1, dimensions={"agent": "builder-1"}, event_id=event_point.event_id
    )
    # WHEN each binding writes its point
    write_points(connection, MetricBinding.EVENT_METRICS, [event_point], now_s=NOW_S)
    write_points(connection, MetricBinding.METRICS, [module_point], now_s=NOW_S + 2)
    # THEN both rows are in platform_metrics, each with its binding (dedupe is per binding)
    # and canonical JSON dimensions with sorted keys
    assert rows(connection) == [
        (
            "EVENT_METRICS",
            "task_completed",
            1.0,
            "Count",
            '{"event_type":"task.completed"}',
            event_point.event_id,
            "acme-web",
            NOW_S,
        ),
        (
            "METRICS",
            "task_completed",
            1.0,
            "Count",
            '{"agent":"builder-1"}',
            event_point.event_id,
            None,
            NOW_S + 2,
        ),
    ]
    assert metric_counts(connection, MetricBinding.METRICS) == {"task_completed": 1}


def test_a_binding_outside_the_two_is_refused_by_the_table(tmp_path: Path) -> None:
    # GIVEN a metrics file
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    # WHEN a row with a third binding is inserted directly
    # THEN the CHECK constraint refuses it
    with pytest.raises(sqlite3.IntegrityError):
        connection.execute(
            "INSERT INTO platform_metrics (binding, name, value, unit, dimensions, recorded_at_s) "
            "VALUES ('OTHER', 'x', 1, 'Count', '{}', 0)"
        )


def test_the_schema_runs_inside_a_larger_transaction_script(tmp_path: Path) -> None:
    # GIVEN an actor-style script that wraps its own tables in BEGIN … COMMIT
    connection = sqlite3.connect(tmp_path / "metrics.sqlite3", isolation_level=None)
    script = "BEGIN;\nCREATE TABLE IF NOT EXISTS other (x);\n" + PLATFORM_METRICS_SCHEMA + "COMMIT;"
    # WHEN it runs twice (IF NOT EXISTS makes the second a no-op)
    connection.executescript(script)
    connection.executescript(script)
    # THEN the table and both indexes exist
    names = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert {"platform_metrics", "platform_metrics_event", "platform_metrics_name_time"} <= names
    assert not connection.in_transaction


def test_recent_points_returns_the_newest_first(tmp_path: Path) -> None:
    # GIVEN three points of one metric written at increasing times, and one of another
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    for offset, value in enumerate((10.0, 20.0, 30.0)):
        write_points(
            connection,
            MetricBinding.METRICS,
            [DataPoint("publish_ms", value, "Milliseconds", {"stream": "events-01"})],
            now_s=NOW_S + offset,
        )
    write_points(connection, MetricBinding.METRICS, [DataPoint("other")], now_s=NOW_S + 9)
    # WHEN the two newest are read
    newest = recent_points(connection, "publish_ms", limit=2)
    # THEN they come newest first, with their dimensions decoded
    assert [(p.value, p.recorded_at_s) for p in newest] == [(30.0, NOW_S + 2), (20.0, NOW_S + 1)]
    assert dict(newest[0].dimensions) == {"stream": "events-01"}
    assert newest[0].binding is MetricBinding.METRICS
    assert newest[0].unit == "Milliseconds"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", ["TaskCompleted", "task-completed", "1task", "", "a" * 64])
def test_a_bad_metric_name_is_rejected_naming_it(name: str) -> None:
    # GIVEN a metric name that is not snake_case
    # WHEN a point is built with it
    # THEN a ValueError names the value
    with pytest.raises(ValueError, match="metric name") as caught:
        DataPoint(name)
    assert repr(name) in str(caught.value)


def test_an_unknown_unit_is_rejected_naming_it() -> None:
    # GIVEN a unit CloudWatch does not know
    # WHEN a point is built with it
    # THEN a ValueError names the unit and lists the valid ones
    with pytest.raises(ValueError, match=r"unit 'Parsecs' is not a CloudWatch unit.*Count"):
        DataPoint("distance", 1, "Parsecs")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"value": float("nan")}, "not finite"),
        ({"value": "1"}, "not a number"),
        ({"dimensions": {"stream": ""}}, "non-empty strings"),
        ({"dimensions": {"binding": "x"}}, "reserved"),
        ({"dimensions": {"latency": "x"}}, "metric's own name"),
        ({"dimensions": {f"d{i}": "x" for i in range(MAX_DIMENSIONS + 1)}}, "exceed the 27"),
        ({"event_id": ""}, "event_id"),
    ],
)
def test_a_malformed_point_is_rejected(fields: dict[str, Any], fragment: str) -> None:
    # GIVEN a point field CloudWatch or the table could not take
    # WHEN the point is built
    # THEN a ValueError says what was wrong
    with pytest.raises(ValueError, match=fragment):
        DataPoint("latency", **fields)


def test_cloudwatch_units_match_powertools_metric_units() -> None:
    # GIVEN the unit list points are validated against
    from aws_lambda_powertools.metrics import MetricUnit

    # WHEN compared with powertools' list
    # THEN they are the same, so every valid point can be emitted
    assert {unit.value for unit in MetricUnit} == CLOUDWATCH_UNITS


def test_a_point_keeps_its_own_copy_of_the_dimensions() -> None:
    # GIVEN a point built from a dict
    dimensions = {"stream": "events-01"}
    point = DataPoint("publish_ms", 1, "Milliseconds", dimensions)
    # WHEN the caller changes the dict afterwards
    dimensions["stream"] = "events-02"
    # THEN the point is unchanged and cannot be changed through its mapping
    assert point.dimensions == {"stream": "events-01"}
    with pytest.raises(TypeError):
        point.dimensions["stream"] = "x"  # type: ignore[index]


# --------------------------------------------------------------------------- EMF


def test_emf_sink_writes_one_valid_emf_document_per_dimension_set_at_flush() -> None:
    # GIVEN an EMF sink writing to a captured stream, and two points with different dimensions
    stream = io.StringIO()
    sink = EmfSink(stream=stream)
    points = [
        DataPoint("task_completed", 1, dimensions={"project_id": "acme-web"}),
        DataPoint("publish_ms", 12.5, "Milliseconds", {"stream": "events-03"}),
    ]
    # WHEN they are emitted under EVENT_METRICS
    sink.emit(MetricBinding.EVENT_METRICS, points)
    # THEN nothing is written until the flush (the end of the invocation)
    assert stream.getvalue() == ""
    sink.flush()
    # AND then there is one JSON line per dimension set
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    # AND each is an EMF document: namespace, metric definition, value, dimensions
    directive = first["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "Rhumbatron"
    assert directive["Metrics"] == [{"Name": "task_completed", "Unit": "Count"}]
    assert sorted(directive["Dimensions"][0]) == ["binding", "project_id", "service"]
    assert isinstance(first["_aws"]["Timestamp"], int)
    assert first["task_completed"] == [1.0]
    assert (first["project_id"], first["binding"], first["service"]) == (
        "acme-web",
        "EVENT_METRICS",
        "rhumbatron",
    )
    # AND the second line carries only its own dimensions
    assert second["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [
        {"Name": "publish_ms", "Unit": "Milliseconds"}
    ]
    assert second["publish_ms"] == [12.5]
    assert second["stream"] == "events-03"
    assert "project_id" not in second
    # AND a second flush writes nothing more
    sink.flush()
    assert len(stream.getvalue().splitlines()) == 2


def test_emf_sink_gathers_the_points_of_one_dimension_set_into_one_document() -> None:
    # GIVEN points of two metrics on one dimension set, emitted in three batches and under
    # two bindings, and one point of another dimension set in between
    stream = io.StringIO()
    sink = EmfSink(stream=stream)
    lag = {"stream": "events-03", "consumer": "causal-router"}
    sink.emit(MetricBinding.METRICS, [DataPoint("consumer_num_pending", 4, dimensions=lag)])
    sink.emit(MetricBinding.METRICS, [DataPoint("outbox_pending", 7)])
    sink.emit(
        MetricBinding.METRICS,
        [
            DataPoint("consumer_num_ack_pending", 1, dimensions=lag),
            DataPoint("consumer_num_pending", 2, dimensions=lag),
        ],
    )
    sink.emit(MetricBinding.EVENT_METRICS, [DataPoint("consumer_num_pending", 9, dimensions=lag)])
    # WHEN the invocation ends
    sink.flush()
    # THEN there is one document per (binding, dimension set), in the order they first came
    documents = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(d["binding"], d.get("consumer")) for d in documents] == [
        ("METRICS", "causal-router"),
        ("METRICS", None),
        ("EVENT_METRICS", "causal-router"),
    ]
    # AND each metric is defined once, its points' values in order as its array (each value
    # one CloudWatch sample, so sums and maxima are the points')
    lagged = documents[0]
    assert lagged["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [
        {"Name": "consumer_num_pending", "Unit": "Count"},
        {"Name": "consumer_num_ack_pending", "Unit": "Count"},
    ]
    assert lagged["consumer_num_pending"] == [4.0, 2.0]
    assert lagged["consumer_num_ack_pending"] == [1.0]
    assert documents[1]["outbox_pending"] == [7.0]
    assert documents[2]["consumer_num_pending"] == [9.0]


def test_emf_sink_writes_what_it_held_a_minute_before_gathering_more() -> None:
    # GIVEN a sink on a clock the test moves (a long invocation: a queue function's lasts up to
    #   15 minutes, and one killed at its timeout never reaches its flush)
    stream = io.StringIO()
    now = [0.0]
    sink = EmfSink(stream=stream, monotonic=lambda: now[0])
    sink.emit(MetricBinding.METRICS, [DataPoint("outbox_pending", 1)])
    now[0] = 30.0
    sink.emit(MetricBinding.METRICS, [DataPoint("outbox_pending", 2)])
    held = stream.getvalue()
    # WHEN a point comes a minute after the first one held
    now[0] = 60.0
    sink.emit(MetricBinding.METRICS, [DataPoint("outbox_pending", 3)])
    # THEN the points held so far were written first, and the new one waits for the next
    assert held == ""
    assert [json.loads(line)["outbox_pending"] for line in stream.getvalue().splitlines()] == [
        [1.0, 2.0]
    ]
    sink.flush()
    assert [json.loads(line)["outbox_pending"] for line in stream.getvalue().splitlines()] == [
        [1.0, 2.0],
        [3.0],
    ]
    assert MAX_HOLD_S == 60.0


def test_emf_sink_starts_a_new_document_at_emfs_limits() -> None:
    # GIVEN 250 points of one metric and 150 metrics of one point, on one dimension set
    stream = io.StringIO()
    sink = EmfSink(stream=stream)
    sink.emit(MetricBinding.METRICS, [DataPoint("sample", float(i)) for i in range(250)])
    sink.emit(MetricBinding.EVENT_METRICS, [DataPoint(f"m{i:03d}") for i in range(150)])
    # WHEN they are flushed
    sink.flush()
    documents = [json.loads(line) for line in stream.getvalue().splitlines()]
    # THEN no document holds more than 100 values of a metric, nor more than 100 metrics
    samples = [d["sample"] for d in documents if "sample" in d]
    assert [len(values) for values in samples] == [100, 100, 50]
    assert [v for values in samples for v in values] == [float(i) for i in range(250)]
    wide = [d for d in documents if d["binding"] == "EVENT_METRICS"]
    assert [len(d["_aws"]["CloudWatchMetrics"][0]["Metrics"]) for d in wide] == [100, 50]


def test_emf_sink_writes_to_stdout_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an EMF sink with its own namespace and no stream (as in Lambda)
    sink = EmfSink(namespace="RhumbatronTest", service="router")
    # WHEN a METRICS point is emitted and the invocation ends
    sink.emit(MetricBinding.METRICS, [DataPoint("sweep_runs")])
    sink.flush()
    # THEN the EMF line is on stdout, where Lambda's log forwarding picks it up
    document = json.loads(capsys.readouterr().out)
    assert document["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "RhumbatronTest"
    assert (document["service"], document["binding"]) == ("router", "METRICS")


def test_emf_sink_takes_a_point_with_the_most_dimensions_allowed() -> None:
    # GIVEN a point with as many dimensions as a point may carry
    stream = io.StringIO()
    point = DataPoint("wide", dimensions={f"d{i:02d}": "x" for i in range(MAX_DIMENSIONS)})
    # WHEN it is emitted
    sink = EmfSink(stream=stream)
    sink.emit(MetricBinding.METRICS, [point])
    sink.flush()
    # THEN powertools accepts it with binding and service added
    document = json.loads(stream.getvalue())
    assert len(document["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]) == MAX_DIMENSIONS + 2


def test_emf_sink_with_no_points_writes_nothing() -> None:
    # GIVEN an EMF sink
    stream = io.StringIO()
    sink = EmfSink(stream=stream)
    # WHEN an empty batch is emitted and flushed
    sink.emit(MetricBinding.METRICS, [])
    sink.flush()
    # THEN nothing is written (EMF refuses a document without metrics)
    assert stream.getvalue() == ""


# --------------------------------------------------------------------------- the recorder


@pytest.fixture
def metrics_db(tmp_path: Path, offline_settings: Settings) -> sqlite3.Connection:
    """The metrics file opened as production opens actor files, schema created."""
    connection = open_database(tmp_path / "state" / "metrics.sqlite3", offline_settings)
    connection.executescript(PLATFORM_METRICS_SCHEMA)
    return connection


def test_recorder_writes_rows_then_emits_them(metrics_db: sqlite3.Connection) -> None:
    # GIVEN a recorder on a metrics file with a recording sink
    clock = ManualClock()
    sink = RecordingSink()
    recorder = MetricsRecorder(metrics_db, sink, clock)
    # WHEN a module records two points
    clock.advance(5)
    written = recorder.record([DataPoint("nudge_sent"), DataPoint("publish_ms", 4, "Milliseconds")])
    # THEN both are committed as METRICS rows at the clock's time, and emitted once
    assert written == 2
    assert not metrics_db.in_transaction
    assert metric_counts(metrics_db, MetricBinding.METRICS) == {"nudge_sent": 1, "publish_ms": 1}
    assert {row[7] for row in rows(metrics_db)} == {clock.now().timestamp()}
    assert [point.name for point in sink.points(MetricBinding.METRICS)] == [
        "nudge_sent",
        "publish_ms",
    ]


def test_record_one_takes_dimensions_as_keywords(metrics_db: sqlite3.Connection) -> None:
    # GIVEN a recorder
    sink = RecordingSink()
    recorder = MetricsRecorder(metrics_db, sink, ManualClock())
    # WHEN one point is recorded with keyword dimensions
    written = recorder.record_one("alarm_fired", 1, actor="project_root")
    # THEN it is stored and emitted with them
    assert written == 1
    assert sink.points() == [DataPoint("alarm_fired", 1, dimensions={"actor": "project_root"})]
    assert recent_points(metrics_db, "alarm_fired", 1)[0].dimensions == {"actor": "project_root"}


def test_recorder_does_not_emit_an_already_recorded_event_point_again(
    metrics_db: sqlite3.Connection,
) -> None:
    # GIVEN a point keyed by an Event, recorded once
    sink = RecordingSink()
    recorder = MetricsRecorder(metrics_db, sink, ManualClock())
    point = DataPoint("task_retried", event_id=task_completed().event_id)
    recorder.record([point])
    # WHEN the same point is recorded again (a retried handler)
    written = recorder.record([point])
    # THEN no row is added and nothing more is emitted
    assert written == 0
    assert metric_counts(metrics_db) == {"task_retried": 1}
    assert sink.points() == [point]


def test_a_failed_write_rolls_back_the_whole_batch_and_emits_nothing(
    metrics_db: sqlite3.Connection,
) -> None:
    # GIVEN a metrics file that refuses one metric half-way through a batch (a real trigger)
    metrics_db.execute(
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON platform_metrics WHEN NEW.name = 'boom' "
        "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
    )
    sink = RecordingSink()
    recorder = MetricsRecorder(metrics_db, sink, ManualClock())
    # WHEN a batch with a good point before the refused one is recorded
    with pytest.raises(ActorError, match="boom refused") as caught:
        recorder.record([DataPoint("fine"), DataPoint("boom")])
    # THEN the error names the file, the good point was rolled back too, and nothing was emitted
    assert "metrics.sqlite3" in str(caught.value)
    assert metric_counts(metrics_db) == {}
    assert sink.emitted == []
    assert not metrics_db.in_transaction


def test_a_dropped_table_fails_the_write_and_emits_nothing(metrics_db: sqlite3.Connection) -> None:
    # GIVEN a metrics file whose platform_metrics table is gone
    metrics_db.execute("DROP TABLE platform_metrics")
    sink = RecordingSink()
    recorder = MetricsRecorder(metrics_db, sink, ManualClock())
    # WHEN a point is recorded
    # THEN the write fails naming the missing table, and nothing is emitted
    with pytest.raises(ActorError, match="no such table: platform_metrics"):
        recorder.record_one("anything")
    assert sink.emitted == []
    assert not metrics_db.in_transaction


def test_a_read_only_file_fails_the_write_and_emits_nothing(tmp_path: Path) -> None:
    # GIVEN a metrics file opened read-only, through a factory the recorder calls lazily
    path = tmp_path / "metrics.sqlite3"
    metrics_file(path).close()
    opened: list[sqlite3.Connection] = []

    def read_only() -> sqlite3.Connection:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        opened.append(connection)
        return connection

    sink = RecordingSink()
    recorder = MetricsRecorder(read_only, sink, ManualClock())
    assert opened == []  # nothing opened at construction
    # WHEN a point is recorded
    # THEN the write fails as read-only, is rolled back, and nothing is emitted
    with pytest.raises(ActorError, match="readonly"):
        recorder.record_one("anything")
    assert sink.emitted == []
    assert len(opened) == 1 and not opened[0].in_transaction
    recorder.close()
    assert metric_counts(metrics_file(path)) == {}


# --------------------------------------------------------------------------- analytics path


def test_record_event_points_writes_inside_the_callers_transaction(tmp_path: Path) -> None:
    # GIVEN a projector transaction with one Event already counted and a fresh one
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    old, fresh = (analytics_point(task_completed(task)) for task in ("tsk-1", "tsk-2"))
    assert old is not None and fresh is not None
    write_points(connection, MetricBinding.EVENT_METRICS, [old], now_s=NOW_S)
    sink = RecordingSink()
    connection.execute("BEGIN IMMEDIATE")
    # WHEN both points are written in the projector's transaction
    new_points = record_event_points(connection, [old, fresh], now_s=NOW_S + 1)
    # THEN only the fresh one is new, and the transaction is still the caller's to commit
    assert new_points == (fresh,)
    assert connection.in_transaction
    connection.execute("COMMIT")
    sink.emit(MetricBinding.EVENT_METRICS, new_points)
    assert metric_counts(connection, MetricBinding.EVENT_METRICS) == {"task_completed": 2}
    assert sink.points(MetricBinding.EVENT_METRICS) == [fresh]


def test_record_event_points_refuses_more_than_one_ticks_worth(tmp_path: Path) -> None:
    # GIVEN one point more than the spec's 100 per tick
    connection = metrics_file(tmp_path / "metrics.sqlite3")
    points = [DataPoint("task_ready", event_id=f"evt_{i:032x}") for i in range(101)]
    assert EVENT_METRICS_PER_TICK == 100
    # WHEN they are written as one tick
    # THEN the call is refused, naming the count and the cap, and nothing is written
    with pytest.raises(ValueError, match=r"101 EVENT_METRICS points.*cap of 100"):
        record_event_points(connection, points, now_s=NOW_S)
    assert metric_counts(connection) == {}


def test_the_public_api_is_exactly_all() -> None:
    # GIVEN the package's declared public names
    # WHEN each is looked up
    # THEN all exist, and every public module-level name imported is declared
    for name in metrics_package.__all__:
        assert hasattr(metrics_package, name), name
    public = {
        name
        for name, value in vars(metrics_package).items()
        if not name.startswith("_")
        and not isinstance(value, type(metrics_package))
        and name != "annotations"
    }
    assert public == set(metrics_package.__all__)


def test_a_recorder_on_a_store_waits_for_another_threads_transaction(tmp_path: Path) -> None:
    # GIVEN a recorder on a store whose one connection another thread holds in a transaction
    # (overlapping sweeps: one writes claims while another records its lag)
    settings = Settings(state_dir=tmp_path / "state")
    store = SqliteStore(tmp_path / "product.sqlite", settings, PLATFORM_METRICS_SCHEMA)
    sink = RecordingSink()
    recorder = MetricsRecorder(store, sink, ManualClock())
    holding, release = threading.Event(), threading.Event()
    recorded: list[int] = []
    failures: list[BaseException] = []

    def hold() -> None:
        with store.transaction():
            holding.set()
            release.wait(10)

    def record() -> None:
        try:
            recorded.append(recorder.record([DataPoint("consumer_num_pending", 3)]))
        except BaseException as exc:
            failures.append(exc)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    # WHEN the recorder records meanwhile, and the other transaction then commits
    writer = threading.Thread(target=record)
    writer.start()
    release.set()
    holder.join(10)
    writer.join(10)
    # THEN the record waited its turn and committed (it did not meet the open transaction)
    assert failures == [] and recorded == [1]
    assert [p.name for p in sink.points(MetricBinding.METRICS)] == ["consumer_num_pending"]
    store.close()
