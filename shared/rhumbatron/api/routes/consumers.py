"""``GET /consumers``: every durable cursor with its lag; ``GET /capacity``: the router's
ceilings against the volume.

Every event stream × subscription and every command queue's ``q-<queue>``, as JetStream
reports them (:mod:`rhumbatron.messaging.cursors`): records not yet delivered, delivered and
not yet acknowledged, and the last delivery's stream sequence and time. A cursor not created
yet is listed too, with ``exists: false``.

``consumers:read`` is a platform operator's scope: the counts span every tenant's records.
``GET /capacity`` needs it too: its rates are every tenant's (``router.capacity``).
"""

from fastapi import APIRouter

from rhumbatron.api.consumer_schemas import (
    CapacityBody,
    CeilingsBody,
    ConsumerBody,
    ConsumersBody,
)
from rhumbatron.api.dependencies import ConsumersReader, Runtime
from rhumbatron.api.errors import error_responses
from rhumbatron.errors import NatsUnavailableError
from rhumbatron.messaging.cursors import read_cursors

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
    )
