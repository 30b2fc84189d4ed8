"""``GET /consumers``: every durable cursor with its lag; ``GET /capacity``: the router's
ceilings against the volume; ``GET /reconciliation``: the proof that the log holds every event
the outbox published.

Every event stream × subscription and every command queue's ``q-<queue>``, as JetStream
reports them (:mod:`rhumbatron.messaging.cursors`): records not yet delivered, delivered and
not yet acknowledged, and the last delivery's stream sequence and time. A cursor not created
yet is listed too, with ``exists: false``.

``consumers:read`` is a platform operator's scope: the counts span every tenant's records.
``GET /capacity`` and ``GET /reconciliation`` need it too: they read every tenant's events.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import Field

from rhumbatron.api.consumer_schemas import (
    CapacityBody,
    CeilingsBody,
    ConsumerBody,
    ConsumersBody,
    PauseBody,
    PauseRequest,
    ReconciliationBody,
    RepairBody,
    RepairRequest,
    RepairStepBody,
)
from rhumbatron.api.dependencies import ConsumersReader, LogRepairer, Runtime
from rhumbatron.api.errors import error_responses
from rhumbatron.core.clock import SystemClock
from rhumbatron.errors import InvalidRequestError, NatsUnavailableError
from rhumbatron.messaging.cursors import find_cursor, pause_cursor, read_cursors, resume_cursor

__all__ = ["router"]

router = APIRouter()


@contextmanager
def _jetstream(doing: str) -> Iterator[None]:
    """A dropped connection or a JetStream that does not answer while ``doing``: NATS is
    unavailable to this request (503), not a fault of the API."""
    from nats.errors import Error as NatsError

    try:
        yield
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(f"cannot {doing}: {type(exc).__name__}: {exc}") from exc


@router.get(
    "/consumers",
    response_model=ConsumersBody,
    summary="List every durable consumer with its lag",
    responses=error_responses(
        401,
        403,
        503,
        e403="The token lacks consumers:read, or is not a platform token (tenant '*'): "
        "the counts span every tenant.",
    ),
)
async def list_consumers(runtime: Runtime, principal: ConsumersReader) -> ConsumersBody:
    """Every event stream × subscription consumer, then every command queue's, each with
    ``numPending``, ``numAckPending`` and its last delivery, as JetStream reports them.
    Only a platform token may read them: they count every tenant's records."""
    nc = await runtime.nats()
    with _jetstream("read the consumers from JetStream"):
        lags = await read_cursors(nc.jetstream())
    return ConsumersBody(consumers=[ConsumerBody.of(lag) for lag in lags])


@router.get(
    "/capacity",
    response_model=CapacityBody,
    summary="The event router's ceilings against the volume sized for and observed",
    responses=error_responses(
        401,
        403,
        503,
        e403="The token lacks consumers:read, or is not a platform token (tenant '*'): "
        "the rates span every tenant.",
    ),
)
async def read_capacity(runtime: Runtime, principal: ConsumersReader) -> CapacityBody:
    """Every ceiling of the router's bounded jobs (events a day, all streams), the volume the
    deployment is sized for and the one its streams carry, the prune's chunk per tick, and the
    warnings the router logs (docs/operations.md, "The event router's ceilings")."""
    from rhumbatron.router.capacity import capacity_report

    nc = await runtime.nats()
    with _jetstream("read the streams' rates from JetStream"):
        report = await capacity_report(runtime.settings, nc)
    return CapacityBody(
        expected_events_per_day=report.expected_events_per_day,
        observed_events_per_day=round(report.observed_events_per_day or 0),
        tick_prune_rows=report.tick_prune_rows,
        ceilings=CeilingsBody(**report.ceilings.as_dict()),
        warnings=report.warnings,
        drain_mode=report.drain_mode,
    )


@router.get(
    "/reconciliation",
    response_model=ReconciliationBody,
    summary="Prove the log holds every event the outbox published, per replica",
    responses=error_responses(
        401,
        403,
        422,
        503,
        e403="The token lacks consumers:read, or is not a platform token (tenant '*'): "
        "the proof reads every tenant's events.",
    ),
)
async def read_reconciliation(
    runtime: Runtime,
    principal: ConsumersReader,
    stream: Annotated[
        list[Annotated[int, Field(ge=0, le=7)]] | None,
        Query(description="Event stream indexes to check (0-7, repeatable); default: all."),
    ] = None,
) -> ReconciliationBody:
    """Per event stream and replica, the events the outbox published within the window, those
    the replica holds and every missing event ID; each replica's own counts; and the events no
    replica holds (docs/operations.md, "Log gap detected"). It reads every replica's copy: on
    a large window this takes seconds per 10^4 events."""
    with _jetstream("read the streams from JetStream"):
        report = await runtime.reconcile(stream)
    return ReconciliationBody.model_validate(report.as_json())


@router.post(
    "/reconciliation/repair",
    response_model=RepairBody,
    summary="Repair the streams whose replica lost events (dry run first)",
    responses=error_responses(
        401,
        403,
        422,
        503,
        e403="The token lacks consumers:write, or is not a platform token (tenant '*').",
    ),
)
async def repair_log(runtime: Runtime, principal: LogRepairer, body: RepairRequest) -> RepairBody:
    """Reconciles the streams, then makes nothing worse: where a stream's leader lost
    events and a healthy replica holds them all, the lead moves there; the events no
    replica holds are published again from their outbox rows (they land after the stream's
    newer events); each damaged replica to rebuild is listed for an operator
    (docs/operations.md, "Log gap detected"). ``dryRun`` says what it would do. Audited,
    like every mutation (``GET /audit``)."""
    with _jetstream("repair the streams through JetStream"):
        report = await runtime.reconcile(body.streams)
        steps = await runtime.repair_log(report, dry_run=body.dry_run)
    return RepairBody(
        dry_run=body.dry_run,
        gap=bool(report.gaps),
        steps=[RepairStepBody.model_validate(step.as_json()) for step in steps],
    )


#: The longest pause an operator may ask for: a forgotten pause ends by itself.
MAX_PAUSE = timedelta(days=7)
_StreamName = Annotated[str, Path(max_length=64)]
_ConsumerName = Annotated[str, Path(max_length=64)]
_CURSOR_ACTION_ERRORS = error_responses(
    401,
    403,
    404,
    422,
    503,
    e403="The token lacks consumers:write, or is not a platform token (tenant '*').",
    e404="The system has no durable cursor of that name on that stream.",
)


@router.post(
    "/consumers/{stream}/{consumer}/pause",
    response_model=PauseBody,
    summary="Pause a durable cursor until a time (it resumes by itself then)",
    responses=_CURSOR_ACTION_ERRORS,
)
async def pause_consumer(
    runtime: Runtime,
    principal: LogRepairer,
    stream: _StreamName,
    consumer: _ConsumerName,
    body: PauseRequest,
) -> PauseBody:
    """JetStream delivers nothing to the cursor until ``until``: its subscription or queue
    waits (what arrives meanwhile stays on the stream, nothing is lost), then resumes by
    itself. Use it to hold a subscription or a queue while its cause is fixed; resume it
    with ``/resume``. At most 7 days ahead. Audited."""
    cursor = find_cursor(stream, consumer)
    # JetStream keeps a pause by the servers' wall clock, not by this runtime's clock.
    now = SystemClock().now()
    if not now < body.until <= now + MAX_PAUSE:
        raise InvalidRequestError(
            f"until {body.until.isoformat()} must be after now ({now.isoformat()}) and at "
            f"most {MAX_PAUSE.days} days ahead",
            field="until",
        )
    with _jetstream(f"pause {consumer} on {stream}"):
        until = await pause_cursor((await runtime.nats()).jetstream(), cursor, body.until)
    return PauseBody(stream=stream, consumer=consumer, paused_until=until)


@router.post(
    "/consumers/{stream}/{consumer}/resume",
    response_model=PauseBody,
    summary="Resume a paused durable cursor now",
    responses=_CURSOR_ACTION_ERRORS,
)
async def resume_consumer(
    runtime: Runtime,
    principal: LogRepairer,
    stream: _StreamName,
    consumer: _ConsumerName,
) -> PauseBody:
    """JetStream delivers to the cursor again at once (one not paused stays as it is).
    Audited."""
    cursor = find_cursor(stream, consumer)
    with _jetstream(f"resume {consumer} on {stream}"):
        await resume_cursor((await runtime.nats()).jetstream(), cursor)
    return PauseBody(stream=stream, consumer=consumer, paused_until=None)
