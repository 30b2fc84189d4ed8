"""The replay API's request and response bodies: frozen pydantic models, camelCase on the
wire, like :mod:`rhumbatron.api.schemas`.

A request says its source and range; its own values are checked here, so a replay that
cannot be asked for is a 422 naming the field before anything reads a stream.
"""

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

if TYPE_CHECKING:
    from rhumbatron.router.replay import ReplayReport

__all__ = ["ReplayBody", "ReplayRequest"]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class ReplayRequest(_Wire):
    """What to replay. ``source: stream`` rewinds ``stream`` from ``toSeq`` or ``toTime``
    (exactly one); ``source: archive`` reads the archive's ``[start, end)``, of ``stream`` or
    of every stream when it is left out."""

    source: Literal["stream", "archive"]
    subscription: Subscription
    dry_run: bool = Field(description="Count what would apply; change nothing.")
    stream: int | None = Field(
        default=None, ge=0, le=EVENT_STREAM_COUNT - 1, description="The event stream's index."
    )
    to_seq: int | None = Field(
        default=None, ge=1, le=2**63 - 1, description="Rewind from this sequence."
    )
    to_time: AwareDatetime | None = Field(
        default=None, description="Rewind from the first event stored at or after this time."
    )
    start: AwareDatetime | None = Field(default=None, description="Archive range start.")
    end: AwareDatetime | None = Field(default=None, description="Archive range end (excluded).")

    @field_validator("to_time", "start", "end")
    @classmethod
    def _in_utc_range(cls, value: datetime | None) -> datetime | None:
        # 9999-12-31T23:59:59-05:00 is a valid ISO time with no UTC equivalent: the archive
        # reader's arithmetic would raise OverflowError (a 500) far from here.
        if value is None:
            return None
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError(
                f"{value.isoformat()} has no UTC equivalent between years 1 and 9999"
            ) from None

    @model_validator(mode="after")
    def _fits_source(self) -> Self:
        if self.source == "stream":
            if self.stream is None:
                raise ValueError("a stream replay needs stream (the index to rewind)")
            if (self.to_seq is None) == (self.to_time is None):
                raise ValueError("a stream replay needs exactly one of toSeq and toTime")
            if self.start is not None or self.end is not None:
                raise ValueError("start and end belong to an archive replay")
        else:
            if self.start is None or self.end is None:
                raise ValueError("an archive replay needs start and end")
            if not self.start < self.end:
                raise ValueError("start must be before end (the range is [start, end))")
            if self.to_seq is not None or self.to_time is not None:
                raise ValueError("toSeq and toTime belong to a stream replay")
            if self.subscription is Subscription.AUDIT_ARCHIVER:
                raise ValueError("the archive is the audit-archiver's own output")
        return self


class ReplayBody(_Wire):
    """What the replay found and did (see :class:`~rhumbatron.router.replay.ReplayReport`)."""

    source: Literal["stream", "archive"]
    subscription: Subscription
    stream: int | None
    dry_run: bool
    scanned: int = Field(description="Records read in the range.")
    applied: int = Field(description="Took effect now (0 in a dry run).")
    would_apply: int = Field(description="A dry run: no claim yet, so it would take effect.")
    already_applied: int = Field(description="Its claim was done: a duplicate, no effect.")
    in_flight: int = Field(description="A dry run: another run holds its lease.")
    retried: int = Field(description="Not applied now (a held lease, a busy file, S3 down).")
    failed: int = Field(description="Could not be applied; errors says why.")
    errors: list[str] = Field(description="The first reasons of retried and failed records.")
    first_seq: int | None = Field(description="The first stream sequence read (a rewind).")
    last_seq: int | None = Field(description="The stream's last sequence at the start.")
    start: AwareDatetime | None
    end: AwareDatetime | None

    @classmethod
    def of(cls, report: "ReplayReport") -> "ReplayBody":
        """``report`` as answered."""
        return cls(
            source=report.source.value,
            subscription=report.subscription,
            stream=report.stream_index,
            dry_run=report.dry_run,
            scanned=report.scanned,
            applied=report.applied,
            would_apply=report.would_apply,
            already_applied=report.already_applied,
            in_flight=report.in_flight,
            retried=report.retried,
            failed=report.failed,
            errors=report.errors,
            first_seq=report.first_seq,
            last_seq=report.last_seq,
            start=report.start,
            end=report.end,
        )
