"""The operator's port onto the process, and the one way it sends a command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rhumbatron.errors import (
    MessagingError,
    NatsUnavailableError,
)
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.messaging.commands import CommandBus, SendResult
    from rhumbatron.product.database import ProductDatabase

__all__ = ["OperatorContext", "messaging_cause", "send_on"]


class OperatorContext(Protocol):
    """What the operator's actions read from the process: the settings, the clock, the
    product database (the letters), the command bus (a Retry's resend) and the actors."""

    settings: Settings
    clock: Clock

    def product(self) -> ProductDatabase: ...

    async def command_bus(self) -> CommandBus: ...

    def resource_shard(self, project_id: str, resource_key: str) -> ResourceShard: ...

    def project_tenant(self, project_id: str) -> str | None: ...


async def send_on(app: OperatorContext, queue: str, command: Command) -> SendResult:
    bus = await app.command_bus()
    return await bus.send(queue, command)


def messaging_cause(exc: MessagingError) -> str:
    """What failed underneath: the client's own error when NATS did not answer (the bus's
    advice to send again does not fit a Retry), else the bus's message."""
    cause = exc.__cause__
    if isinstance(exc, NatsUnavailableError) and cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(exc)
