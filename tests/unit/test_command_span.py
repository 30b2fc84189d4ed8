"""The span a queue handler works in (issue #20): named for the command's type, in its
Change's trace, child of the position its ``traceparent`` header names; and the headers an
outgoing message carries."""

from __future__ import annotations

from datetime import UTC, datetime

from rhumbatron.core.tracing import current_span
from rhumbatron.messaging.commands import command_span
from rhumbatron.messaging.sender import OutgoingMessage
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.tracecontext import change_trace_id

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def wake(change_id: str | None) -> Command:
    return Command.create(
        command_id="cmd_span_1",
        command_type="agent.wake",
        project_id="acme-web",
        change_id=change_id,
        created_at=datetime(2026, 12, 5, tzinfo=UTC),
        payload={"agentId": "agent-1", "reason": "task.ready"},
    )


def test_a_handlers_span_is_named_for_its_command_in_its_changes_trace_under_its_header() -> None:
    with command_span(wake("chg-1"), {"traceparent": PARENT}) as opened:
        assert current_span() is opened
    assert opened.name == "handle agent.wake"
    assert (opened.project_id, opened.change_id) == ("acme-web", "chg-1")
    assert opened.context.trace_id == change_trace_id("acme-web", "chg-1")
    assert opened.parent_id == "b7ad6b7169203331"


def test_a_command_of_no_change_stays_in_its_headers_trace_and_a_bad_header_is_no_parent() -> None:
    with command_span(wake(None), {"traceparent": PARENT}) as opened:
        pass
    assert (opened.context.trace_id, opened.parent_id) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
    )
    with command_span(wake(None), {"traceparent": "not a traceparent"}) as orphan:
        pass
    assert orphan.parent_id is None
    assert orphan.context.trace_id != "0af7651916cd43dd8448eb211c80319c"


def test_an_outgoing_message_carries_its_id_and_its_traceparent_under_their_wire_names() -> None:
    assert OutgoingMessage("events.03", "evt-1", b"{}").headers() == {"Nats-Msg-Id": "evt-1"}
    assert OutgoingMessage("events.03", "evt-1", b"{}", PARENT).headers() == {
        "Nats-Msg-Id": "evt-1",
        "traceparent": PARENT,
    }
