"""Delete archive objects 365 days after upload where the store has no lifecycle rule.

In the cloud the evidence bucket's lifecycle rule (template.yaml) expires ``events/`` itself;
moto, the local store, has none, so the daily tick runs :func:`expire_archive` instead. Each
call is a bounded pass: it deletes at most ``max_objects`` and says whether more are due.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from rhumbatron.archive.keys import ARCHIVE_PREFIX, day_prefix
from rhumbatron.errors import ArchiveError, ArchiveUnavailableError, ConfigurationError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectTypeDef

__all__ = ["ARCHIVE_MAX_AGE_DAYS", "ExpiryReport", "expire_archive"]

#: The spec's archive retention: objects are deleted this many days after upload.
ARCHIVE_MAX_AGE_DAYS = 365.0

# S3 DeleteObjects takes at most 1000 keys per request.
_DELETE_CHUNK = 1000


@dataclass(frozen=True)
class ExpiryReport:
    """What one expiry pass did.

    ``examined`` counts the objects listed, ``deleted`` those removed, and ``more`` is true
    when the pass stopped at ``max_objects`` with expired objects still left.
    """

    deleted: int
    examined: int
    more: bool


def expire_archive(
    s3_client: S3Client,
    bucket: str,
    *,
    now: datetime,
    max_age_days: float = ARCHIVE_MAX_AGE_DAYS,
    max_objects: int = 1000,
) -> ExpiryReport:
    """Delete objects under ``events/`` whose ``LastModified`` is before ``now - max_age_days``.

    ``now`` comes from the caller's clock, so a test moves a clock instead of waiting a year.
    Deletes at most ``max_objects`` in one call; run it again while ``more`` is true. Raises
    :class:`ArchiveUnavailableError` when S3 cannot be listed or written, and
    :class:`ArchiveError` when S3 refused to delete some objects (they stay due, so the next
    pass tries again).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if now.tzinfo is None:
        raise ConfigurationError(f"expiry needs a timezone-aware now, got {now.isoformat()}")
    if not max_age_days > 0:
        raise ConfigurationError(f"max_age_days must be positive, got {max_age_days}")
    if max_objects < 1:
        raise ConfigurationError(f"max_objects must be at least 1, got {max_objects}")
    cutoff = now - timedelta(days=max_age_days)
    # Keys are filed by their first Event's day and uploaded after it occurred, so an object
    # filed later than the cutoff's next day cannot be due yet (the extra day absorbs clock
    # skew). Keys sort by day, so the listing stops there instead of paging through a year.
    horizon = day_prefix(cutoff.astimezone(UTC).date() + timedelta(days=2))

    due: list[str] = []
    examined = 0
    more = False
    try:
        for entry in _listed(s3_client, bucket):
            key = entry["Key"]
            if key >= horizon:
                break
            examined += 1
            if entry["LastModified"] < cutoff:
                if len(due) == max_objects:
                    more = True
                    break
                due.append(key)
        deleted = _delete(s3_client, bucket, due)
    except (BotoCoreError, ClientError) as exc:
        raise ArchiveUnavailableError(
            f"archive expiry in s3://{bucket}/{ARCHIVE_PREFIX} failed: {exc}; "
            "the objects stay due and the next pass deletes them"
        ) from exc
    return ExpiryReport(deleted=deleted, examined=examined, more=more)


def _listed(s3_client: S3Client, bucket: str) -> Iterator[ObjectTypeDef]:
    pages = s3_client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=ARCHIVE_PREFIX
    )
    for page in pages:
        yield from page.get("Contents", [])


def _delete(s3_client: S3Client, bucket: str, keys: list[str]) -> int:
    deleted = 0
    for start in range(0, len(keys), _DELETE_CHUNK):
        chunk = keys[start : start + _DELETE_CHUNK]
        response = s3_client.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True},
        )
        # DeleteObjects answers 200 even when single keys fail; they are listed in Errors.
        errors = response.get("Errors", [])
        deleted += len(chunk) - len(errors)
        if errors:
            first = errors[0]
            raise ArchiveError(
                f"S3 refused to delete {len(errors)} of {len(chunk)} expired archive objects "
                f"in s3://{bucket} (deleted {deleted} in this pass); first: "
                f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}; "
                "they stay due and the next pass tries again"
            )
    return deleted
