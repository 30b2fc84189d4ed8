"""Archive object keys: ``events/<yyyy>/<mm>/<dd>/stream-<NN>/part-<firstMs>-<hash>.ndjson.gz``.

The key is a pure function of the batch: the day and ``firstMs`` come from the first Event's
``timestamp`` (the batch is in stream order), and ``hash`` from the batch's Event IDs. A
batch redelivered as it was lands on the same key and overwrites its own object. A batch
recomposed on redelivery (some of its records came back in another fetch) gets another key:
an Event can then be in two objects, and :class:`~rhumbatron.archive.ArchiveReader` yields
it once. Nothing is ever missing; a duplicate is the price of never holding a lease forever.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from rhumbatron.errors import ArchiveError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

__all__ = [
    "ARCHIVE_PREFIX",
    "ArchiveKey",
    "archive_key",
    "batch_digest",
    "check_stream_index",
    "day_prefix",
    "parse_archive_key",
]

#: Every archive object lives under this prefix; the bucket's lifecycle rule matches it.
ARCHIVE_PREFIX = "events/"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DIGEST_HEX_CHARS = 16
_KEY_PATTERN = re.compile(
    r"^events/(?P<year>[0-9]{4})/(?P<month>[0-9]{2})/(?P<day>[0-9]{2})"
    r"/stream-(?P<stream>[0-9]{2})"
    r"/part-(?P<first_ms>0|-?[1-9][0-9]*)-(?P<digest>[0-9a-f]{16})\.ndjson\.gz$"
)


@dataclass(frozen=True)
class ArchiveKey:
    """The parts of one archive object's key; :attr:`key` rebuilds the exact key string."""

    stream_index: int
    day: date
    first_ms: int
    digest: str

    @property
    def key(self) -> str:
        """The exact object key these parts name (round-trips with :func:`parse_archive_key`)."""
        return (
            f"{day_prefix(self.day)}stream-{self.stream_index:02d}/"
            f"part-{self.first_ms}-{self.digest}.ndjson.gz"
        )


def archive_key(stream_index: int, events: Sequence[Event]) -> str:
    """The key of the archive object holding ``events``, one audit-archiver batch of a stream.

    Raises :class:`ArchiveError` for an empty batch or a stream index outside ``0..7``.
    """
    check_stream_index(stream_index)
    if not events:
        raise ArchiveError(
            f"cannot name an archive object for an empty batch of stream {stream_index:02d}; "
            "archive only batches that hold at least one Event"
        )
    first = events[0].timestamp
    return ArchiveKey(
        stream_index=stream_index,
        day=first.astimezone(UTC).date(),
        first_ms=_epoch_ms(first),
        digest=batch_digest(events),
    ).key


def batch_digest(events: Sequence[Event]) -> str:
    """First 16 hex digits of SHA-256 over the batch's Event IDs, sorted, joined by ``\\n``.

    Sorting makes the digest independent of the order a redelivery fetched the messages in.
    """
    material = "\n".join(sorted(event.event_id for event in events))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:_DIGEST_HEX_CHARS]


def parse_archive_key(key: str) -> ArchiveKey:
    """Split an archive object key into its parts; raises :class:`ArchiveError` otherwise.

    Refuses anything :func:`archive_key` would not have written, including a ``firstMs``
    that falls on another day than the key's date.
    """
    match = _KEY_PATTERN.match(key)
    if match is None:
        raise ArchiveError(
            f"{key!r} is not an archive key; expected "
            "events/<yyyy>/<mm>/<dd>/stream-<NN>/part-<firstMs>-<16 hex>.ndjson.gz"
        )
    try:
        day = date(int(match["year"]), int(match["month"]), int(match["day"]))
    except ValueError as exc:
        raise ArchiveError(f"{key!r} is not an archive key: its date is invalid ({exc})") from None
    stream = int(match["stream"])
    if not 0 <= stream < EVENT_STREAM_COUNT:
        raise ArchiveError(
            f"{key!r} is not an archive key: stream {stream:02d} is outside "
            f"00..{EVENT_STREAM_COUNT - 1:02d}"
        )
    first_ms = int(match["first_ms"])
    try:
        first_day = (_EPOCH + timedelta(milliseconds=first_ms)).date()
    except OverflowError:
        first_day = None
    if first_day != day:
        raise ArchiveError(
            f"{key!r} is not an archive key: firstMs {first_ms} is not on {day.isoformat()}"
        )
    return ArchiveKey(stream_index=stream, day=day, first_ms=first_ms, digest=match["digest"])


def day_prefix(day: date, stream_index: int | None = None) -> str:
    """The listing prefix of one UTC day, or of one stream on that day."""
    prefix = f"{ARCHIVE_PREFIX}{day.year:04d}/{day.month:02d}/{day.day:02d}/"
    if stream_index is not None:
        prefix += f"stream-{stream_index:02d}/"
    return prefix


def check_stream_index(stream_index: int) -> None:
    """Raise :class:`ArchiveError` unless ``stream_index`` names one of the event streams."""
    if not 0 <= stream_index < EVENT_STREAM_COUNT:
        raise ArchiveError(
            f"stream index {stream_index} is outside 0..{EVENT_STREAM_COUNT - 1}; "
            "an archive object belongs to one of the event streams"
        )


def _epoch_ms(moment: datetime) -> int:
    # Integer arithmetic on the timedelta: float seconds would round some milliseconds down.
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
