"""The outbox API's bodies: frozen pydantic models, camelCase on the wire, like
:mod:`rhumbatron.api.schemas`."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.operator.outbox import ActorOutbox, OutboxPage
from rhumbatron.protocol.ids import EVENT_ID_PATTERN, PROJECT_ID_PATTERN

__all__ = ["ActorOutboxBody", "FailedRowBody", "OutboxPageBody", "RequeueBody", "RequeueRequest"]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class FailedRowBody(_Wire):
    """An outbox row the publisher gave up on (after its attempts), with why."""

    event_id: str
    event_type: str
    attempts: int = Field(ge=0)
    last_error: str | None


class ActorOutboxBody(_Wire):
    """One actor's outbox."""

    actor: str = Field(
        description="The actor's key (project_root:<project>, resource_shard:<project>:<n>)."
    )
    project_id: str
    rows: dict[str, int] = Field(description="Rows per state: pending, published, failed …")
    failed_rows: list[FailedRowBody] = Field(description="The oldest failed rows (at most 20).")

    @classmethod
    def of(cls, outbox: ActorOutbox) -> "ActorOutboxBody":
        return cls(
            actor=outbox.actor,
            project_id=outbox.project_id,
            rows=dict(outbox.counts),
            failed_rows=[
                FailedRowBody(
                    event_id=r.event_id,
                    event_type=r.event_type,
                    attempts=r.attempts,
                    last_error=r.last_error,
                )
                for r in outbox.failed
            ],
        )


class OutboxPageBody(_Wire):
    """A page of actors' outboxes, in actor-key order."""

    items: list[ActorOutboxBody]
    next: str | None = Field(default=None, description="Pass as `after` for the next page.")

    @classmethod
    def of(cls, page: OutboxPage) -> "OutboxPageBody":
        return cls(items=[ActorOutboxBody.of(a) for a in page.actors], next=page.next_after)


class RequeueRequest(_Wire):
    """Which failed rows to put back to pending: a project's, or only some of its events."""

    project_id: str = Field(pattern=PROJECT_ID_PATTERN.pattern)
    event_ids: list[Annotated[str, Field(pattern=EVENT_ID_PATTERN.pattern)]] | None = Field(
        default=None,
        max_length=1000,
        description="Only these events (default: every failed row of the project).",
    )


class RequeueBody(_Wire):
    """Rows put back to pending, per actor (an actor with none is left out)."""

    requeued: dict[str, int]
    total: int = Field(ge=0)
