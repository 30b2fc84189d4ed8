"""The wire contract: envelopes, the closed type registries, and identities."""

from rhumbatron.protocol.command_types import COMMAND_TYPES, QUEUES, CommandTypeSpec
from rhumbatron.protocol.envelopes import Command, Event, format_timestamp
from rhumbatron.protocol.event_types import EVENT_TYPES, EventIdKind, EventTypeSpec, Owner
from rhumbatron.protocol.ids import (
    fnv1a32,
    new_event_id,
    stable_event_id,
    stream_index,
)

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "QUEUES",
    "Command",
    "CommandTypeSpec",
    "Event",
    "EventIdKind",
    "EventTypeSpec",
    "Owner",
    "fnv1a32",
    "format_timestamp",
    "new_event_id",
    "stable_event_id",
    "stream_index",
]
