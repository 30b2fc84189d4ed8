"""Commands on the ``COMMANDS`` work-queue stream: the command bus.

Each queue is one subject, ``cmd.<queue>``, read by one durable consumer, ``q-<queue>``
(:data:`~rhumbatron.protocol.queue_consumers.QUEUE_CONSUMERS`). :class:`CommandBus` sends a
Command with the message ID ``<queue>:<commandId>`` (an operator's Retry, attempt *n* > 1,
adds ``:<n>`` so the 2-hour duplicate window cannot swallow it) and reports when JetStream
dropped it as a duplicate. A Command goes with a ``traceparent`` header: the one given, else
the span in progress's position (in the Command's Change's trace when it names a Change, see
:func:`~rhumbatron.core.tracing.traceparent_for`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.core.tracing import Span, span, traceparent_for
from rhumbatron.errors import MessagingError, NatsUnavailableError
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS
from rhumbatron.protocol.tracecontext import TRACEPARENT_HEADER, TraceContext

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = [
    "DELIVERIES_HEADER",
    "LAST_ERROR_HEADER",
    "ORIGIN_QUEUE_HEADER",
    "CommandBus",
    "SendResult",
    "command_message_id",
    "command_span",
    "retry_queue_for",
]

#: Headers a dead-lettered command carries from its origin queue.
ORIGIN_QUEUE_HEADER = "Rhumbatron-Origin-Queue"
LAST_ERROR_HEADER = "Rhumbatron-Last-Error"
DELIVERIES_HEADER = "Rhumbatron-Deliveries"


def command_message_id(queue: str, command: Command) -> str:
    """``<queue>:<commandId>``; an operator's Retry (attempt > 1) appends ``:<attempt>``."""
    base = f"{queue}:{command.command_id}"
    return base if command.attempt == 1 else f"{base}:{command.attempt}"


def command_span(command: Command, headers: Mapping[str, str]) -> AbstractContextManager[Span]:
    """The span of a handler's work on ``command``: in its Change's trace when it names one,
    child of the position in its ``traceparent`` header (a bad or absent header: no parent)."""
    return span(
        f"handle {command.command_type}",
        parent=TraceContext.parse(headers.get(TRACEPARENT_HEADER)),
        project_id=command.project_id,
        change_id=command.change_id,
    )


def retry_queue_for(command: Command) -> str:
    """Where an operator's Retry sends a command: agent.wake to agent-wakeups, every other
    command to integration (the integration handler serves verification and release too)."""
    return "agent-wakeups" if command.command_type == "agent.wake" else "integration"


@dataclass(frozen=True, slots=True)
class SendResult:
    """What JetStream said about one send."""

    queue: str
    message_id: str
    stream_seq: int
    duplicate: bool


@dataclass
class CommandBus:
    """Sends Commands onto their queues over one NATS connection."""

    nc: NATS
    ack_timeout_s: float = 5.0

    async def send(
        self,
        queue: str,
        command: Command,
        *,
        headers: dict[str, str] | None = None,
        trace: TraceContext | None = None,
    ) -> SendResult:
        """Publish ``command`` on ``cmd.<queue>``; JetStream drops a repeat of the same
        message ID inside its duplicate window, and ``duplicate`` says so. Its
        ``traceparent`` is ``trace``, else that of the span in progress."""
        message_id = command_message_id(queue, command)
        traceparent = (
            trace.header
            if trace is not None
            else traceparent_for(command.project_id, command.change_id)
        )
        if traceparent is not None:
            headers = {TRACEPARENT_HEADER: traceparent, **(headers or {})}
        return await self._publish(
            queue, command.to_json(), message_id, headers, command.command_id
        )

    async def send_raw(
        self, queue: str, body: bytes, *, message_id: str, headers: dict[str, str] | None = None
    ) -> SendResult:
        """Publish a body that is not a valid Command (the dead-letter path of a record that
        never decoded), under an explicit message ID."""
        return await self._publish(queue, body, message_id, headers, message_id)

    async def _publish(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        headers: dict[str, str] | None,
        what: str,
    ) -> SendResult:
        from nats.errors import Error as NatsError
        from nats.js.errors import APIError

        if queue not in QUEUE_CONSUMERS:
            raise MessagingError(
                f"unknown queue {queue!r}; queues are {', '.join(QUEUE_CONSUMERS)}"
            )
        js = self.nc.jetstream()
        try:
            ack = await js.publish(
                command_subject(queue),
                body,
                timeout=self.ack_timeout_s,
                stream=COMMAND_STREAM,
                headers={"Nats-Msg-Id": message_id, **(headers or {})},
            )
        except APIError as exc:
            raise MessagingError(
                f"JetStream refused command {what} on {queue}: "
                f"{exc.description} (code {exc.err_code})"
            ) from exc
        except (NatsError, TimeoutError) as exc:
            raise NatsUnavailableError(
                f"cannot send command {what} to {queue}: {type(exc).__name__}: {exc}; send it "
                "again (its message ID makes a repeat harmless)"
            ) from exc
        return SendResult(queue, message_id, ack.seq, bool(ack.duplicate))
