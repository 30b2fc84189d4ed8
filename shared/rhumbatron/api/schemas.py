"""The API's request and response bodies: frozen pydantic models, camelCase on the wire.

A request is validated here, at the edge; past it the routes trust their types. The
Command inside ``POST /commands`` is the frozen :class:`~rhumbatron.protocol.envelopes.Command`
envelope itself, so the API accepts exactly what the queues carry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.messaging.commands import SendResult
from rhumbatron.operator import DeadLetterPage, Inspection, RetryOutcome
from rhumbatron.operator.letter_groups import can_retry
from rhumbatron.product.dead_letters import (
    DeadLetter,
    DeadLetterKind,
    DeadLetterStatus,
    Resolution,
)
from rhumbatron.protocol.command_types import QUEUES
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE

__all__ = [
    "DeadLetterDetail",
    "DeadLetterPageBody",
    "DeadLetterSummary",
    "Health",
    "RetryBody",
    "SendCommandBody",
    "SendCommandRequest",
    "WorkQueue",
]

#: The queues an operator may send to: every queue but the dead-letter queue, which only
#: the queue runtime feeds (with the origin queue and the last error in its headers).
WorkQueue = Literal["agent-wakeups", "integration", "verification", "release", "indexing"]
assert get_args(WorkQueue) == tuple(q for q in QUEUES if q != DEAD_LETTER_QUEUE), (
    "WorkQueue must list every queue but the dead-letter queue"
)


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


def _at(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class DeadLetterSummary(_Wire):
    """One dead letter, as a list shows it."""

    id: str
    kind: DeadLetterKind
    status: DeadLetterStatus
    resolution: Resolution | None = None
    last_error: str = Field(description="Why delivery gave up (the last handler error).")
    attempt: int | None = Field(
        default=None, description="The command attempt that was dead-lettered."
    )
    retried_attempt: int | None = Field(
        default=None, description="The attempt an operator's Retry reserved (and sent)."
    )
    retried_at: datetime | None = None
    retryable: bool = Field(
        default=False, description="Whether Retry can send it again; false: dismiss only."
    )
    tenant_id: str | None = None
    project_id: str | None = None
    change_id: str | None = None
    task_id: str | None = None
    command_id: str | None = None
    command_type: str | None = None
    queue: str | None = Field(default=None, description="The queue the command failed on.")
    consumer: str | None = Field(default=None, description="The subscription (poison events).")
    event_id: str | None = None
    stream: str | None = None
    stream_seq: int | None = None
    created_at: datetime
    updated_at: datetime | None = None
    closed_at: datetime | None = None

    @classmethod
    def of(cls, letter: DeadLetter) -> DeadLetterSummary:
        return cls(**_summary_fields(letter))


def _summary_fields(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.dead_letter_id,
        "kind": letter.kind,
        "status": letter.status,
        "resolution": Resolution(letter.resolution) if letter.resolution else None,
        "last_error": letter.reason,
        "attempt": letter.attempt,
        "retried_attempt": letter.retried_attempt,
        "retried_at": _at(letter.retried_at_s),
        "retryable": can_retry(letter),
        "tenant_id": letter.tenant_id,
        "project_id": letter.project_id,
        "change_id": letter.change_id,
        "task_id": letter.task_id,
        "command_id": letter.command_id,
        "command_type": letter.command_type,
        "queue": letter.queue,
        "consumer": letter.consumer,
        "event_id": letter.event_id,
        "stream": letter.stream,
        "stream_seq": letter.stream_seq,
        "created_at": _at(letter.created_at_s),
        "updated_at": _at(letter.updated_at_s),
        "closed_at": _at(letter.closed_at_s),
    }


class DeadLetterDetail(DeadLetterSummary):
    """One dead letter with its full body."""

    body: str = Field(description="The message as it was dead-lettered.")
    body_json: Any = Field(default=None, description="The body decoded as JSON, if it is JSON.")
    command: dict[str, Any] | None = Field(
        default=None, description="The Command (wire form) when the body is a valid one."
    )
    body_problem: str | None = Field(
        default=None, description="Why a command letter's body is not a valid Command."
    )

    @classmethod
    def of_inspection(cls, inspection: Inspection) -> DeadLetterDetail:
        command = inspection.command
        return cls(
            **_summary_fields(inspection.letter),
            body=inspection.letter.body,
            body_json=inspection.body_json,
            command=command.to_wire() if command is not None else None,
            body_problem=inspection.body_problem,
        )


class DeadLetterPageBody(_Wire):
    """A page of dead letters, oldest first."""

    items: list[DeadLetterSummary]
    next: str | None = Field(
        default=None, description="Pass as `after` for the next page; null on the last page."
    )

    @classmethod
    def of(cls, page: DeadLetterPage) -> DeadLetterPageBody:
        return cls(items=[DeadLetterSummary.of(x) for x in page.letters], next=page.next_after)


class RetryBody(_Wire):
    """What a Retry did. ``sent`` false with ``alreadyRetriedAs`` set: another Retry of the
    same attempt had been reserved, and this one sent nothing."""

    dead_letter: DeadLetterSummary
    attempt: int
    queue: str
    message_id: str
    sent: bool
    duplicate: bool
    already_retried_as: int | None = None
    stream_seq: int | None = None

    @classmethod
    def of(cls, outcome: RetryOutcome) -> RetryBody:
        return cls(
            dead_letter=DeadLetterSummary.of(outcome.letter),
            attempt=outcome.attempt,
            queue=outcome.queue,
            message_id=outcome.message_id,
            sent=outcome.sent,
            duplicate=outcome.duplicate,
            already_retried_as=outcome.already_retried_as,
            stream_seq=outcome.stream_seq,
        )


class SendCommandRequest(_Wire):
    """A Command for a queue. The command is validated with the Command envelope."""

    queue: WorkQueue
    command: Command


class SendCommandBody(_Wire):
    """Where the command went. ``duplicate``: JetStream had the same message ID already
    (within its 2-hour window) and dropped this one."""

    queue: str
    message_id: str
    command_id: str
    attempt: int
    stream_seq: int
    duplicate: bool

    @classmethod
    def of(cls, command: Command, result: SendResult) -> SendCommandBody:
        return cls(
            queue=result.queue,
            message_id=result.message_id,
            command_id=command.command_id,
            attempt=command.attempt,
            stream_seq=result.stream_seq,
            duplicate=result.duplicate,
        )


class Health(_Wire):
    """Whether this process can serve: NATS connected and the product database readable."""

    status: Literal["ok", "unavailable"]
    nats: bool
    product_database: bool
