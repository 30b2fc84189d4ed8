"""``POST /replays``: re-drive one subscription from a point of an event stream or from a time
range of the S3 archive (:mod:`rhumbatron.router.replay`).

Only the ``(consumer, event_id)`` claims decide what takes effect, so a replay asked twice,
or while the live cursor consumes, has no second effect; ``dryRun`` answers how many events
would apply and how many already did, and changes nothing. The replay runs within the
request: keep a range an API request can read (the CLI has no such bound).

``replay:write`` is a platform operator's scope: a replay reads every tenant's events of a
stream (each applies only what the live cursor would have applied), so grant it only to the
platform's operators.
"""

import logging

from fastapi import APIRouter

from rhumbatron.api.dependencies import Replayer, Runtime
from rhumbatron.api.errors import error_responses
from rhumbatron.api.replay_schemas import ReplayBody, ReplayRequest
from rhumbatron.errors import (
    ArchiveDamagedError,
    ArchiveError,
    InvalidRequestError,
    UnavailableError,
)

__all__ = ["router"]

_log = logging.getLogger(__name__)

_RESPONSES = error_responses(
    401,
    403,
    409,
    422,
    503,
    e403="The token lacks replay:write, or is not a platform token (tenant '*'): a replay "
    "reads every tenant's events of a stream.",
)
_RESPONSES[409] = {**_RESPONSES[409], "description": "An archive object of the range is damaged."}

router = APIRouter()


@router.post(
    "/replays",
    response_model=ReplayBody,
    summary="Replay a subscription from a stream point or the archive",
    responses=_RESPONSES,
)
async def replay(runtime: Runtime, principal: Replayer, body: ReplayRequest) -> ReplayBody:
    """Re-drives ``subscription`` through its claims: only events it never applied take
    effect, so asking again (or while the router consumes) has no second effect. With
    ``dryRun`` nothing changes and the answer counts what would apply. Only a platform
    token may replay: a stream holds every tenant's events."""
    # Imported here: the router and the archive reader are no part of the API's cold start.
    from rhumbatron.errors import ArchiveUnavailableError, ReplayError
    from rhumbatron.router.replay import run_replay

    _log.info(
        "api: replay %s %s stream %s by %s (dry run: %s)",
        body.source,
        body.subscription.value,
        body.stream,
        principal.subject,
        body.dry_run,
    )
    try:
        report = await run_replay(
            runtime,
            source=body.source,
            subscription=body.subscription,
            dry_run=body.dry_run,
            stream=body.stream,
            to_seq=body.to_seq,
            to_time=body.to_time,
            start=body.start,
            end=body.end,
        )
    except ReplayError as exc:
        raise InvalidRequestError(str(exc)) from None
    except ArchiveUnavailableError as exc:
        raise UnavailableError(str(exc), code="archive_unavailable") from None
    except ArchiveError as exc:
        raise ArchiveDamagedError(str(exc)) from None
    return ReplayBody.of(report)
