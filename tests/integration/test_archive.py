"""The S3 audit archive against a real moto S3 server (spec S0-084, S0-095, S0-096, S0-231):
one gzip NDJSON object per batch under a key derived from the batch, read back in order and
once per Event, and a bounded expiry pass where the store has no lifecycle rule."""

from __future__ import annotations

import calendar
import gzip
import hashlib
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config

from rhumbatron.archive import (
    ARCHIVE_PREFIX,
    ArchiveKey,
    ArchiveReader,
    ArchiveWriter,
    ExpiryReport,
    archive_key,
    expire_archive,
    parse_archive_key,
)
from rhumbatron.core.clock import ManualClock
from rhumbatron.errors import ArchiveError, ArchiveUnavailableError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import new_event_id
from rhumbatron_dev.local.s3_server import S3ServerProcess

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.integration

# Event times are fixed and well in the past: the expiry pass assumes an object is uploaded
# after its first Event occurred, which holds for any machine clock after 2024.
T0 = datetime(2024, 2, 28, 23, 59, 58, 250_000, tzinfo=UTC)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def s3(s3_server: S3ServerProcess) -> S3Client:
    client: S3Client = s3_server.client()
    return client


@pytest.fixture
def bucket(s3: S3Client) -> str:
    name = f"archive-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    return name


def event_at(moment: datetime, project_id: str = "acme-web", event_id: str | None = None) -> Event:
    """A project.created Event that occurred at ``moment``, with a fresh ID unless given."""
    return Event.create(
        event_id=event_id or new_event_id(),
        event_type="project.created",
        event_version=1,
        tenant_id="acme",
        project_id=project_id,
        actor="system:test",
        correlation_id="corr-archive",
        timestamp=moment,
        payload={"name": f"project at {moment.isoformat()}"},
    )


def events_every_second(start: datetime, count: int, project_id: str = "acme-web") -> list[Event]:
    return [event_at(start + timedelta(seconds=i), project_id) for i in range(count)]


def keys_in(s3: S3Client, bucket: str, prefix: str = "") -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [entry["Key"] for entry in listed.get("Contents", [])]


def body_of(s3: S3Client, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def ids(events: Iterable[Event]) -> list[str]:
    return [event.event_id for event in events]


# --------------------------------------------------------------------------- key layout


def test_batch_is_filed_under_its_first_events_day_and_a_hash_of_its_ids(
    s3: S3Client, bucket: str
) -> None:
    # GIVEN a batch of stream 3 whose first Event occurred 1.75 s before midnight (UTC), its
    #   Event IDs in descending order (so the sorted IDs are not the batch order)
    batch = [event_at(T0 + timedelta(seconds=i), event_id=f"evt_{9 - i:032x}") for i in range(3)]
    assert batch[-1].timestamp.date() == date(2024, 2, 29)
    assert sorted(ids(batch)) != ids(batch)
    # WHEN it is written
    written = ArchiveWriter(s3, bucket).write_batch(3, batch)
    # THEN its key carries the first Event's day and epoch milliseconds and the first 16 hex
    # digits of SHA-256 over the sorted IDs joined by newlines
    first_ms = calendar.timegm((2024, 2, 28, 23, 59, 58)) * 1000 + 250
    digest = hashlib.sha256("\n".join(sorted(ids(batch))).encode()).hexdigest()[:16]
    expected = f"events/2024/02/28/stream-03/part-{first_ms}-{digest}.ndjson.gz"
    assert written.key == expected
    assert written.event_count == 3
    assert keys_in(s3, bucket) == [expected]
    # AND the key parses back into the same parts
    assert parse_archive_key(expected) == ArchiveKey(
        stream_index=3, day=date(2024, 2, 28), first_ms=first_ms, digest=digest
    )
    assert parse_archive_key(expected).key == expected


def test_same_batch_written_twice_is_one_object_with_the_same_bytes(
    s3: S3Client, bucket: str
) -> None:
    # GIVEN a batch already archived
    writer = ArchiveWriter(s3, bucket)
    batch = events_every_second(T0, 4)
    first = writer.write_batch(0, batch)
    first_body = body_of(s3, bucket, first.key)
    # WHEN the same batch is redelivered and written again
    second = writer.write_batch(0, batch)
    # THEN it overwrote the same object with identical bytes
    assert second == first
    assert keys_in(s3, bucket) == [first.key]
    assert body_of(s3, bucket, first.key) == first_body
    assert len(first_body) == first.bytes
    # ... as a redelivery minutes later would too: the gzip header carries no time (MTIME 0)
    assert first_body[4:8] == b"\x00\x00\x00\x00"


def test_object_body_is_gzip_ndjson_of_the_batch_in_order(s3: S3Client, bucket: str) -> None:
    # GIVEN a batch whose Events are not in ID order
    batch = events_every_second(T0, 5)
    # WHEN it is written
    written = ArchiveWriter(s3, bucket).write_batch(1, batch)
    # THEN the object is labelled gzip NDJSON
    stored = s3.get_object(Bucket=bucket, Key=written.key)
    assert stored["ContentType"] == "application/x-ndjson"
    assert stored["ContentEncoding"] == "gzip"
    # AND it holds one compact wire-JSON Event per line, in batch order
    lines = gzip.decompress(stored["Body"].read()).split(b"\n")
    assert lines[-1] == b""  # newline-terminated
    assert lines[:-1] == [event.to_json() for event in batch]
    assert [Event.parse(line) for line in lines[:-1]] == batch


# --------------------------------------------------------------------------- reading


def test_reader_streams_batches_back_in_order_and_a_duplicated_event_once(
    s3: S3Client, bucket: str
) -> None:
    # GIVEN stream 0: a batch e0..e2, then a recomposed redelivery e1..e4 (e1, e2 twice),
    # then a batch on the next day; written out of order
    e = events_every_second(T0 - timedelta(minutes=1), 5, "acme-web")
    late = events_every_second(T0 + timedelta(days=1), 2, "acme-web")
    # AND stream 1: a batch whose Events fall between stream 0's
    f = events_every_second(T0 - timedelta(minutes=1, microseconds=-500_000), 2, "acme-billing")
    writer = ArchiveWriter(s3, bucket)
    writer.write_batch(0, late)
    writer.write_batch(0, e[1:5])
    writer.write_batch(1, f)
    writer.write_batch(0, e[0:3])
    reader = ArchiveReader(s3, bucket)

    # WHEN stream 0 is read back
    # THEN its Events come in stream order, each once
    assert ids(reader.iter_events(0)) == ids(e + late)
    # AND stream 1 holds its own batch
    assert ids(reader.iter_events(1)) == ids(f)
    # WHEN every stream is read
    # THEN the streams are merged by time within a day, each stream in its own order
    assert ids(reader.iter_events()) == ids([e[0], f[0], e[1], f[1], e[2], e[3], e[4], *late])
    # WHEN a day range is given
    # THEN only objects filed on those days are read
    next_day = T0.date() + timedelta(days=1)
    assert ids(reader.iter_events(since=next_day)) == ids(late)
    assert ids(reader.iter_events(0, since=T0.date(), until=T0.date())) == ids(e)
    assert [k.stream_index for k in reader.list_objects(until=T0.date())] == [0, 0, 1]


def test_reader_names_the_object_and_line_of_a_corrupt_line(s3: S3Client, bucket: str) -> None:
    # GIVEN an archive object whose second line is not an Event
    good = event_at(T0)
    key = archive_key(2, [good])
    body = gzip.compress(good.to_json() + b"\n" + b'{"eventId": "evt_x"}\n', mtime=0)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    # WHEN the archive is read
    # THEN the error names the object key and the line
    with pytest.raises(
        ArchiveError, match=re.escape(f"line 2 of archive object s3://{bucket}/{key}")
    ):
        list(ArchiveReader(s3, bucket).iter_events())


def test_reader_refuses_an_object_under_events_that_is_not_an_archive_key(
    s3: S3Client, bucket: str
) -> None:
    # GIVEN a stray object under events/
    s3.put_object(Bucket=bucket, Key="events/notes.txt", Body=b"hello")
    # WHEN the archive is listed
    # THEN the error names the stray key
    with pytest.raises(ArchiveError, match=re.escape("'events/notes.txt' is not an archive key")):
        list(ArchiveReader(s3, bucket).list_objects())


# --------------------------------------------------------------------------- S3 down


def test_write_while_s3_is_down_is_unavailable_and_succeeds_once_it_is_back() -> None:
    # GIVEN a bucket on an S3 server of this test's own, and a client that does not retry
    server = S3ServerProcess()
    server.start()
    try:
        client: S3Client = boto3.client(
            "s3",
            endpoint_url=server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2),
        )
        name = f"archive-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=name)
        writer = ArchiveWriter(client, name)
        batch = events_every_second(T0, 3)
        # WHEN the server is down and a batch is written
        server.stop()
        with pytest.raises(ArchiveUnavailableError) as caught:
            writer.write_batch(5, batch)
        # THEN the error names bucket and key and says the batch will be retried
        message = str(caught.value)
        assert f"s3://{name}/{archive_key(5, batch)}" in message
        assert "will be retried" in message
        # WHEN the server is back (same port; moto keeps its buckets in-process) and the
        # batch is written again
        server.start()
        written = writer.write_batch(5, batch)
        # THEN the archive holds the whole batch
        assert keys_in(client, name) == [written.key]
        assert ids(ArchiveReader(client, name).iter_events(5)) == ids(batch)
    finally:
        server.stop()


# --------------------------------------------------------------------------- expiry


def newest_upload(s3: S3Client, bucket: str) -> datetime:
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return max(entry["LastModified"] for entry in listed)


def test_expiry_deletes_only_objects_older_than_365_days(s3: S3Client, bucket: str) -> None:
    # GIVEN two archive objects and an object outside the archive prefix
    writer = ArchiveWriter(s3, bucket)
    writer.write_batch(0, events_every_second(T0, 2))
    writer.write_batch(1, events_every_second(T0, 2, "acme-billing"))
    s3.put_object(Bucket=bucket, Key="reports/summary.json", Body=b"{}")
    clock = ManualClock(newest_upload(s3, bucket))
    # WHEN the pass runs 364 days after the uploads
    clock.advance(days=364)
    early = expire_archive(s3, bucket, now=clock.now())
    # THEN nothing is deleted
    assert early == ExpiryReport(deleted=0, examined=2, more=False)
    assert len(keys_in(s3, bucket, ARCHIVE_PREFIX)) == 2
    # WHEN it runs 366 days after the uploads
    clock.advance(days=2)
    late = expire_archive(s3, bucket, now=clock.now())
    # THEN both archive objects are gone and the other object is kept
    assert late == ExpiryReport(deleted=2, examined=2, more=False)
    assert keys_in(s3, bucket) == ["reports/summary.json"]


def test_expiry_keeps_an_object_exactly_max_age_old(s3: S3Client, bucket: str) -> None:
    # GIVEN one archive object
    ArchiveWriter(s3, bucket).write_batch(0, events_every_second(T0, 1))
    uploaded = newest_upload(s3, bucket)
    # WHEN the pass runs exactly 365 days after the upload
    # THEN the object is kept: only older objects expire
    at_limit = expire_archive(s3, bucket, now=uploaded + timedelta(days=365))
    assert at_limit.deleted == 0
    # WHEN it runs one millisecond later
    # THEN it is deleted
    past_limit = expire_archive(s3, bucket, now=uploaded + timedelta(days=365, milliseconds=1))
    assert past_limit.deleted == 1
    assert keys_in(s3, bucket) == []


def test_expiry_pass_stops_at_max_objects_and_reports_more(s3: S3Client, bucket: str) -> None:
    # GIVEN five expired archive objects
    writer = ArchiveWriter(s3, bucket)
    for stream in range(5):
        writer.write_batch(stream, events_every_second(T0, 1))
    now = ManualClock(newest_upload(s3, bucket)).advance(days=366)
    # WHEN bounded passes of two run one after another
    reports = [expire_archive(s3, bucket, now=now, max_objects=2) for _ in range(4)]
    # THEN each deletes at most two and says whether more are due
    assert [(r.deleted, r.more) for r in reports] == [(2, True), (2, True), (1, False), (0, False)]
    assert keys_in(s3, bucket) == []


def test_expiry_pass_that_deletes_exactly_max_objects_reports_no_more(
    s3: S3Client, bucket: str
) -> None:
    # GIVEN two expired archive objects
    writer = ArchiveWriter(s3, bucket)
    writer.write_batch(0, events_every_second(T0, 1))
    writer.write_batch(1, events_every_second(T0, 1))
    now = ManualClock(newest_upload(s3, bucket)).advance(days=366)
    # WHEN a pass capped at two runs
    # THEN it deletes both and reports nothing more due
    assert expire_archive(s3, bucket, now=now, max_objects=2) == ExpiryReport(2, 2, False)


# --------------------------------------------------------------------------- bad input


def test_empty_batch_is_refused_and_nothing_is_written(s3: S3Client, bucket: str) -> None:
    # WHEN an empty batch is written
    # THEN the error says the batch is empty and names the stream
    with pytest.raises(ArchiveError, match="empty batch of stream 04"):
        ArchiveWriter(s3, bucket).write_batch(4, [])
    # AND no object was written
    assert keys_in(s3, bucket) == []


@pytest.mark.parametrize("stream", [8, -1])
def test_stream_index_outside_0_to_7_is_refused_naming_it(stream: int) -> None:
    # GIVEN a valid batch
    batch = [event_at(T0)]
    # WHEN it is named for a stream that does not exist
    # THEN the error names the stream index
    with pytest.raises(ArchiveError, match=rf"stream index {stream} is outside 0\.\.7"):
        archive_key(stream, batch)


def test_reader_refuses_a_stream_index_outside_0_to_7(s3: S3Client, bucket: str) -> None:
    with pytest.raises(ArchiveError, match=r"stream index 8 is outside 0\.\.7"):
        ArchiveReader(s3, bucket).iter_events(8)  # refused at the call, before listing


@pytest.mark.parametrize(
    "key",
    [
        "archive/2024/02/28/stream-00/part-1709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/30/stream-00/part-1709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/28/stream-08/part-1709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/28/stream-0/part-1709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/29/stream-00/part-1709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/28/stream-00/part-1709164798250-0123456789ABCDEF.ndjson.gz",
        "events/2024/02/28/stream-00/part-1709164798250-0123456789abcde.ndjson.gz",
        "events/2024/02/28/stream-00/part-01709164798250-0123456789abcdef.ndjson.gz",
        "events/2024/02/28/stream-00/part-1709164798250-0123456789abcdef.ndjson",
        "",
    ],
)
def test_malformed_key_is_refused_naming_it(key: str) -> None:
    # WHEN a key that archive_key would not write is parsed
    # THEN the error names the key
    with pytest.raises(ArchiveError, match="^" + re.escape(f"{key!r} is not an archive key")):
        parse_archive_key(key)


def test_reader_refuses_a_range_that_ends_before_it_starts(s3: S3Client, bucket: str) -> None:
    with pytest.raises(ArchiveError, match="since 2024-03-02 is after until 2024-03-01"):
        ArchiveReader(s3, bucket).list_objects(since=date(2024, 3, 2), until=date(2024, 3, 1))
