"""The span the router works an Event in: named for its subscription and the Event's type, in
its Change's trace, child of the position the record's ``traceparent`` header names; and the
headers read off a fetch's records."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from rhumbatron.core.tracing import current_span
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.tracecontext import change_trace_id
from rhumbatron.router.records import Record, event_span, record_traces

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NOW = datetime(2026, 12, 6, tzinfo=UTC)


def planned(change_id: str) -> Event:
    ctx = FactContext(Caller("acme", "system:test", "corr-span"), "acme-web", NOW)
    return ctx.fact("change.planned", {"taskIds": ["t1"]}, change_id=change_id)


def test_an_events_span_is_named_for_its_work_in_its_changes_trace_under_its_header() -> None:
    with event_span("route", planned("chg-1"), PARENT) as opened:
        assert current_span() is opened
    assert opened.name == "route change.planned"
    assert (opened.project_id, opened.change_id) == ("acme-web", "chg-1")
    assert opened.context.trace_id == change_trace_id("acme-web", "chg-1")
    assert opened.parent_id == "b7ad6b7169203331"
    # AND with no header it is a root of its Change's trace
    with event_span("route", planned("chg-1"), None) as root:
        pass
    assert (root.context.trace_id, root.parent_id) == (change_trace_id("acme-web", "chg-1"), None)


def test_the_traces_of_a_fetch_are_those_of_the_records_that_carry_a_header() -> None:
    def fetched(key: str, headers: dict[str, str] | None) -> Record:
        msg = cast(Any, SimpleNamespace(headers=headers))
        return Record(msg, 1, key, None, None)

    records = [
        fetched("e1", {"traceparent": PARENT, "Nats-Msg-Id": "e1"}),
        fetched("e2", {"Nats-Msg-Id": "e2"}),
        fetched("e3", None),
    ]
    assert record_traces(records) == {"e1": PARENT}
