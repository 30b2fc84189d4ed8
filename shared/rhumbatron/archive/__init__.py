"""The S3 audit archive: one gzip NDJSON object per audit-archiver batch, kept 365 days.

Objects live at ``events/<yyyy>/<mm>/<dd>/stream-<NN>/part-<firstMs>-<hash>.ndjson.gz`` in the
evidence bucket. :class:`ArchiveWriter` puts a batch, :class:`ArchiveReader` streams Events
back in order and once each, :func:`expire_archive` deletes what a lifecycle rule would where
the store has none (moto locally).
"""

from rhumbatron.archive.expiry import ARCHIVE_MAX_AGE_DAYS, ExpiryReport, expire_archive
from rhumbatron.archive.keys import ARCHIVE_PREFIX, ArchiveKey, archive_key, parse_archive_key
from rhumbatron.archive.reader import ArchiveReader
from rhumbatron.archive.writer import ArchivedObject, ArchiveWriter
from rhumbatron.errors import ArchiveError, ArchiveUnavailableError

__all__ = [
    "ARCHIVE_MAX_AGE_DAYS",
    "ARCHIVE_PREFIX",
    "ArchiveError",
    "ArchiveKey",
    "ArchiveReader",
    "ArchiveUnavailableError",
    "ArchiveWriter",
    "ArchivedObject",
    "ExpiryReport",
    "archive_key",
    "expire_archive",
    "parse_archive_key",
]
