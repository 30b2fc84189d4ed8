"""The consumers API's response bodies: frozen pydantic models, camelCase on the wire, like
:mod:`rhumbatron.api.schemas`."""

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.messaging.cursors import CursorKind, CursorLag

__all__ = ["ConsumerBody", "ConsumersBody"]


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
        """``lag`` as answered: what it reads named as a subscription or a queue."""
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
