"""The two envelopes: :class:`Event` (an immutable fact) and :class:`Command` (a request).

Both are frozen pydantic models validated at the edge. On the wire they are camelCase JSON
with the spec's key fields; in Python the same fields are snake_case. The payload is parsed
with the model its type registers, so an Event of an unknown type, a missing field or a
wrong type never exists as an object: :meth:`Event.create` and :meth:`Event.parse` raise
:class:`~rhumbatron.errors.EnvelopeError` naming the field and the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from pydantic import (
    BaseModel,
    Field,
    SerializeAsAny,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rhumbatron.errors import EnvelopeError, UnknownTypeError
from rhumbatron.protocol.command_types import COMMAND_TYPES, CommandTypeSpec
from rhumbatron.protocol.event_types import EVENT_TYPES, EventTypeSpec
from rhumbatron.protocol.ids import EVENT_ID_PATTERN, PROJECT_ID_PATTERN
from rhumbatron.protocol.payloads import WIRE_MODEL_CONFIG, Payload
from rhumbatron.protocol.values import IDENTIFIER, MAX_ATTEMPT, MAX_WIRE_INTEGER
from rhumbatron.redaction import describe_input

__all__ = ["Command", "Event", "format_timestamp", "remember_arrived_timestamp"]

ACTOR_PATTERN = r"^(agent|user|system|workflow|operator):[^\s\x00-\x1f\x7f]{1,200}$"
COMMAND_ID_PATTERN = r"^cmd_[A-Za-z0-9_.:\-]{1,200}$"
_UNREADABLE_PAYLOAD = "cannot read the payload"
_NO_OFFSET = timedelta(0)


#: Timestamps read off the wire in this format, each with the text it arrived as: formatting
#: one again gives that text back with one lookup (the hot paths write timestamps as they
#: arrive). Keyed by value, so an equal moment formats alike; cleared when full.
_ARRIVED_TEXT: dict[datetime, str] = {}
_ARRIVED_LIMIT = 8_192


def remember_arrived_timestamp(moment: datetime, text: str) -> None:
    """Note that ``text``, in this module's format, was read as ``moment``:
    ``format_timestamp(moment)`` returns it from now on. The caller vouches that the text is
    in the format (the fast decode checks it)."""
    if len(_ARRIVED_TEXT) >= _ARRIVED_LIMIT:
        _ARRIVED_TEXT.clear()
    _ARRIVED_TEXT[moment] = text


def format_timestamp(moment: datetime) -> str:
    """UTC ISO-8601 with milliseconds and ``Z``: the envelopes' one timestamp format.

    Milliseconds are truncated, as the envelopes keep them. ``isoformat`` runs in C: the
    router formats several timestamps per event, and ``strftime`` cost a tenth of its time.
    A moment read off the wire gives back the text it arrived as (one dict lookup).
    """
    arrived = _ARRIVED_TEXT.get(moment)
    if arrived is not None:
        return arrived
    if moment.utcoffset() != _NO_OFFSET:
        moment = moment.astimezone(UTC)
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{value.isoformat()} has no timezone; timestamps must be UTC")
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        # Pydantic files only ValueError under the field; an OverflowError would escape.
        raise ValueError(f"{value.isoformat()} has no UTC equivalent in range") from None
    # The wire keeps milliseconds; truncate so an envelope equals its own round trip.
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _describe(kind: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        message = err["msg"].removeprefix("Value error, ")
        if message.startswith(_UNREADABLE_PAYLOAD):
            continue  # a consequence of a bad type, already reported on its own field
        # Name fields as the wire does (eventId), even when Python passed event_id.
        where = (
            ".".join(to_camel(part) if isinstance(part, str) else str(part) for part in err["loc"])
            or "(envelope)"
        )
        if err["type"] == "missing":
            problems.append(f"{where} is missing")
            continue
        quoted = describe_input(err["loc"], err.get("input"))
        problems.append(f"{where}: {message}" if quoted is None else f"{where}={quoted}: {message}")
    return f"invalid {kind}: " + "; ".join(problems)


def _payload_for(model: type[Payload], value: object, type_name: str) -> Payload:
    if isinstance(value, model):
        return value
    if isinstance(value, Payload):
        raise ValueError(
            f"payload is a {type(value).__name__}, but {type_name} takes {model.__name__}"
        )
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        # Re-raised as a ValueError so pydantic files it under ``payload`` with the detail.
        raise ValueError(_describe(f"{type_name} payload", exc)) from None


class _Envelope(BaseModel):
    model_config = WIRE_MODEL_CONFIG

    @classmethod
    def _kind(cls) -> str:
        return cls.__name__

    @classmethod
    def create(cls, **fields: Any) -> Self:
        """Build an envelope from Python values; raises :class:`EnvelopeError`."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise _envelope_error(cls._kind(), exc) from None

    @classmethod
    def parse(cls, raw: bytes | str | Mapping[str, Any]) -> Self:
        """Decode wire JSON (or a mapping); raises :class:`EnvelopeError` naming the field."""
        if isinstance(raw, (bytes, str)):
            # pydantic's own JSON parser skips building a dict first (a third faster on the
            # router's hot path); a body that is not a JSON object takes the slow path below
            # for its clearer error.
            try:
                return cls.model_validate_json(raw)
            except ValidationError as exc:
                if not any(e["type"] in ("json_invalid", "model_type") for e in exc.errors()):
                    raise _envelope_error(cls._kind(), exc) from None
        try:
            data = json.loads(raw) if isinstance(raw, (bytes, str)) else dict(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EnvelopeError(f"invalid {cls._kind()}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise EnvelopeError(
                f"invalid {cls._kind()}: expected a JSON object, got {type(data).__name__}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _envelope_error(cls._kind(), exc) from None

    def to_json(self) -> bytes:
        """The wire form: compact camelCase JSON, UTF-8."""
        return self.model_dump_json(by_alias=True).encode("utf-8")

    def to_wire(self) -> dict[str, Any]:
        """The wire form as a JSON-ready dict."""
        return self.model_dump(mode="json", by_alias=True)


def _envelope_error(kind: str, exc: ValidationError) -> EnvelopeError:
    message = _describe(kind, exc)
    unknown = any(
        "unknown event type" in e["msg"] or "unknown command type" in e["msg"]
        for e in exc.errors(include_url=False)
    )
    return (UnknownTypeError if unknown else EnvelopeError)(message)


class Event(_Envelope):
    """An immutable fact. ``event_id`` is its stable key on every boundary."""

    event_id: str = Field(pattern=EVENT_ID_PATTERN.pattern)
    event_type: str
    event_version: StrictInt = Field(ge=1)
    tenant_id: str = Field(min_length=1, max_length=64)
    project_id: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    # Change and Task IDs are keys (claims, stable Event IDs, shard choice): the identifier
    # alphabet, so neither can carry the stable ID's unit separator or a line break.
    change_id: str | None = Field(default=None, pattern=IDENTIFIER)
    task_id: str | None = Field(default=None, pattern=IDENTIFIER)
    actor: str = Field(pattern=ACTOR_PATTERN)
    resource: str | None = Field(default=None, min_length=1, max_length=1024)
    canonical_generation: StrictInt | None = Field(default=None, ge=0, le=MAX_WIRE_INTEGER)
    caused_by: str | None = Field(default=None, min_length=1, max_length=256)
    correlation_id: str = Field(min_length=1, max_length=256)
    timestamp: datetime
    payload: SerializeAsAny[Payload]

    @classmethod
    def _kind(cls) -> str:
        return "Event"

    @field_validator("event_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in EVENT_TYPES:
            raise ValueError(
                f"unknown event type; EVENT_TYPES is closed: {', '.join(sorted(EVENT_TYPES))}"
            )
        return value

    @field_validator("timestamp")
    @classmethod
    def _timestamp_utc(cls, value: datetime) -> datetime:
        return _utc(value)

    @field_validator("payload", mode="before")
    @classmethod
    def _typed_payload(cls, value: object, info: ValidationInfo) -> Payload:
        type_name = info.data.get("event_type")
        if type_name is None:
            raise ValueError(f"{_UNREADABLE_PAYLOAD} of an Event whose eventType is invalid")
        return _payload_for(EVENT_TYPES[type_name].payload, value, type_name)

    @model_validator(mode="after")
    def _type_rules(self) -> Self:
        spec = self.spec
        if self.event_version != spec.version:
            raise ValueError(
                f"eventVersion={self.event_version} but {spec.name} is version {spec.version}"
            )
        missing = [
            name
            for name, needed, value in (
                ("changeId", spec.requires_change, self.change_id),
                ("taskId", spec.requires_task, self.task_id),
                ("resource", spec.resource_event, self.resource),
            )
            if needed and value is None
        ]
        if missing:
            raise ValueError(f"{spec.name} needs {', '.join(missing)}, which is null")
        return self

    @field_serializer("timestamp")
    def _serialize_timestamp(self, value: datetime) -> str:
        return format_timestamp(value)

    @property
    def spec(self) -> EventTypeSpec:
        """The registry entry of this Event's type."""
        return EVENT_TYPES[self.event_type]


class Command(_Envelope):
    """A request for work. ``command_id`` is its stable key on every boundary."""

    command_id: str = Field(pattern=COMMAND_ID_PATTERN)
    command_type: str
    project_id: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    change_id: str | None = Field(default=None, pattern=IDENTIFIER)
    task_id: str | None = Field(default=None, pattern=IDENTIFIER)
    # Bounded: the dead-letter consumer stores it, and a Retry sends attempt + 1.
    attempt: StrictInt = Field(default=1, ge=1, le=MAX_ATTEMPT)
    created_at: datetime
    deadline: datetime | None = None
    payload: SerializeAsAny[Payload]

    @classmethod
    def _kind(cls) -> str:
        return "Command"

    @field_validator("command_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in COMMAND_TYPES:
            raise ValueError(
                "unknown command type; COMMAND_TYPES is closed: " + ", ".join(sorted(COMMAND_TYPES))
            )
        return value

    @field_validator("created_at", "deadline")
    @classmethod
    def _times_utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _utc(value)

    @field_validator("payload", mode="before")
    @classmethod
    def _typed_payload(cls, value: object, info: ValidationInfo) -> Payload:
        type_name = info.data.get("command_type")
        if type_name is None:
            raise ValueError(f"{_UNREADABLE_PAYLOAD} of a Command whose commandType is invalid")
        return _payload_for(COMMAND_TYPES[type_name].payload, value, type_name)

    @model_validator(mode="after")
    def _deadline_after_creation(self) -> Self:
        if self.deadline is not None and self.deadline <= self.created_at:
            raise ValueError(
                f"deadline {format_timestamp(self.deadline)} is not after createdAt "
                f"{format_timestamp(self.created_at)}"
            )
        return self

    @field_serializer("created_at", "deadline")
    def _serialize_times(self, value: datetime | None) -> str | None:
        return None if value is None else format_timestamp(value)

    @property
    def spec(self) -> CommandTypeSpec:
        """The registry entry of this Command's type."""
        return COMMAND_TYPES[self.command_type]

    def is_expired(self, now: datetime) -> bool:
        """True once ``deadline`` has passed: such a command is acked without running."""
        return self.deadline is not None and now >= self.deadline
