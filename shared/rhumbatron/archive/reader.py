"""Read the S3 event archive back: list its objects and stream their Events in order.

Order. Within one stream, Events come back exactly in stream order: objects by
``(day, firstMs, key)``, lines in file order. Across streams (``stream_index=None``) the
archive is read one UTC day at a time, and within a day the streams are merged by Event
``timestamp`` (ties go to the lower stream), which never reorders a stream's own Events. A
batch that straddles midnight is filed under its first Event's day, so an all-streams read is
ordered by time only approximately around midnight; per stream it is exact.

Duplicates. The event router may recompose a batch on redelivery (more or fewer messages),
so one Event can sit in two objects. The reader remembers every Event ID it yielded and
yields each Event once; that memory grows with the range read (about 100 bytes an Event), so
read a bounded ``since``/``until`` range from a large archive.
"""

from __future__ import annotations

import gzip
import heapq
import itertools
import zlib
from collections.abc import Iterator
from datetime import date, timedelta
from typing import TYPE_CHECKING

from rhumbatron.archive.keys import (
    ARCHIVE_PREFIX,
    ArchiveKey,
    check_stream_index,
    day_prefix,
    parse_archive_key,
)
from rhumbatron.archive.writer import BucketClient
from rhumbatron.errors import ArchiveError, ArchiveUnavailableError, EnvelopeError
from rhumbatron.protocol.envelopes import Event

if TYPE_CHECKING:
    pass

__all__ = ["ArchiveReader"]

# Up to this many days, one listing per day prefix is cheaper than one scan of the archive
# (a daily prefix holds one day of objects; a scan pages through everything after ``since``).
_MAX_DAYS_LISTED_BY_PREFIX = 31


class ArchiveReader(BucketClient):
    """Lists and reads archive objects in ``bucket`` through a boto3 S3 client."""

    def list_objects(
        self,
        stream_index: int | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> Iterator[ArchiveKey]:
        """The archive objects of one stream (or all), filed from ``since`` to ``until``.

        Both days are inclusive UTC days and match the day in the key (the first Event's
        day). Objects come in key order: by day, then stream, then part name; ``firstMs``
        order within a stream is what :meth:`iter_events` sorts by. Raises
        :class:`ArchiveError` for a bad range, stream index or an object under ``events/``
        whose key is not an archive key, and :class:`ArchiveUnavailableError` when S3
        cannot be listed.
        """
        if stream_index is not None:
            check_stream_index(stream_index)
        if since is not None and until is not None and since > until:
            raise ArchiveError(
                f"since {since.isoformat()} is after until {until.isoformat()}; "
                "pass an inclusive range with since <= until"
            )
        # Checked above, listed below: a bad argument raises at the call, not at first next().
        return self._listed(stream_index, since, until)

    def _listed(
        self, stream_index: int | None, since: date | None, until: date | None
    ) -> Iterator[ArchiveKey]:
        if since is not None and until is not None:
            span = (until - since).days + 1
            if span <= _MAX_DAYS_LISTED_BY_PREFIX:
                for offset in range(span):
                    yield from self._list(day_prefix(since + timedelta(days=offset), stream_index))
                return
        start_after = None if since is None else day_prefix(since).removesuffix("/")
        for parsed in self._list(ARCHIVE_PREFIX, start_after):
            if until is not None and parsed.day > until:
                return  # keys are day-major: nothing later is in range
            if stream_index is None or parsed.stream_index == stream_index:
                yield parsed

    def iter_events(
        self,
        stream_index: int | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> Iterator[Event]:
        """Stream the archived Events back, each Event ID once (see the module docstring).

        ``stream_index``, ``since`` and ``until`` select objects as :meth:`list_objects`
        does. Raises :class:`ArchiveError` naming the object key and line number for a line
        that is not an Event, and :class:`ArchiveUnavailableError` when S3 cannot be read.
        """
        return self._events(self.list_objects(stream_index, since, until))

    def _events(self, listed: Iterator[ArchiveKey]) -> Iterator[Event]:
        seen: set[str] = set()
        for _day, day_keys in itertools.groupby(listed, key=lambda parsed: parsed.day):
            by_stream: dict[int, list[ArchiveKey]] = {}
            for parsed in day_keys:
                by_stream.setdefault(parsed.stream_index, []).append(parsed)
            streams = [
                self._stream_events(sorted(keys, key=lambda k: (k.first_ms, k.key)))
                for _index, keys in sorted(by_stream.items())
            ]
            # heapq.merge keeps each input's order and breaks ties by input (= stream) order.
            for event in heapq.merge(*streams, key=lambda event: event.timestamp):
                if event.event_id in seen:
                    continue
                seen.add(event.event_id)
                yield event

    def read_object(self, key: str) -> list[Event]:
        """The Events of one archive object, in file order.

        Raises :class:`ArchiveError` naming the key (and line number) when the object is
        missing or its body is not gzip NDJSON of Events, and
        :class:`ArchiveUnavailableError` when S3 cannot be read.
        """
        body = self._get_body(key)
        if body is None:
            raise ArchiveError(
                f"there is no archive object s3://{self._bucket}/{key}; "
                "list the archive for the keys it holds"
            )
        return self._decode(key, body)

    def _stream_events(self, keys: list[ArchiveKey]) -> Iterator[Event]:
        # Lazy, one object at a time: an all-streams merge holds at most one object per stream.
        for parsed in keys:
            body = self._get_body(parsed.key)
            if body is not None:  # None: expired between the listing and the read
                yield from self._decode(parsed.key, body)

    def _get_body(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._s3.get_object(Bucket=self._bucket, Key=key)
            return response["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise self._unreadable(key, exc) from exc
        except BotoCoreError as exc:
            raise self._unreadable(key, exc) from exc

    def _unreadable(self, key: str, exc: Exception) -> ArchiveUnavailableError:
        return ArchiveUnavailableError(
            f"could not read archive object s3://{self._bucket}/{key}: {exc}; "
            "read the archive again once S3 answers"
        )

    def _decode(self, key: str, body: bytes) -> list[Event]:
        try:
            ndjson = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise ArchiveError(
                f"archive object s3://{self._bucket}/{key} is not gzip ({exc}); "
                "restore it from a copy or delete it"
            ) from None
        lines = ndjson.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # every line ends with a newline, the last one included
        events = []
        for number, line in enumerate(lines, start=1):
            try:
                events.append(Event.parse(line))
            except EnvelopeError as exc:
                raise ArchiveError(
                    f"line {number} of archive object s3://{self._bucket}/{key} is not an "
                    f"Event ({exc}); restore the object from a copy or delete it"
                ) from None
        return events

    def _list(self, prefix: str, start_after: str | None = None) -> Iterator[ArchiveKey]:
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self._s3.get_paginator("list_objects_v2")
        if start_after is None:
            pages = paginator.paginate(Bucket=self._bucket, Prefix=prefix)
        else:
            pages = paginator.paginate(Bucket=self._bucket, Prefix=prefix, StartAfter=start_after)
        try:
            for page in pages:
                for entry in page.get("Contents", []):
                    yield parse_archive_key(entry["Key"])
        except (BotoCoreError, ClientError) as exc:
            raise ArchiveUnavailableError(
                f"could not list s3://{self._bucket}/{prefix}: {exc}; "
                "read the archive again once S3 answers"
            ) from exc
