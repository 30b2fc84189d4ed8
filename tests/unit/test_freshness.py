"""Freshness: the project-view projector measures commit-to-apply seconds per applied batch,
from the Events' own timestamps against the injected clock, and keeps them in memory until a
flush writes them (at most once a minute at a run's end; always at a sweep tick)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.metrics import MetricBinding, MetricsRecorder, RecordingSink, recent_points
from rhumbatron.product.database import ProductDatabase
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.router.freshness import (
    EVENT_FRESHNESS_METRIC,
    FreshnessGauge,
    freshness_gauge,
    freshness_point,
)
from rhumbatron.router.handlers import ProjectViewProjector, RunContext
from rhumbatron.router.records import Outcome, Record
from rhumbatron.runtime.product_schema import open_product_database

CALLER = Caller("acme", "system:test", correlation_id="corr-fresh")
T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
PROJECT = "acme-web"
STREAM = event_stream_name(stream_index(PROJECT))


def record(event: Event, seq: int) -> Record:
    # the projector reads only the event, its key and its stream sequence
    return Record(cast(Any, None), seq, event.event_id, event, None)


def events_at(*moments: datetime) -> list[Event]:
    return [
        FactContext(CALLER, PROJECT, moment).fact(
            "agent.woke", {"agentId": f"agent-{i}"}, change_id="chg-1", key=str(i)
        )
        for i, moment in enumerate(moments)
    ]


def run() -> RunContext:
    return RunContext(stream_index(PROJECT), now_s=0.0, apply_calls_left=10)


@pytest.fixture
def product(offline_settings: Settings) -> Iterator[ProductDatabase]:
    database = open_product_database(offline_settings)
    yield database
    database.close()


async def test_an_event_applied_seven_seconds_after_its_commit_records_seven_seconds(
    offline_settings: Settings, product: ProductDatabase
) -> None:
    # GIVEN an Event committed at T, and the router's clock at T + 7 s
    clock = ManualClock(T)
    (event,) = events_at(T)
    clock.advance(7)
    sink = RecordingSink()
    gauge = freshness_gauge(product, sink, clock, flush_interval_s=60.0)
    projector = ProjectViewProjector(offline_settings, freshness=gauge)
    try:
        # WHEN the projector applies it, and the run's end flushes the gauge
        outcomes = await projector.handle([record(event, 1)], run())
        gauge.flush()
    finally:
        projector.close()

    # THEN it applied, and one event_freshness_s point of 7 s for its stream was recorded
    # (a METRICS row) and emitted
    assert outcomes[event.event_id].outcome is Outcome.APPLIED
    (point,) = sink.points(MetricBinding.METRICS)
    assert (point.name, point.value, point.unit) == (EVENT_FRESHNESS_METRIC, 7.0, "Seconds")
    assert dict(point.dimensions) == {"stream": STREAM}
    (stored,) = recent_points(product.connection, EVENT_FRESHNESS_METRIC)
    assert stored.value == 7.0


async def test_a_batch_records_one_point_its_oldest_event_and_a_redelivery_records_none(
    offline_settings: Settings, product: ProductDatabase
) -> None:
    # GIVEN three Events committed 30 s, 12 s and 2 s before the clock
    clock = ManualClock(T + timedelta(seconds=30))
    events = events_at(T, T + timedelta(seconds=18), T + timedelta(seconds=28))
    sink = RecordingSink()
    recorder = MetricsRecorder(product.connection, sink, clock)
    gauge = FreshnessGauge(recorder, clock)
    projector = ProjectViewProjector(offline_settings, freshness=gauge)
    records = [record(event, seq) for seq, event in enumerate(events, start=1)]
    try:
        # WHEN they are applied in one batch, then delivered again, each run flushing
        await projector.handle(records, run())
        gauge.flush(force=True)
        again = await projector.handle(records, run())
        gauge.flush(force=True)
    finally:
        projector.close()

    # THEN one point, the batch's maximum; the redelivery applied nothing and recorded nothing
    assert [p.value for p in sink.points()] == [30.0]
    assert {o.outcome for o in again.values()} == {Outcome.DUPLICATE}


async def test_a_projector_without_a_gauge_applies_as_before(offline_settings: Settings) -> None:
    # GIVEN a projector built as before freshness existed
    (event,) = events_at(T)
    projector = ProjectViewProjector(offline_settings)
    try:
        # WHEN it applies an Event
        outcomes = await projector.handle([record(event, 1)], run())
    finally:
        projector.close()
    # THEN the Event is applied
    assert outcomes[event.event_id].outcome is Outcome.APPLIED


async def test_points_stay_in_memory_and_a_flush_writes_them_at_most_once_a_minute(
    offline_settings: Settings, product: ProductDatabase
) -> None:
    # GIVEN a gauge that flushed a moment ago, at T
    clock = ManualClock(T)
    sink = RecordingSink()
    gauge = FreshnessGauge(MetricsRecorder(product.connection, sink, clock), clock)
    (first,) = events_at(T - timedelta(seconds=5))
    gauge.observe(STREAM, [first])
    assert [p.value for p in gauge.flush()] == [5.0]

    # WHEN batches 2 s, 9 s and 4 s old are applied within the minute, and runs end
    clock.advance(30)
    gauge.observe(STREAM, events_at(T + timedelta(seconds=28)))
    gauge.observe(STREAM, events_at(T + timedelta(seconds=21)))
    gauge.observe(STREAM, events_at(T + timedelta(seconds=26)))
    asked_early = gauge.flush_due()
    early = gauge.flush()
    clock.advance(30)
    asked_due = gauge.flush_due()
    due = gauge.flush()

    # THEN nothing is written before the minute is up; then one point: the largest age, as
    # measured when its batch was applied, not the last batch's
    assert early == []
    assert [p.value for p in due] == [9.0]
    assert [p.value for p in sink.points()] == [5.0, 9.0]
    # AND the gauge says so before a flush is tried (a nudge then skips the flush's thread)
    assert (asked_early, asked_due) == (False, True)
    # AND a forced flush (the sweep's) with nothing kept writes nothing, and is not due
    assert not gauge.flush_due(force=True)
    assert gauge.flush(force=True) == []
    gauge.observe(STREAM, events_at(T + timedelta(seconds=59)))
    assert not gauge.flush_due() and gauge.flush_due(force=True)


def test_points_that_cannot_be_written_are_logged_by_stream_and_dropped(
    product: ProductDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a gauge keeping the points of two streams, and a metrics table that refuses
    #   every write
    clock = ManualClock(T)
    sink = RecordingSink()
    gauge = FreshnessGauge(MetricsRecorder(product.connection, sink, clock), clock)
    gauge.observe(STREAM, events_at(T - timedelta(seconds=5)))
    gauge.observe(event_stream_name(7), events_at(T - timedelta(seconds=2)))
    product.connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON platform_metrics "
        "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    # WHEN a run's end flushes them
    with caplog.at_level(logging.WARNING, logger="rhumbatron.router.freshness"):
        written = gauge.flush(force=True)
    # THEN nothing was written or emitted, one warning names both streams and the error, and
    #   the points are dropped (a metric never turns an applied batch into a retry)
    assert (written, sink.points()) == ([], [])
    (warning,) = [r.getMessage() for r in caplog.records]
    streams = ", ".join(sorted([STREAM, event_stream_name(7)]))
    assert warning.startswith(f"freshness of {streams} not recorded: ")
    assert "cannot write METRICS rows" in warning and "(disk full)" in warning
    assert not gauge.flush_due(force=True)


def test_an_event_stamped_after_the_apply_time_counts_as_zero_seconds() -> None:
    # GIVEN an Event whose producer clock ran 3 s ahead of the router's
    (event,) = events_at(T + timedelta(seconds=3))
    # WHEN its freshness is measured at T
    point = freshness_point(STREAM, [event], T)
    # THEN it is 0 s, not negative; and no Events give no point
    assert point is not None and point.value == 0.0
    assert freshness_point(STREAM, [], T) is None
