"""W3C ``traceparent``: what is valid, what is absent, and the trace of a Change."""

from __future__ import annotations

import re

import pytest

from rhumbatron.core.log_context import correlated, current_correlation_id
from rhumbatron.core.tracing import current_span, span, traceparent_for
from rhumbatron.protocol.tracecontext import TraceContext, change_trace_id

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_parses_and_formats_back_to_itself() -> None:
    # WHEN the W3C specification's example is parsed
    context = TraceContext.parse(VALID)
    # THEN its parts are read, and it formats back to the same 55 characters
    assert context == TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")
    assert context.header == VALID


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        VALID.upper(),  # upper-case hex
        "01" + VALID[2:],  # another version
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace ID
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # all-zero parent ID
        VALID + "-extra",
        VALID[:-1],
        VALID.replace("-", "_"),
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    ],
)
def test_anything_else_is_absent_and_never_an_error(header: str | None) -> None:
    assert TraceContext.parse(header) is None


@pytest.mark.parametrize("flags", ["01", "00"], ids=["sampled", "not sampled"])
def test_a_child_keeps_the_trace_and_flags_with_a_new_span(flags: str) -> None:
    parent = TraceContext.parse(VALID[:-2] + flags)
    assert parent is not None
    assert parent.flags == flags
    child = parent.child()
    assert (child.trace_id, child.flags) == (parent.trace_id, flags)
    assert child.span_id != parent.span_id and len(child.header) == 55


def test_a_new_trace_has_32_hex_digits_and_a_header_that_parses_back() -> None:
    context = TraceContext.new()
    assert re.fullmatch(r"[0-9a-f]{32}", context.trace_id)
    assert re.fullmatch(r"[0-9a-f]{16}", context.span_id)
    assert TraceContext.parse(context.header) == context


def test_a_changes_trace_id_is_the_sha256_of_project_and_change() -> None:
    # GIVEN the rule: the first 32 hex digits of SHA-256 over "project\x1fchange"
    import hashlib

    expected = hashlib.sha256(b"acme-web\x1fchg_0123").hexdigest()[:32]
    # THEN every process computes the same trace ID for the Change, and another for another
    assert change_trace_id("acme-web", "chg_0123") == expected
    assert change_trace_id("acme-web", "chg_0124") != expected
    assert change_trace_id("acme-shop", "chg_0123") != expected


def test_what_is_about_a_change_is_stamped_with_its_trace_under_the_span_in_progress() -> None:
    trace = change_trace_id("p", "c")
    # GIVEN no span in progress: a Change's row gets its trace and a fresh parent; others none
    outside = TraceContext.parse(traceparent_for("p", "c"))
    assert outside is not None and outside.trace_id == trace
    assert traceparent_for("p", None) is None
    # GIVEN a span of another trace (an API request)
    with span("api POST /x", parent=TraceContext.parse(VALID)) as request:
        # THEN a Change's row is in the Change's trace, its parent the request's span
        assert traceparent_for("p", "c") == f"00-{trace}-{request.context.span_id}-01"
        # AND a row of no Change carries the request's own position
        assert traceparent_for("p", None) == request.context.header
        # AND the span knows it touched the Change (it is recorded in its trace too)
        assert request.touched == {("p", "c")}
        assert request.parent_id == "00f067aa0ba902b7"
        assert request.context.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
        # GIVEN a span of the Change inside it: it is in the Change's trace, child of the request
        with span("handler", parent=request.context, project_id="p", change_id="c") as inner:
            assert inner.context.trace_id == trace
            assert inner.parent_id == request.context.span_id
            assert current_span() is inner
        assert current_span() is request
    assert current_span() is None


class _Subsegment:
    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}

    def put_annotation(self, key: str, value: str) -> None:
        self.annotations[key] = value


def test_a_span_about_a_change_annotates_the_xray_subsegment_only_where_xray_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    # GIVEN no X-Ray SDK loaded: a span about a Change annotates nothing, imports nothing
    monkeypatch.delitem(sys.modules, "aws_xray_sdk.core", raising=False)
    with span("handle agent.wake", project_id="p", change_id="c"):
        pass
    assert "aws_xray_sdk.core" not in sys.modules
    # GIVEN the SDK loaded (as Powertools Tracer loads it) with a subsegment open
    subsegment = _Subsegment()
    recorder = types.SimpleNamespace(
        current_subsegment=lambda: subsegment, current_segment=lambda: None
    )
    monkeypatch.setitem(
        sys.modules, "aws_xray_sdk.core", types.SimpleNamespace(xray_recorder=recorder)
    )
    # WHEN a span about a Change opens
    with span("handle agent.wake", project_id="p", change_id="c"):
        pass
    # THEN the subsegment carries the Change and its trace ID
    assert subsegment.annotations == {
        "change_id": "c",
        "change_trace_id": change_trace_id("p", "c"),
    }


def test_a_span_and_a_correlation_binding_are_entered_once_each() -> None:
    # A queue consumer opens one of each per command; one entered again (nested, or after
    # its end) would leave the wrong span or ID current, so it refuses, and leaves none behind
    opened = span("handle agent.wake", project_id="acme-web", change_id="chg-1")
    with opened as first:
        assert current_span() is first
        with pytest.raises(RuntimeError, match="entered once"):
            opened.__enter__()
        assert current_span() is first
    assert current_span() is None
    with pytest.raises(RuntimeError, match="entered once"):
        opened.__enter__()
    binding = correlated("cmd_1")
    with binding:
        with pytest.raises(RuntimeError, match="entered once"):
            binding.__enter__()
        assert current_correlation_id() == "cmd_1"
    assert current_correlation_id() is None
