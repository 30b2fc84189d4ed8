"""Write one audit-archiver batch as one gzip NDJSON object in the evidence bucket."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.archive.keys import archive_key
from rhumbatron.errors import ArchiveUnavailableError, ConfigurationError
from rhumbatron.protocol.envelopes import Event

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "NDJSON_CONTENT_TYPE",
    "ArchiveWriter",
    "ArchivedObject",
    "encode_batch",
]

NDJSON_CONTENT_TYPE = "application/x-ndjson"


@dataclass(frozen=True)
class ArchivedObject:
    """One archive object as written: its key, how many Events it holds, its gzip size."""

    key: str
    event_count: int
    #: Size of the stored (gzip) body, in bytes.
    bytes: int


def encode_batch(events: Sequence[Event]) -> bytes:
    """The object body: each Event's wire JSON on its own line, in batch order, gzipped.

    ``mtime=0`` (and no file name, which :func:`gzip.compress` never writes) keeps the gzip
    header free of the time of writing, so a redelivered batch produces identical bytes.
    """
    ndjson = b"".join(event.to_json() + b"\n" for event in events)
    return gzip.compress(ndjson, mtime=0)


class BucketClient:
    """A boto3 S3 client bound to the evidence bucket (the writer's and the reader's base)."""

    def __init__(self, s3_client: S3Client, bucket: str) -> None:
        if not bucket:
            raise ConfigurationError(
                "the archive bucket name is empty; set RHUMBATRON_EVIDENCE_BUCKET"
            )
        self._s3 = s3_client
        self._bucket = bucket

    @property
    def bucket(self) -> str:
        """The evidence bucket."""
        return self._bucket


class ArchiveWriter(BucketClient):
    """Writes audit-archiver batches to ``bucket`` through a boto3 S3 client.

    The client is synchronous: the event router calls it on a worker thread.
    """

    def write_batch(self, stream_index: int, events: Sequence[Event]) -> ArchivedObject:
        """Put ``events`` (one batch of stream ``stream_index``, in stream order) as one object.

        The key is derived from the batch (see :func:`~rhumbatron.archive.keys.archive_key`),
        so writing the same batch again overwrites the same object with the same bytes.
        Raises :class:`ArchiveError` for an empty batch or a bad stream index, and
        :class:`ArchiveUnavailableError` when S3 cannot be reached or refuses the PUT.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        key = archive_key(stream_index, events)
        body = encode_batch(events)
        try:
            self._s3.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=body,
                ContentType=NDJSON_CONTENT_TYPE,
                ContentEncoding="gzip",
            )
        except (BotoCoreError, ClientError) as exc:
            raise ArchiveUnavailableError(
                f"could not write archive object s3://{self._bucket}/{key} "
                f"(a batch of {len(events)} from stream {stream_index:02d}): {exc}; "
                "the batch will be retried (leave its messages unacknowledged)"
            ) from exc
        return ArchivedObject(key=key, event_count=len(events), bytes=len(body))
