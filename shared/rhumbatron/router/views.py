"""Rebuilding the project views from the log: ``rhumbatron views rebuild [--project ID]``.

A view is derived state (DECISIONS, "View store"): everything in it follows from the
project's events. A rebuild forgets the views, feed rows and projector claims of the project
(or of every project of the stream), then replays the projector over the events: from the
stream's first stored record to its end, then from the S3 archive for what the stream no
longer holds (its max age, or a purge). The archive keeps events, not their stream positions:
a feed row rebuilt from it has position 0, "not known". The replay goes through the
projector's own claims, so a projector running meanwhile and the rebuild apply each event
once between them; a row an older event would move back stays where the newer one put it.

Between the forget and the end of the replay the view is incomplete: a reader sees it fill
up again. Dead letters' marks are kept: a poison event stays skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from rhumbatron.core.progress import ProgressCallback
from rhumbatron.errors import ArchiveError, EnvelopeError, ReplayError
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.fast_decode import decode_event
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, stream_index
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.replay import ReplayReport, replay_archive, rewind
from rhumbatron.router.replay_stream import nats_errors

__all__ = ["ViewsRebuild", "rebuild_views"]

_log = logging.getLogger(__name__)
#: The archive is read from here when the stream no longer holds its first events.
_BEGINNING = datetime(2000, 1, 1, tzinfo=UTC)
#: An Event's timestamp is in milliseconds: the archive's ``[start, end)`` ends one later.
_ONE_MILLISECOND = timedelta(milliseconds=1)


@dataclass
class ViewsRebuild:
    """What a rebuild did, per stream: the claims it forgot and the two replays."""

    project_id: str | None
    streams: list[int] = field(default_factory=list)
    forgotten_claims: int = 0
    replays: list[ReplayReport] = field(default_factory=list)
    #: Why part of the history could not be read (the archive down, say): the views hold
    #: what the stream holds, and a later rebuild can fill in the rest.
    gaps: list[str] = field(default_factory=list)

    @property
    def applied(self) -> int:
        return sum(r.applied for r in self.replays)

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.replays)

    def as_json(self) -> dict[str, object]:
        return {
            "projectId": self.project_id,
            "streams": [event_stream_name(s) for s in self.streams],
            "forgottenClaims": self.forgotten_claims,
            "scanned": sum(r.scanned for r in self.replays),
            "applied": self.applied,
            "alreadyApplied": sum(r.already_applied for r in self.replays),
            "retried": sum(r.retried for r in self.replays),
            "failed": self.failed,
            "errors": [e for r in self.replays for e in r.errors],
            "gaps": self.gaps,
        }


async def rebuild_views(
    router: EventRouter,
    *,
    project_id: str | None = None,
    stream: int | None = None,
    progress: ProgressCallback | None = None,
) -> ViewsRebuild:
    """Rebuild the views of ``project_id`` (its stream), of every project of ``stream``, or of
    every project (neither given); ``progress`` hears the streams done of those to rebuild,
    with a line saying what each applied. Raises
    :class:`ReplayError` for a bad argument and
    :class:`~rhumbatron.errors.NatsUnavailableError` when NATS does not answer."""
    if project_id is not None and stream is not None:
        raise ReplayError("give a project or a stream to rebuild, not both")
    if stream is not None and not 0 <= stream < EVENT_STREAM_COUNT:
        raise ReplayError(f"stream {stream} is outside 0..{EVENT_STREAM_COUNT - 1}")
    if project_id is not None:
        streams = [stream_index(project_id)]
    elif stream is not None:
        streams = [stream]
    else:
        streams = list(range(EVENT_STREAM_COUNT))
    result = ViewsRebuild(project_id, streams)
    for done, index in enumerate(streams, start=1):
        replays = len(result.replays)
        await _rebuild_stream(router, index, project_id, result)
        if progress is not None:
            applied = sum(r.applied for r in result.replays[replays:])
            progress(
                done,
                len(streams),
                f"{event_stream_name(index)} rebuilt ({done}/{len(streams)}): "
                f"{applied} events applied",
            )
    return result


async def _rebuild_stream(
    router: EventRouter, index: int, project_id: str | None, result: ViewsRebuild
) -> None:
    store = router.projector.views(index)
    result.forgotten_claims += store.forget(project_id)
    store.lost = False
    name = event_stream_name(index)
    with nats_errors(name):
        js = (await router.connect()).jetstream()
        state = (await js.stream_info(name)).state
    first_seq = state.first_seq or 1
    if state.messages == 0 and state.last_seq == 0:
        return  # nothing was ever published here
    if state.messages:
        result.replays.append(
            await rewind(
                router,
                stream_index=index,
                subscription=Subscription.PROJECT_VIEW_PROJECTOR,
                to_seq=first_seq,
                dry_run=False,
            )
        )
    if first_seq > 1:
        # The stream dropped its first records: they are in the archive, up to the first
        # event it still holds, that event's millisecond included (events dropped in the
        # same millisecond would be lost otherwise). The stream went first, so each event it
        # holds is applied at its place, and one the two share is a claim already done;
        # a dropped event comes after newer ones, as a late redelivery does, and moves no
        # row back.
        end = await _first_event_time(router, index, first_seq) if state.messages else None
        end = (end or router.clock.now()) + _ONE_MILLISECOND
        try:
            result.replays.append(
                await replay_archive(
                    router,
                    stream_index=index,
                    subscription=Subscription.PROJECT_VIEW_PROJECTOR,
                    start=_BEGINNING,
                    end=end,
                    dry_run=False,
                )
            )
        except ArchiveError as exc:
            gap = f"{name} before sequence {first_seq}: the archive could not be read ({exc})"
            _log.error("views rebuild: %s", gap)
            result.gaps.append(gap)


async def _first_event_time(router: EventRouter, index: int, first_seq: int) -> datetime | None:
    """The timestamp of the first event the stream holds; None when it does not decode."""
    raw = await (await router.event_log()).read_at(index, first_seq)
    if raw is None:
        return None
    try:
        return decode_event(raw).timestamp
    except EnvelopeError:
        return None
