"""The local span store: a span is kept in its own trace and in each touched Change's, and the
file keeps at most ``trace_spans_max_rows`` spans."""

from __future__ import annotations

from pathlib import Path

from rhumbatron.core.settings import load_settings
from rhumbatron.core.tracing import Span
from rhumbatron.metrics.trace_spans import SpanStore
from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id


def test_a_span_that_touched_a_change_is_kept_in_the_changes_trace_too(tmp_path: Path) -> None:
    store = SpanStore(load_settings(state_dir=tmp_path, trace_spans=True))
    request = Span(TraceContext.new(), "00f067aa0ba902b7", "api POST /x", 10.0, 10.5)
    request.touched.add(("p", "c"))
    store.record(request)
    assert [s.name for s in store.trace(request.context.trace_id)] == ["api POST /x"]
    kept = store.change("p", "c")
    assert [(s.trace_id, s.span_id, s.parent_id) for s in kept] == [
        (change_trace_id("p", "c"), request.context.span_id, "00f067aa0ba902b7")
    ]
    assert store.recent_changes() == [("p", "c")]
    store.close()


def test_the_store_keeps_at_most_its_row_limit_the_newest(tmp_path: Path) -> None:
    # GIVEN a store that keeps 100 spans, written 350 spans of one trace in small flushes
    settings = load_settings(state_dir=tmp_path, trace_spans=True, trace_spans_max_rows=100)
    store = SpanStore(settings, flush_rows=50)
    trace = TraceContext.new()
    for n in range(350):
        store.record(Span(trace.child(), None, f"span {n}", float(n), float(n) + 0.5))
    # THEN the file holds the newest 100
    names = [s.name for s in store.trace(trace.trace_id)]
    assert names == [f"span {n}" for n in range(250, 350)]
    store.close()
