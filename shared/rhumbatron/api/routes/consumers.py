"""``GET /consumers``: every durable cursor with its lag.

Every event stream × subscription and every command queue's ``q-<queue>``, as JetStream
reports them (:mod:`rhumbatron.messaging.cursors`): records not yet delivered, delivered and
not yet acknowledged, and the last delivery's stream sequence and time. A cursor not created
yet is listed too, with ``exists: false``.

``consumers:read`` is a platform operator's scope: the counts span every tenant's records.
"""

from fastapi import APIRouter

from rhumbatron.api.consumer_schemas import ConsumerBody, ConsumersBody
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
