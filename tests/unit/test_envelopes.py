"""The two envelopes (spec "Envelopes"): key fields on the wire, immutability, validation at the
edge with errors that name the field and the value, and the closed type registries."""

from __future__ import annotations

import contextlib
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rhumbatron.errors import EnvelopeError, UnknownTypeError
from rhumbatron.protocol.command_types import COMMAND_TYPES, QUEUES
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.event_types import EVENT_TYPES, Owner

# The spec's key fields, in its order (S0-011, S0-013).
EVENT_KEY_FIELDS = [
    "eventId",
    "eventType",
    "eventVersion",
    "tenantId",
    "projectId",
    "changeId",
    "taskId",
    "actor",
    "resource",
    "canonicalGeneration",
    "causedBy",
    "correlationId",
    "timestamp",
    "payload",
]
COMMAND_KEY_FIELDS = [
    "commandId",
    "commandType",
    "projectId",
    "changeId",
    "taskId",
    "attempt",
    "createdAt",
    "deadline",
    "payload",
]
# sha256("chg-1\x1ftask.completed\x1ftsk-1\x1f")[:32 hex], computed with the shell.
TASK_COMPLETED_ID = "evt_b842dd8af0a9b557c516a6417d20c1ba"


def event_wire(**overrides: Any) -> dict[str, Any]:
    """A valid task.completed Event as wire JSON (camelCase); ``None`` deletes a key."""
    wire: dict[str, Any] = {
        "eventId": TASK_COMPLETED_ID,
        "eventType": "task.completed",
        "eventVersion": 1,
        "tenantId": "acme",
        "projectId": "acme-web",
        "changeId": "chg-1",
        "taskId": "tsk-1",
        "actor": "agent:builder-1",
        "resource": None,
        "canonicalGeneration": 3,
        "causedBy": "evt_00000000000000000000000000000001",
        "correlationId": "corr-1",
        "timestamp": "2026-01-02T03:04:05.678Z",
        "payload": {"agentId": "builder-1"},
    }
    for key, value in overrides.items():
        if value is _DELETE:
            wire.pop(key)
        else:
            wire[key] = value
    return wire


_DELETE = object()


def command_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "command_id": "cmd_tsk-1_ready",
        "command_type": "agent.wake",
        "project_id": "acme-web",
        "change_id": "chg-1",
        "task_id": "tsk-1",
        "attempt": 2,
        "created_at": datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        "deadline": datetime(2026, 1, 2, 3, 9, 5, 678_000, tzinfo=UTC),
        "payload": {"agentId": "builder-1", "reason": "task.ready"},
    }
    fields.update(overrides)
    return fields


# --------------------------------------------------------------------------- key fields


def test_event_carries_all_14_key_fields_in_camel_case_on_the_wire() -> None:
    # GIVEN a valid Event
    event = Event.parse(event_wire())
    # WHEN it is serialised
    wire = json.loads(event.to_json())
    # THEN the wire object has exactly the spec's 14 key fields, camelCase, with their values
    assert list(wire) == EVENT_KEY_FIELDS
    assert wire["eventId"] == TASK_COMPLETED_ID
    assert wire["canonicalGeneration"] == 3
    assert wire["causedBy"] == "evt_00000000000000000000000000000001"
    assert wire["payload"]["agentId"] == "builder-1"


def test_command_carries_all_9_key_fields_in_camel_case_on_the_wire() -> None:
    # GIVEN a valid Command
    command = Command.create(**command_fields())
    # WHEN it is serialised
    wire = json.loads(command.to_json())
    # THEN the wire object has exactly the spec's 9 key fields, camelCase
    assert list(wire) == COMMAND_KEY_FIELDS
    assert wire["commandId"] == "cmd_tsk-1_ready"
    assert wire["attempt"] == 2
    assert wire["deadline"] == "2026-01-02T03:09:05.678Z"


def test_event_is_frozen_so_assigning_a_field_raises() -> None:
    # GIVEN an Event
    event = Event.parse(event_wire())
    # WHEN a field (or a payload field) is assigned
    # THEN pydantic refuses: an Event is an immutable fact (S0-001)
    with pytest.raises(ValidationError, match="frozen"):
        event.event_id = "evt_" + "0" * 32  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        event.payload.agent_id = "someone-else"  # type: ignore[attr-defined]
    assert event.event_id == TASK_COMPLETED_ID


def test_command_is_frozen_so_assigning_a_field_raises() -> None:
    command = Command.create(**command_fields())
    with pytest.raises(ValidationError, match="frozen"):
        command.attempt = 3  # type: ignore[misc]
    assert command.attempt == 2


def test_event_survives_a_wire_round_trip_unchanged() -> None:
    # GIVEN an Event built from Python values (microseconds included)
    event = Event.create(
        event_id=TASK_COMPLETED_ID,
        event_type="task.completed",
        event_version=1,
        tenant_id="acme",
        project_id="acme-web",
        change_id="chg-1",
        task_id="tsk-1",
        actor="agent:builder-1",
        correlation_id="corr-1",
        timestamp=datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC),
        payload={"agentId": "builder-1", "changesetId": "cs-1"},
    )
    # WHEN it goes to the wire and back (bytes and str alike)
    # THEN it is equal to the original
    assert Event.parse(event.to_json()) == event
    assert Event.parse(event.to_json().decode()) == event


def test_command_survives_a_wire_round_trip_unchanged() -> None:
    command = Command.create(**command_fields())
    assert Command.parse(command.to_json()) == command


# --------------------------------------------------------------------------- rejections


def test_unknown_event_type_raises_unknown_type_error_naming_the_type() -> None:
    # GIVEN wire JSON whose eventType is not in EVENT_TYPES
    # WHEN it is parsed
    # THEN UnknownTypeError (an EnvelopeError) names the field and the type (S0-015)
    with pytest.raises(UnknownTypeError) as caught:
        Event.parse(event_wire(eventType="task.exploded"))
    assert "eventType" in str(caught.value)
    assert "task.exploded" in str(caught.value)
    assert isinstance(caught.value, EnvelopeError)


def test_unknown_command_type_raises_unknown_type_error_naming_the_type() -> None:
    with pytest.raises(UnknownTypeError) as caught:
        Command.create(**command_fields(command_type="agent.sleep"))
    assert "agent.sleep" in str(caught.value)


def test_missing_event_field_is_rejected_naming_the_field() -> None:
    # GIVEN wire JSON without tenantId
    # WHEN it is parsed
    # THEN EnvelopeError says tenantId is missing
    with pytest.raises(EnvelopeError, match=r"tenantId is missing"):
        Event.parse(event_wire(tenantId=_DELETE))


def test_missing_command_field_is_rejected_naming_the_field() -> None:
    fields = command_fields()
    del fields["created_at"]
    with pytest.raises(EnvelopeError, match=r"createdAt is missing"):
        Command.create(**fields)


def test_wrong_type_is_rejected_naming_the_field_and_the_value() -> None:
    # GIVEN eventVersion as a word
    # WHEN parsed
    # THEN the error names eventVersion and the offending value
    with pytest.raises(EnvelopeError) as caught:
        Event.parse(event_wire(eventVersion="two"))
    assert "eventVersion='two'" in str(caught.value)


def test_bad_payload_field_is_rejected_naming_the_field_and_the_value() -> None:
    # GIVEN a task.completed payload whose agentId is a number
    # WHEN parsed
    # THEN the error names payload, agentId and the value 5
    with pytest.raises(EnvelopeError) as caught:
        Event.parse(event_wire(payload={"agentId": 5}))
    message = str(caught.value)
    assert "payload" in message
    assert "agentId=5" in message


def test_payload_of_another_type_is_rejected() -> None:
    # GIVEN a task.completed Event whose payload has a field task.completed does not take
    # THEN the unknown payload field is rejected by name
    with pytest.raises(EnvelopeError, match=r"generation"):
        Event.parse(event_wire(payload={"agentId": "a", "generation": 2}))


def test_unknown_envelope_field_is_rejected_naming_it() -> None:
    with pytest.raises(EnvelopeError, match=r"surprise=1"):
        Event.parse(event_wire(surprise=1))


@pytest.mark.parametrize("raw", [b"\xff\xfe", "not json", "[1, 2]", "42"])
def test_non_object_input_is_an_envelope_error(raw: bytes | str) -> None:
    with pytest.raises(EnvelopeError):
        Event.parse(raw)


def test_task_event_without_task_id_is_rejected() -> None:
    # GIVEN task.completed with taskId null
    # THEN the rule "task.* needs taskId" rejects it, naming taskId
    with pytest.raises(EnvelopeError, match=r"task\.completed needs taskId"):
        Event.parse(event_wire(taskId=None))


def test_change_event_without_change_id_is_rejected() -> None:
    # GIVEN change.created with changeId null
    wire = event_wire(
        eventType="change.created",
        taskId=None,
        changeId=None,
        payload={"title": "t", "clientRequestId": "r", "requestedBy": "user:u"},
    )
    # THEN it is rejected naming changeId
    with pytest.raises(EnvelopeError, match=r"change\.created needs changeId"):
        Event.parse(wire)


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("claim.released", {"claimId": "c", "agentId": "a"}),
        ("intent.declared", {"intentId": "i", "agentId": "a", "paths": ["src/x.py"]}),
    ],
)
def test_resource_event_without_resource_is_rejected(
    event_type: str, payload: dict[str, Any]
) -> None:
    wire = event_wire(
        eventType=event_type, changeId=None, taskId=None, resource=None, payload=payload
    )
    with pytest.raises(EnvelopeError, match=rf"{re.escape(event_type)} needs resource"):
        Event.parse(wire)
    # and with a resource it is accepted
    assert Event.parse({**wire, "resource": "src/x.py"}).resource == "src/x.py"


def test_event_version_other_than_the_registered_one_is_rejected() -> None:
    with pytest.raises(EnvelopeError, match=r"eventVersion=2 but task\.completed is version 1"):
        Event.parse(event_wire(eventVersion=2))


def test_malformed_event_id_is_rejected_naming_the_value() -> None:
    with pytest.raises(EnvelopeError, match=r"eventId='evt_XYZ'"):
        Event.parse(event_wire(eventId="evt_XYZ"))


# --------------------------------------------------------------------------- timestamps


def test_timestamps_go_on_the_wire_as_utc_milliseconds_with_z() -> None:
    # GIVEN an Event stamped in another timezone with microseconds
    plus_two = timezone(timedelta(hours=2))
    event = Event.parse(event_wire(timestamp="2026-01-02T05:04:05.678901+02:00"))
    # THEN the wire carries UTC, milliseconds, and Z
    assert json.loads(event.to_json())["timestamp"] == "2026-01-02T03:04:05.678Z"
    assert event.timestamp == datetime(2026, 1, 2, 5, 4, 5, 678_000, tzinfo=plus_two)
    assert event.timestamp.tzinfo is UTC


def test_command_times_go_on_the_wire_as_utc_milliseconds_with_z() -> None:
    wire = json.loads(Command.create(**command_fields()).to_json())
    assert wire["createdAt"] == "2026-01-02T03:04:05.678Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", wire["deadline"])


def test_naive_datetime_is_rejected_naming_the_value() -> None:
    # GIVEN a timestamp without a timezone
    # THEN it is refused: a naive time is ambiguous (DECISIONS: timestamps are UTC)
    with pytest.raises(EnvelopeError, match=r"timestamp=.*2026-01-02T03:04:05 has no timezone"):
        Event.parse(event_wire(timestamp="2026-01-02T03:04:05"))
    with pytest.raises(EnvelopeError, match=r"createdAt=.*has no timezone"):
        Command.create(**command_fields(created_at=datetime(2026, 1, 2), deadline=None))


@pytest.mark.parametrize("stamp", ["0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_timestamp_outside_the_utc_range_is_an_envelope_error(stamp: str) -> None:
    # GIVEN a timestamp that is valid ISO-8601 but has no UTC equivalent in Python's range
    # WHEN parsed
    # THEN it is an EnvelopeError naming the field, like every other bad value
    with pytest.raises(EnvelopeError, match="timestamp"):
        Event.parse(event_wire(timestamp=stamp))


@pytest.mark.parametrize("field", ["eventVersion", "canonicalGeneration"])
def test_a_boolean_is_not_accepted_as_an_integer_field(field: str) -> None:
    # GIVEN a wire Event whose integer field carries a JSON boolean
    # THEN it is refused rather than read as 1
    with pytest.raises(EnvelopeError, match=rf"{field}=True"):
        Event.parse(event_wire(**{field: True}))


# --------------------------------------------------------------------------- commands


def test_command_deadline_before_created_at_is_rejected() -> None:
    created = datetime(2026, 1, 2, tzinfo=UTC)
    with pytest.raises(EnvelopeError, match=r"deadline .* is not after createdAt"):
        Command.create(
            **command_fields(created_at=created, deadline=created - timedelta(seconds=1))
        )


def test_command_deadline_equal_to_created_at_is_rejected() -> None:
    created = datetime(2026, 1, 2, tzinfo=UTC)
    with pytest.raises(EnvelopeError, match="deadline"):
        Command.create(**command_fields(created_at=created, deadline=created))


def test_command_expires_at_its_deadline() -> None:
    # GIVEN a command with a deadline 5 minutes after creation
    command = Command.create(**command_fields())
    assert command.deadline is not None
    # THEN it is live before the deadline and expired from the deadline on
    assert not command.is_expired(command.deadline - timedelta(milliseconds=1))
    assert command.is_expired(command.deadline)
    assert command.is_expired(command.deadline + timedelta(days=1))


def test_command_without_deadline_never_expires() -> None:
    command = Command.create(**command_fields(deadline=None))
    assert not command.is_expired(datetime(9999, 1, 1, tzinfo=UTC))


def test_command_attempt_below_one_is_rejected_naming_the_value() -> None:
    with pytest.raises(EnvelopeError, match=r"attempt=0"):
        Command.create(**command_fields(attempt=0))


# --------------------------------------------------------------------------- registries

# The Event types the issue names, plus change, candidate, promotion and release facts.
NAMED_EVENT_TYPES = {
    "project.created",
    "artifact.promoted",
    "canonical.advanced",
    "claim.acquired",
    "claim.released",
    "claim.expired",
    "intent.declared",
    "intent.changed",
    "challenge.created",
    "changeset.proposed",
    "task.ready",
    "task.completed",
    "task.failed",
    "verification.started",
}
RESOURCE_EVENTS = {
    "intent.declared",
    "intent.changed",
    "challenge.created",
    "changeset.proposed",
    "claim.released",
    "claim.expired",
}
# The queue diagram: INT/ER -> agent.wake -> agent-wakeups; ER -> index.* -> indexing;
# INT -> verification.start -> verification; INT -> release.start -> release;
# everything else -> integration.
COMMAND_QUEUES = {
    "agent.wake": "agent-wakeups",
    "change.dispatch": "integration",
    "candidate.create": "integration",
    "change.settle": "integration",
    "candidates.recompose": "integration",
    "forks.sweep": "integration",
    "project.cleanup": "integration",
    "release.recover": "integration",
    "project.provision": "integration",
    "app.provision": "integration",
    "app.remove": "integration",
    "verification.start": "verification",
    "release.start": "release",
    "index.build": "indexing",
    "index.purge": "indexing",
}


def test_event_types_holds_every_type_the_issue_names() -> None:
    assert set(EVENT_TYPES) >= NAMED_EVENT_TYPES


@pytest.mark.parametrize("subject", ["change", "candidate", "promotion", "release"])
def test_event_types_holds_lifecycle_facts_of(subject: str) -> None:
    assert any(name.startswith(subject + ".") for name in EVENT_TYPES)


def test_event_type_names_follow_subject_dot_verb_with_a_version() -> None:
    for name, spec in EVENT_TYPES.items():
        assert re.fullmatch(r"[a-z][a-z_]*\.[a-z][a-z_]*", name), name
        assert spec.name == name
        assert spec.version >= 1


def test_exactly_the_six_resource_events_are_flagged() -> None:
    flagged = {name for name, spec in EVENT_TYPES.items() if spec.resource_event}
    assert flagged == RESOURCE_EVENTS


def test_project_root_owns_exactly_its_three_event_types() -> None:
    owned = {name for name, spec in EVENT_TYPES.items() if spec.owner is Owner.PROJECT_ROOT}
    assert owned == {"project.created", "artifact.promoted", "canonical.advanced"}
    assert all(
        spec.owner is Owner.RESOURCE_SHARD
        for name, spec in EVENT_TYPES.items()
        if name not in owned
    )


def test_every_event_type_has_its_own_payload_model_class() -> None:
    for spec in EVENT_TYPES.values():
        assert spec.payload.model_config.get("frozen") is True


def test_event_types_is_read_only() -> None:
    with pytest.raises(TypeError):
        EVENT_TYPES["made.up"] = EVENT_TYPES["task.ready"]  # type: ignore[index]


def test_command_types_holds_exactly_the_15_listed_types_on_their_queues() -> None:
    assert {name: spec.queue for name, spec in COMMAND_TYPES.items()} == COMMAND_QUEUES


def test_every_command_queue_is_a_known_queue() -> None:
    assert set(QUEUES) == {
        "agent-wakeups",
        "integration",
        "verification",
        "release",
        "indexing",
        "dead-letter",
    }
    assert {spec.queue for spec in COMMAND_TYPES.values()} <= set(QUEUES)


# --------------------------------------------------------------------------- fuzzing

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
_field_names = st.sampled_from(EVENT_KEY_FIELDS) | st.text(max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_field_names, _json_values, max_size=16))
def test_fuzzed_dicts_only_ever_raise_envelope_error(data: dict[str, Any]) -> None:
    # GIVEN any JSON object with (mostly) envelope keys
    # WHEN it is parsed as an Event
    # THEN it either parses or raises EnvelopeError, never anything else
    with contextlib.suppress(EnvelopeError):
        Event.parse(data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EVENT_KEY_FIELDS), _json_values)
def test_one_corrupted_field_of_a_valid_event_only_ever_raises_envelope_error(
    field: str, value: Any
) -> None:
    # GIVEN a valid Event's wire JSON with one field replaced by an arbitrary JSON value
    raw = json.dumps(event_wire(**{field: value}))
    # WHEN it is parsed
    # THEN it either parses or raises EnvelopeError
    with contextlib.suppress(EnvelopeError):
        Event.parse(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_fuzzed_bytes_only_ever_raise_envelope_error(raw: bytes | str) -> None:
    with contextlib.suppress(EnvelopeError):
        Event.parse(raw)


# ISO-8601 offsets are whole minutes (historical LMT offsets with seconds are not ISO-8601).
_offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)


@settings(max_examples=200, deadline=None)
@given(
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(9000, 1, 1),
        timezones=_offsets,
    )
)
def test_any_aware_timestamp_round_trips_as_utc_milliseconds(moment: datetime) -> None:
    # GIVEN any moment with an ISO-8601 offset, well inside datetime's range
    event = Event.parse(event_wire(timestamp=moment.isoformat()))
    # THEN the wire form is UTC with milliseconds and Z, and the round trip is lossless
    stamp = json.loads(event.to_json())["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    assert Event.parse(event.to_json()) == event
    assert abs(event.timestamp - moment) < timedelta(milliseconds=1)
