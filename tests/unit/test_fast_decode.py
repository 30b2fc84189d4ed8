"""The trusted fast decode answers as ``Event.parse`` does, for every input.

``decode_event`` is the router's decoder: it must accept what the outbox writes by its fast
path, and for anything else give exactly the full parse's answer. Each property compares the
two decoders on the same bytes: both return equal Events (on the wire too), or both refuse
with the same error. Its two caches (the timestamps' text as they arrived, the values seen
valid) are used and bounded.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import EnvelopeError
from rhumbatron.protocol import envelopes, fast_decode
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import (
    Command,
    Event,
    format_timestamp,
    remember_arrived_timestamp,
)
from rhumbatron.protocol.event_types import EVENT_TYPES
from rhumbatron.protocol.fast_decode import decode_command, decode_event, fast_command, fast_event
from unit.test_envelopes import _DELETE, EVENT_KEY_FIELDS, command_fields, event_wire

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "acme-web",
            "acme-web\n",
            "chg-1",
            "tsk-1\n",
            "agent:builder-1",
            "evt_00000000000000000000000000000001",
            "2026-01-02T03:04:05.678Z",
            "2026-01-02T03:04:05.678+00:00",
            "2026-01-02T03:04:05Z",
            "2026-02-30T03:04:05.678Z",
            "2026-01-02T03:04:05.678",
            "task.completed",
            "change.created",
            "",
            "x" * 300,
        ]
    )
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def same_answer(raw: bytes) -> None:
    """``decode_event`` and ``Event.parse`` agree on ``raw``."""
    try:
        expected = Event.parse(raw)
    except EnvelopeError as refused:
        with pytest.raises(EnvelopeError) as caught:
            decode_event(raw)
        assert str(caught.value) == str(refused)
        assert fast_event(raw) is None, "the fast path accepted what the full parse refuses"
        return
    decoded = decode_event(raw)
    assert decoded == expected
    assert decoded.to_json() == expected.to_json()
    assert decoded.model_dump() == expected.model_dump()
    assert hash(decoded) == hash(expected)


def outbox_bytes(event_type: str, payload: dict[str, Any], **ids: Any) -> bytes:
    caller = Caller("tenant-a", "agent:builder-1", "corr-1")
    moment = datetime(2026, 3, 2, 10, 0, 0, 123_456, tzinfo=UTC)
    return FactContext(caller, "acme-web", moment).fact(event_type, payload, **ids).to_json()


def test_what_the_outbox_writes_takes_the_fast_path_and_equals_the_full_parse() -> None:
    # GIVEN events as the outbox serialises them, of several types and shapes
    bodies = [
        outbox_bytes("task.completed", {"agentId": "builder-1"}, change_id="c-1", task_id="t-1"),
        outbox_bytes(
            "change.created",
            {"title": "Add a login", "clientRequestId": "r-1", "requestedBy": "user:ann"},
            change_id="c-1",
        ),
        outbox_bytes("change.planned", {"taskIds": ["t-1", "t-2"]}, change_id="c-1"),
    ]
    for raw in bodies:
        # WHEN each is decoded by the fast path alone
        event = fast_event(raw)
        # THEN it decoded there, to the Event the full parse gives, and it is frozen
        assert event is not None, raw
        assert event == Event.parse(raw)
        assert event.to_json() == raw
        with pytest.raises(ValueError):
            event.event_id = "evt_00000000000000000000000000000002"


@pytest.mark.parametrize(
    "raw",
    [
        json.dumps({k.replace("Id", "_id"): v for k, v in event_wire().items()}).encode(),
        json.dumps(event_wire(timestamp="2026-01-02T05:04:05.678+02:00")).encode(),
        json.dumps(event_wire(timestamp="2026-01-02T03:04:05.678901Z")).encode(),
        json.dumps(event_wire(resource=_DELETE)).encode(),
    ],
    ids=["snake-case keys", "an offset", "microseconds", "a key left out"],
)
def test_a_valid_event_the_fast_path_does_not_know_still_decodes_by_the_full_parse(
    raw: bytes,
) -> None:
    # GIVEN a valid Event in a shape the outbox never writes
    # THEN the fast path leaves it, and decode_event answers as the full parse does
    assert fast_event(raw) is None
    assert decode_event(raw) == Event.parse(raw)


@pytest.mark.parametrize(
    "overrides",
    [
        {"projectId": "acme-web\n"},
        {"changeId": "chg-1\n"},
        {"eventId": "evt_B842DD8AF0A9B557C516A6417D20C1BA"},
        {"eventType": "task.exploded"},
        {"eventVersion": 2},
        {"eventVersion": 1.0},
        {"eventVersion": True},
        {"tenantId": "t" * 65},
        {"tenantId": ""},
        {"correlationId": ""},
        {"canonicalGeneration": -1},
        {"canonicalGeneration": 2**53},
        {"taskId": None},
        {"actor": "robot:x"},
        {"actor": "agent:two words"},
        {"timestamp": "2026-02-30T03:04:05.678Z"},
        {"timestamp": "2026-01-02T03:04:05.678"},
        {"payload": {"agentId": 7}},
        {"payload": {"agentId": "builder-1", "extra": 1}},
        {"payload": []},
        {"surplus": 1},
    ],
)
def test_a_broken_rule_is_refused_with_the_full_parses_error(overrides: dict[str, Any]) -> None:
    same_answer(json.dumps(event_wire(**overrides)).encode())


_CLAIM_RELEASED = {
    "eventType": "claim.released",
    "changeId": None,
    "taskId": None,
    "payload": {"claimId": "clm-1", "agentId": "builder-1"},
}


@pytest.mark.parametrize(
    "overrides",
    [
        {"tenantId": "t"},
        {"tenantId": "t" * 64},
        {"correlationId": "c" * 256},
        {"causedBy": "x" * 256},
        {"canonicalGeneration": 0},
        {"canonicalGeneration": 2**53 - 1},
        {**_CLAIM_RELEASED, "resource": "r"},
        {**_CLAIM_RELEASED, "resource": "r" * 1024},
    ],
    ids=[
        "a one-character tenant",
        "a tenant of 64",
        "a correlation ID of 256",
        "a cause of 256",
        "generation 0",
        "the largest generation",
        "a resource of one character",
        "a resource of 1,024",
    ],
)
def test_a_value_at_the_edge_of_its_bound_takes_the_fast_path(overrides: dict[str, Any]) -> None:
    # GIVEN a valid Event with one value at the edge of what the envelope allows
    raw = json.dumps(event_wire(**overrides)).encode()
    # THEN the fast path decodes it, to the Event the full parse gives
    event = fast_event(raw)
    assert event is not None
    assert event == Event.parse(raw)


@pytest.mark.parametrize(
    "overrides",
    [
        {"correlationId": "c" * 257},
        {"causedBy": "x" * 257},
        {**_CLAIM_RELEASED, "resource": "r" * 1025},
        {**_CLAIM_RELEASED, "resource": None},
    ],
    ids=["a correlation ID of 257", "a cause of 257", "a resource of 1,025", "no resource"],
)
def test_a_value_one_past_its_bound_is_refused_with_the_full_parses_error(
    overrides: dict[str, Any],
) -> None:
    same_answer(json.dumps(event_wire(**overrides)).encode())


def test_a_repeated_key_is_read_as_the_full_parse_reads_it() -> None:
    body = json.dumps(event_wire())[:-1] + ', "eventType": "task.exploded"}'
    same_answer(body.encode())


def test_a_lone_surrogate_is_read_as_the_full_parse_reads_it() -> None:
    same_answer(json.dumps(event_wire(correlationId="corr-\ud800")).encode())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(EVENT_KEY_FIELDS), _json_values)
def test_one_field_set_to_anything_gets_the_full_parses_answer(field: str, value: Any) -> None:
    same_answer(json.dumps(event_wire(**{field: value})).encode())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(EVENT_TYPES)), st.data())
def test_any_payload_of_any_type_gets_the_full_parses_answer(
    event_type: str, data: st.DataObject
) -> None:
    # GIVEN an event of any registered type whose payload has that type's keys, each with
    # any JSON value or left out
    spec = EVENT_TYPES[event_type]
    keys = [field.alias or name for name, field in spec.payload.model_fields.items()]
    payload = {key: data.draw(_json_values) for key in keys if data.draw(st.booleans())}
    wire = event_wire(
        eventType=event_type,
        eventVersion=spec.version,
        resource="src/app/login.py",
        payload=payload,
    )
    same_answer(json.dumps(wire).encode())


@settings(max_examples=200, deadline=None)
@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.integers(min_value=-14 * 60, max_value=14 * 60).map(
            lambda minutes: timezone(timedelta(minutes=minutes))
        ),
    ),
    st.sampled_from(["milliseconds", "microseconds", "seconds", "auto"]),
)
def test_any_timestamp_gets_the_full_parses_answer(moment: datetime, spec: str) -> None:
    stamp = moment.isoformat(timespec=spec)
    same_answer(json.dumps(event_wire(timestamp=stamp)).encode())
    canonical = moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds")
    same_answer(json.dumps(event_wire(timestamp=canonical + "Z")).encode())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_get_the_full_parses_answer(raw: bytes) -> None:
    same_answer(raw)


# -- commands: the queue consumers' decoder ------------------------------------------------------


def command_wire(**overrides: Any) -> dict[str, Any]:
    """A valid agent.wake Command as ``Command.to_json`` writes it; ``_GONE`` deletes a key."""
    wire: dict[str, Any] = json.loads(Command.create(**command_fields()).to_json())
    for key, value in overrides.items():
        if value is _GONE:
            wire.pop(key)
        else:
            wire[key] = value
    return wire


_GONE = object()
COMMAND_KEYS = list(command_wire())


def same_command_answer(raw: bytes) -> None:
    """``decode_command`` and ``Command.parse`` agree on ``raw``."""
    try:
        expected = Command.parse(raw)
    except EnvelopeError as refused:
        with pytest.raises(EnvelopeError) as caught:
            decode_command(raw)
        assert str(caught.value) == str(refused)
        assert fast_command(raw) is None, "the fast path accepted what the full parse refuses"
        return
    decoded = decode_command(raw)
    assert decoded == expected
    assert decoded.to_json() == expected.to_json()
    assert decoded.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)


def test_what_the_command_bus_sends_takes_the_fast_path_and_equals_the_full_parse() -> None:
    raw = Command.create(**command_fields()).to_json()
    command = fast_command(raw)
    assert command is not None
    assert command == Command.parse(raw)
    assert command.to_json() == raw


@pytest.mark.parametrize("attempt", [1, 2**53 - 1], ids=["the first", "the largest"])
def test_a_commands_attempt_at_the_edge_of_its_bound_takes_the_fast_path(attempt: int) -> None:
    raw = json.dumps(command_wire(attempt=attempt)).encode()
    command = fast_command(raw)
    assert command is not None
    assert command == Command.parse(raw)


@pytest.mark.parametrize(
    "overrides",
    [
        {"commandId": "cmd_x\n"},
        {"commandId": "job_1"},
        {"commandType": "agent.explode"},
        {"projectId": "acme-web\n"},
        {"taskId": "t 1"},
        {"attempt": 0},
        {"attempt": True},
        {"attempt": 2.0},
        {"attempt": 2**53},
        {"attempt": _GONE},
        {"deadline": _GONE},
        {"deadline": "2026-01-02T03:04:05.678Z"},
        {"createdAt": "2026-01-02T03:04:05Z"},
        {"createdAt": "2026-13-02T03:04:05.678Z"},
        {"payload": {"agentId": 7, "reason": "task.ready"}},
        {"payload": {}},
        {"surplus": 1},
    ],
)
def test_a_command_that_breaks_a_rule_or_the_shape_gets_the_full_parses_answer(
    overrides: dict[str, Any],
) -> None:
    same_command_answer(json.dumps(command_wire(**overrides)).encode())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(COMMAND_KEYS), _json_values)
def test_one_command_field_set_to_anything_gets_the_full_parses_answer(
    field: str, value: Any
) -> None:
    same_command_answer(json.dumps(command_wire(**{field: value})).encode())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(COMMAND_TYPES)), st.data())
def test_any_payload_of_any_command_type_gets_the_full_parses_answer(
    command_type: str, data: st.DataObject
) -> None:
    spec = COMMAND_TYPES[command_type]
    keys = [field.alias or name for name, field in spec.payload.model_fields.items()]
    payload = {key: data.draw(_json_values) for key in keys if data.draw(st.booleans())}
    same_command_answer(
        json.dumps(command_wire(commandType=command_type, payload=payload)).encode()
    )


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_get_the_full_command_parses_answer(raw: bytes) -> None:
    same_command_answer(raw)


# --------------------------------------------------------------------------- the caches


def test_the_routers_decoders_take_the_fast_path_for_what_the_outbox_and_the_bus_write() -> None:
    # GIVEN no timestamp remembered yet
    envelopes._ARRIVED_TEXT.clear()
    # WHEN an Event and a Command of the shapes the outbox and the bus write are decoded
    event = decode_event(json.dumps(event_wire(timestamp="2026-05-06T07:08:09.012Z")).encode())
    command = decode_command(json.dumps(command_wire()).encode())
    assert event.timestamp != command.created_at  # neither can stand for the other below
    # THEN each went by the fast path: it kept the timestamps' text to be written back as is
    assert event.timestamp in envelopes._ARRIVED_TEXT
    assert command.created_at in envelopes._ARRIVED_TEXT


def test_a_timestamp_read_by_the_fast_path_is_written_back_as_it_arrived() -> None:
    # GIVEN an Event decoded by the fast path
    envelopes._ARRIVED_TEXT.clear()
    event = fast_event(json.dumps(event_wire(timestamp="2026-04-05T06:07:08.901Z")).encode())
    assert event is not None
    # THEN its timestamp is formatted as the very text it arrived as, not made again
    arrived = envelopes._ARRIVED_TEXT[event.timestamp]
    assert arrived == "2026-04-05T06:07:08.901Z"
    assert format_timestamp(event.timestamp) is arrived


def test_the_arrived_timestamps_kept_are_at_most_8192() -> None:
    # GIVEN one more arrived timestamp than are kept
    envelopes._ARRIVED_TEXT.clear()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(envelopes._ARRIVED_LIMIT + 1):
        moment = start + timedelta(milliseconds=n)
        remember_arrived_timestamp(moment, format_timestamp(moment))
    # THEN the cache was emptied at its limit instead of growing past it
    assert len(envelopes._ARRIVED_TEXT) <= 8_192


def test_the_values_seen_valid_are_remembered_at_most_4096_per_pattern() -> None:
    # GIVEN nothing seen yet, then one more project decoded than the seen-valid set holds
    fast_decode._seen.clear()
    remembered: set[str] = set()
    for n in range(4_096 + 1):
        assert fast_event(json.dumps(event_wire(projectId=f"p-{n}")).encode()) is not None
        if n == 1:
            remembered = set(fast_decode._seen[fast_decode._PROJECT_ID])
    # THEN each project was remembered as seen valid, and the set never outgrew its limit
    assert {"p-0", "p-1"} <= remembered
    seen = fast_decode._seen[fast_decode._PROJECT_ID]
    assert "p-4096" in seen
    assert len(seen) <= 4_096
