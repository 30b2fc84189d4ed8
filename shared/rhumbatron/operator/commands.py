"""Sending a command as an operator: to its queue, within the caller's tenant."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from rhumbatron.core.settings import ANY_TENANT
from rhumbatron.errors import (
    ProjectNotFoundError,
)
from rhumbatron.operator.context import OperatorContext
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.messaging.commands import SendResult

__all__ = ["send_command"]

_log = logging.getLogger(__name__)


async def send_command(
    app: OperatorContext,
    queue: str,
    command: Command,
    *,
    tenant_id: str,
    check_subject: Callable[[Command], None] | None = None,
) -> SendResult:
    """Send an operator's command on ``queue`` under ``<queue>:<commandId>[:<attempt>]``.

    The command's project must not belong to another tenant: its owner is read from the
    project's root actor when the project exists, and from the payload of a
    ``project.provision``. ``check_subject`` (the lifecycle's
    :func:`~rhumbatron.lifecycle.subjects.check_command_subject`) then refuses a command
    that refers to what does not exist, before anything is sent. Raises
    :class:`ProjectNotFoundError`, what ``check_subject`` raises, and
    ``NatsUnavailableError`` or ``MessagingError`` when the send failed (sending the same
    command again is harmless).
    """
    owner = _project_tenant(app, command)
    # Fail closed: a project nobody owns yet is only a platform operator's to command
    # (except its own provisioning, whose payload names the tenant).
    if tenant_id not in (ANY_TENANT, owner):  # owner None: nobody's project yet
        raise ProjectNotFoundError(f"no project {command.project_id!r}")
    if check_subject is not None:
        check_subject(command)
    bus = await app.command_bus()
    result = await bus.send(queue, command)
    _log.info(
        "operator command %s (%s) sent on %s, duplicate=%s (tenant %s)",
        command.command_id,
        command.command_type,
        queue,
        result.duplicate,
        tenant_id,
    )
    return result


def _project_tenant(app: OperatorContext, command: Command) -> str | None:
    owner = app.project_tenant(command.project_id)
    if owner is not None:
        return owner
    tenant = getattr(command.payload, "tenant_id", None)
    return tenant if command.command_type == "project.provision" else None
