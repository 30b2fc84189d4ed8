"""What a refused envelope says, word for word (STYLE 10: the field, the value, the rule).

The API's 422, a dead letter's reason and the router's poison record all quote these messages,
so each is pinned whole here: the field as the wire names it, the quoted value, pydantic's rule
with its "Value error, " prefix stripped, every problem in field order, and the envelope kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from rhumbatron.errors import EnvelopeError, UnknownTypeError
from rhumbatron.protocol.command_types import COMMAND_TYPES, command_type_spec
from rhumbatron.protocol.envelopes import Command, Event, format_timestamp
from rhumbatron.protocol.event_types import EVENT_TYPES, AgentWoke, event_type_spec
from rhumbatron.protocol.ids import resource_shard_index
from unit.test_envelopes import _DELETE, command_fields, event_wire


def refusal(build: Callable[[], object]) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as caught:
        build()
    return caught.value


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        pytest.param(
            event_wire(eventId=_DELETE, eventVersion=0),
            "invalid Event: eventId is missing; "
            "eventVersion=0: Input should be greater than or equal to 1",
            id="a missing field, then a bad one: both, in field order",
        ),
        pytest.param(
            event_wire(timestamp="2026-01-02T03:04:05"),
            "invalid Event: timestamp='2026-01-02T03:04:05': "
            "2026-01-02T03:04:05 has no timezone; timestamps must be UTC",
            id="a validator's own words, without pydantic's 'Value error, '",
        ),
        pytest.param(
            event_wire(eventVersion=2),
            "invalid Event: (envelope): eventVersion=2 but task.completed is version 1",
            id="a rule of the whole envelope names no field and quotes no input",
        ),
        pytest.param(
            event_wire(payload={"agentId": 5}),
            "invalid Event: payload: invalid task.completed payload: "
            "agentId=5: Input should be a valid string",
            id="a payload field, named inside its type's payload",
        ),
    ],
)
@pytest.mark.parametrize("encoded", [False, True], ids=["mapping", "wire bytes"])
def test_a_refused_event_names_each_field_its_value_and_its_rule(
    wire: dict[str, Any], message: str, encoded: bool
) -> None:
    # GIVEN an Event with a bad or missing field, as a mapping or as the wire's JSON bytes
    raw: dict[str, Any] | bytes = json.dumps(wire).encode() if encoded else wire
    # WHEN it is parsed
    error = refusal(lambda: Event.parse(raw))
    # THEN the message is exactly the problems, in the wire's names, and not an unknown type
    assert str(error) == message
    assert not isinstance(error, UnknownTypeError)


def test_an_unknown_type_hides_the_unreadable_payload_but_not_the_problems_after_it() -> None:
    # GIVEN an Event of an unknown type that also carries a field the envelope does not have
    wire = event_wire(eventType="task.nope", bogus=1)
    # WHEN it is parsed
    error = refusal(lambda: Event.parse(wire))
    # THEN it is an unknown type, the payload (unreadable without its type) is not reported,
    # and the stray field after it still is
    assert isinstance(error, UnknownTypeError)
    assert str(error) == (
        "invalid Event: eventType='task.nope': unknown event type; EVENT_TYPES is closed: "
        + ", ".join(sorted(EVENT_TYPES))
        + "; bogus=1: Extra inputs are not permitted"
    )


def test_an_unknown_command_type_is_an_unknown_type_error_listing_the_known_ones() -> None:
    error = refusal(lambda: Command.create(**command_fields(command_type="agent.nope")))
    assert isinstance(error, UnknownTypeError)
    assert str(error) == (
        "invalid Command: commandType='agent.nope': unknown command type; "
        "COMMAND_TYPES is closed: " + ", ".join(sorted(COMMAND_TYPES))
    )


def test_a_refused_command_is_named_a_command() -> None:
    error = refusal(lambda: Command.create(**command_fields(attempt=0)))
    assert str(error) == "invalid Command: attempt=0: Input should be greater than or equal to 1"
    assert not isinstance(error, UnknownTypeError)


def test_an_event_built_from_python_values_is_refused_as_an_event() -> None:
    error = refusal(lambda: Event.create(**{**_python_event(), "event_version": 0}))
    assert str(error) == "invalid Event: eventVersion=0: Input should be greater than or equal to 1"


def test_a_payload_of_another_type_names_both_types() -> None:
    # GIVEN a task.completed Event handed an agent.woke payload object
    fields = {**_python_event(), "payload": AgentWoke(agent_id="builder-1")}
    # WHEN it is built
    error = refusal(lambda: Event.create(**fields))
    # THEN the message names the payload's class and the one the type takes
    assert str(error) == (
        "invalid Event: payload: payload is a AgentWoke, but task.completed takes TaskCompleted"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b"{not json",
            "invalid Event: not JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1))",
        ),
        (
            b"\xff",
            "invalid Event: not JSON ('utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte)",
        ),
        (b"[1]", "invalid Event: expected a JSON object, got list"),
        ("42", "invalid Event: expected a JSON object, got int"),
    ],
)
def test_a_body_that_is_not_a_json_object_says_what_it_is(raw: bytes | str, message: str) -> None:
    error = refusal(lambda: Event.parse(raw))
    assert str(error) == message


def test_the_registries_name_an_unknown_type_and_every_known_one() -> None:
    with pytest.raises(UnknownTypeError) as event_error:
        event_type_spec("task.nope")
    assert str(event_error.value) == (
        "unknown event type 'task.nope': EVENT_TYPES is closed; use one of "
        + ", ".join(sorted(EVENT_TYPES))
    )
    with pytest.raises(UnknownTypeError) as command_error:
        command_type_spec("agent.nope")
    assert str(command_error.value) == (
        "unknown command type 'agent.nope': COMMAND_TYPES is closed; use one of "
        + ", ".join(sorted(COMMAND_TYPES))
    )


def test_a_moment_with_no_utc_equivalent_is_refused_naming_it() -> None:
    # GIVEN the first moment of year 1 east of Greenwich: in UTC it falls in year 0
    moment = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    # WHEN an Event carries it
    error = refusal(lambda: Event.create(**{**_python_event(), "timestamp": moment}))
    # THEN the message quotes the moment and says why
    assert "0001-01-01T00:00:00+05:00 has no UTC equivalent in range" in str(error)


@pytest.mark.usefixtures("local_time_far_from_utc")
def test_the_wire_timestamp_is_utc_whatever_the_hosts_time_zone() -> None:
    # GIVEN a moment 2 hours east of UTC, on a host whose local time is 5 hours west of it
    moment = datetime(2026, 1, 2, 5, 4, 5, 678_999, tzinfo=timezone(timedelta(hours=2)))
    # WHEN it is written for the wire
    # THEN it is the UTC moment, truncated to milliseconds, with Z
    assert format_timestamp(moment) == "2026-01-02T03:04:05.678Z"


def test_a_single_resource_shard_holds_every_resource() -> None:
    # GIVEN a deployment of one resource shard: every key maps to it
    assert {resource_shard_index(key, 1) for key in ("change:a", "task:b", "x")} == {0}
    # AND no count below one is a deployment
    with pytest.raises(ValueError, match="shard_count must be at least 1, got 0"):
        resource_shard_index("change:a", 0)


def _python_event() -> dict[str, Any]:
    """A valid task.completed Event as Python keyword values."""
    return {
        "event_id": "evt_b842dd8af0a9b557c516a6417d20c1ba",
        "event_type": "task.completed",
        "event_version": 1,
        "tenant_id": "acme",
        "project_id": "acme-web",
        "change_id": "chg-1",
        "task_id": "tsk-1",
        "actor": "agent:builder-1",
        "canonical_generation": 3,
        "correlation_id": "corr-1",
        "timestamp": datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        "payload": {"agentId": "builder-1"},
    }
