"""The consumers API: ``GET /consumers`` lists every durable cursor with its lag.

Every event stream × subscription and every command queue's ``q-<queue>``, as JetStream
reports them (:mod:`rhumbatron.messaging.cursors`): records not yet delivered, delivered and
not yet acknowledged, and the last delivery's stream sequence and time. A cursor not created
yet is listed too, with ``exists: false``.

``consumers:read`` is a platform operator's scope: the counts span every tenant's records.
"""

# No ``from __future__ import annotations`` here, on purpose (as in ``lifecycle_routes``): the
# route is a closure over the principal dependency it is given, and FastAPI resolves string
# annotations against the module's globals only.

import logging
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.api.auth import SCOPE_CONSUMERS_READ, Principal, platform_principal
from rhumbatron.api.errors import error_responses
from rhumbatron.api.lifecycle_routes import PrincipalDependency
from rhumbatron.errors import NatsUnavailableError
from rhumbatron.messaging.cursors import CursorKind, CursorLag, read_cursors
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["ConsumerBody", "ConsumersBody", "consumers_router"]

_log = logging.getLogger(__name__)


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class ConsumerBody(_Wire):
    """One durable consumer and its lag."""

    kind: CursorKind = Field(description="event: a subscription's; command: a queue's.")
    stream: str = Field(description="The stream it reads (EVENTS_NN or COMMANDS).")
    consumer: str = Field(description="The durable consumer's name.")
    subscription: str | None = Field(description="The subscription (an event consumer).")
    queue: str | None = Field(description="The queue (a command consumer).")
    exists: bool = Field(description="False: not created yet; it lags by all it would read.")
    num_pending: int = Field(ge=0, description="Records not yet delivered to it.")
    num_ack_pending: int = Field(ge=0, description="Delivered, not yet acknowledged.")
    last_delivered_seq: int = Field(ge=0, description="Stream sequence last delivered (0: none).")
    last_delivered_at: AwareDatetime | None = Field(description="When it was last delivered to.")

    @classmethod
    def of(cls, lag: CursorLag) -> "ConsumerBody":
        cursor = lag.cursor
        return cls(
            kind=cursor.kind,
            stream=cursor.stream,
            consumer=cursor.consumer,
            subscription=cursor.reads if cursor.kind is CursorKind.EVENT else None,
            queue=cursor.reads if cursor.kind is CursorKind.COMMAND else None,
            exists=lag.exists,
            num_pending=lag.num_pending,
            num_ack_pending=lag.num_ack_pending,
            last_delivered_seq=lag.last_delivered_seq,
            last_delivered_at=lag.last_delivered_at,
        )


class ConsumersBody(_Wire):
    """Every durable consumer: the event streams' (stream × subscription), then the queues'."""

    consumers: list[ConsumerBody]


def consumers_router(app: Rhumbatron, principal: PrincipalDependency) -> APIRouter:
    """The consumers route over ``app``; ``principal`` is the API's authenticating dependency
    (``app._principal``), so the route answers 401 / 403 like every other."""
    # A platform token only: the counts span every tenant's records.
    Reader = Annotated[
        Principal,
        Depends(
            platform_principal(principal, scope=SCOPE_CONSUMERS_READ, doing="the consumers' lag")
        ),
    ]
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
    async def list_consumers(principal: Reader) -> ConsumersBody:
        """Every event stream × subscription consumer, then every command queue's, each with
        ``numPending``, ``numAckPending`` and its last delivery, as JetStream reports them.
        Only a platform token may read them: they count every tenant's records."""
        from nats.errors import Error as NatsError

        nc = await app.nats()
        try:
            lags = await read_cursors(nc.jetstream())
        except (NatsError, TimeoutError) as exc:
            # A dropped connection or a JetStream that does not answer: NATS is unavailable
            # to this request (503), not a fault of the API.
            raise NatsUnavailableError(
                f"cannot read the consumers from JetStream: {type(exc).__name__}: {exc}"
            ) from exc
        return ConsumersBody(consumers=[ConsumerBody.of(lag) for lag in lags])

    return router
