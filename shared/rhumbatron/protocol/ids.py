"""Identities: stable Event IDs, actor-minted Event IDs, and the project → stream mapping.

These functions are part of the wire contract: two deployments must compute the same values,
so each is specified exactly (see ../shared/DECISIONS.md) and pinned by independent vectors.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from rhumbatron.protocol.values import NAME_ID

__all__ = [
    "EVENT_ID_PATTERN",
    "EVENT_STREAM_COUNT",
    "PROJECT_ID_PATTERN",
    "event_stream_index",
    "event_stream_name",
    "event_stream_subject",
    "fnv1a32",
    "new_event_id",
    "resource_shard_index",
    "stable_event_id",
    "stream_index",
]

#: The event log is exactly eight streams (spec: "eight NATS JetStream streams"). Not a setting:
#: changing it would move projects between streams and break their order.
EVENT_STREAM_COUNT = 8
#: ``evt_`` + 32 lowercase hex characters, for stable and actor-minted IDs alike.
EVENT_ID_PATTERN = re.compile(r"^evt_[0-9a-f]{32}$")
#: Project IDs name files and NATS headers: a conservative alphabet, 1–64 characters
#: (:data:`~rhumbatron.protocol.values.NameId`). Match with ``fullmatch``: Python's ``$``
#: also matches before a final newline.
PROJECT_ID_PATTERN = re.compile(NAME_ID)

_FNV32_OFFSET_BASIS = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_UNIT_SEPARATOR = "\x1f"


def stable_event_id(
    change_id: str, event_type: str, task_id: str | None = None, key: str | None = None
) -> str:
    """The deterministic ID of a Change Event (spec ``stableEventId``).

    ``evt_`` + lowercase hex of the first 16 bytes of SHA-256 over the UTF-8 of
    ``change_id``, ``event_type``, ``task_id`` and ``key`` joined by ``\\x1f``; an absent
    task ID or key is the empty string. A retried workflow step computes the same ID, and the
    outbox's ``INSERT OR IGNORE`` turns the repeat into a no-op.
    """
    material = _UNIT_SEPARATOR.join((change_id, event_type, task_id or "", key or ""))
    return "evt_" + hashlib.sha256(material.encode("utf-8")).digest()[:16].hex()


def new_event_id() -> str:
    """An actor-minted Event ID: ``evt_`` + the 32 hex digits of a random UUID4.

    Minted once inside the actor's transaction and stored with the outbox row, so a retried
    publish re-sends the same ID.
    """
    return "evt_" + uuid.uuid4().hex


def fnv1a32(text: str) -> int:
    """Standard 32-bit FNV-1a over the UTF-8 bytes of ``text``, unsigned."""
    value = _FNV32_OFFSET_BASIS
    for byte in text.encode("utf-8"):
        value ^= byte
        value = (value * _FNV32_PRIME) & 0xFFFFFFFF
    return value


def stream_index(project_id: str) -> int:
    """The event stream of a project: ``fnv1a32(projectId) mod 8``. It never changes."""
    return fnv1a32(project_id) % EVENT_STREAM_COUNT


def event_stream_name(index: int) -> str:
    """``EVENTS_00`` … ``EVENTS_07``."""
    _check_stream_index(index)
    return f"EVENTS_{index:02d}"


def event_stream_index(name: str) -> int:
    """The index of the event stream called ``name`` (``EVENTS_03`` → 3); raises
    ``ValueError`` naming it when it is no event stream."""
    for index in range(EVENT_STREAM_COUNT):
        if event_stream_name(index) == name:
            return index
    raise ValueError(f"{name!r} is no event stream: EVENTS_00 … EVENTS_0{EVENT_STREAM_COUNT - 1}")


def event_stream_subject(index: int) -> str:
    """``events.00`` … ``events.07``."""
    _check_stream_index(index)
    return f"events.{index:02d}"


def resource_shard_index(resource_key: str, shard_count: int) -> int:
    """The resource shard of a project that owns ``resource_key`` (e.g. ``change:<id>``).

    ``fnv1a32(resource_key) mod shard_count``. The shard count of a deployment must never
    change once actors exist: every key would move to another file.
    """
    if shard_count < 1:
        raise ValueError(f"shard_count must be at least 1, got {shard_count}")
    return fnv1a32(resource_key) % shard_count


def _check_stream_index(index: int) -> None:
    if not 0 <= index < EVENT_STREAM_COUNT:
        raise ValueError(f"stream index {index} is outside 0..{EVENT_STREAM_COUNT - 1}")
