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
    from nats.errors import Error as NatsError

    nc = await runtime.nats()
    try:
        lags = await read_cursors(nc.jetstream())
    except (NatsError, TimeoutError) as exc:
        # A dropped connection or a JetStream that does not answer: NATS is unavailable
        # to this request (503), not a fault of the API.
        raise NatsUnavailableError(
            f"cannot read the consumers from JetStream: {type(exc).__name__}: {exc}"
        ) from exc
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
    from nats.errors import Error as NatsError

    from rhumbatron.router.capacity import capacity_report

    nc = await runtime.nats()
    try:
        report = await capacity_report(runtime.settings, nc)
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot read the streams' rates from JetStream: {type(exc).__name__}: {exc}"
        ) from exc
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
    from nats.errors import Error as NatsError

    try:
        report = await runtime.reconcile(stream)
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot read the streams from JetStream: {type(exc).__name__}: {exc}"
        ) from exc
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
    events and a healthy replica holds them all, the lead moves there; each damaged replica
    to rebuild and the events no replica holds are listed for an operator, not acted on
    (docs/operations.md, "Log gap detected"). ``dryRun`` says what it would do. Audited,
    like every mutation (``GET /audit``)."""
    from nats.errors import Error as NatsError

    try:
        report = await runtime.reconcile(body.streams)
        steps = await runtime.repair_log(report, dry_run=body.dry_run)
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot repair the streams through JetStream: {type(exc).__name__}: {exc}"
        ) from exc
    return RepairBody(
        dry_run=body.dry_run,
        gap=bool(report.gaps),
        steps=[RepairStepBody.model_validate(step.as_json()) for step in steps],
    )


#: The longest pause an operator may ask for: a forgotten pause ends by itself.
MAX_PAUSE = timedelta(days=7)


@router.post(
    "/consumers/{stream}/{consumer}/pause",
    response_model=PauseBody,
    summary="Pause a durable cursor until a time (it resumes by itself then)",
    responses=error_responses(
        401,
        403,
        404,
        422,
        503,
        e403="The token lacks consumers:write, or is not a platform token (tenant '*').",
        e404="The system has no durable cursor of that name on that stream.",
    ),
)
async def pause_consumer(
    runtime: Runtime,
    principal: LogRepairer,
    stream: Annotated[str, Path(max_length=64)],
    consumer: Annotated[str, Path(max_length=64)],
    body: PauseRequest,
) -> PauseBody:
    """JetStream delivers nothing to the cursor until ``until``: its subscription or queue
    waits (what arrives meanwhile stays on the stream, nothing is lost), then resumes by
    itself. Use it to hold a subscription or a queue while its cause is fixed; resume it
    with ``/resume``. At most 7 days ahead. Audited."""
    from nats.errors import Error as NatsError

    cursor = find_cursor(stream, consumer)
    # JetStream keeps a pause by the servers' wall clock, not by this runtime's clock.
    now = SystemClock().now()
    if not now < body.until <= now + MAX_PAUSE:
        raise InvalidRequestError(
            f"until {body.until.isoformat()} must be after now ({now.isoformat()}) and at "
            f"most {MAX_PAUSE.days} days ahead",
            field="until",
        )
    try:
        until = await pause_cursor((await runtime.nats()).jetstream(), cursor, body.until)
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot pause {consumer} on {stream}: {type(exc).__name__}: {exc}"
        ) from exc
    return PauseBody(stream=stream, consumer=consumer, paused_until=until)


@router.post(
    "/consumers/{stream}/{consumer}/resume",
    response_model=PauseBody,
    summary="Resume a paused durable cursor now",
    responses=error_responses(
        401,
        403,
        404,
        422,
        503,
        e403="The token lacks consumers:write, or is not a platform token (tenant '*').",
        e404="The system has no durable cursor of that name on that stream.",
    ),
)
async def resume_consumer(
    runtime: Runtime,
    principal: LogRepairer,
    stream: Annotated[str, Path(max_length=64)],
    consumer: Annotated[str, Path(max_length=64)],
) -> PauseBody:
    """JetStream delivers to the cursor again at once (one not paused stays as it is).
    Audited."""
    from nats.errors import Error as NatsError

    cursor = find_cursor(stream, consumer)
    try:
        await resume_cursor((await runtime.nats()).jetstream(), cursor)
    except (NatsError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"cannot resume {consumer} on {stream}: {type(exc).__name__}: {exc}"
        ) from exc
    return PauseBody(stream=stream, consumer=consumer, paused_until=None)
