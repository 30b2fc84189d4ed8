"""``POST /commands``: an operator sends a command to a queue, through
:func:`rhumbatron.operator.send_command`."""

from fastapi import APIRouter

from rhumbatron import operator
from rhumbatron.api.dependencies import CommandSender, Runtime, Streams
from rhumbatron.api.routes._presets import record_errors
from rhumbatron.api.schemas import SendCommandBody, SendCommandRequest

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/commands",
    response_model=SendCommandBody,
    status_code=202,
    summary="Send a command to a queue",
    responses=record_errors(),
)
async def send_command(
    runtime: Runtime, streams: Streams, principal: CommandSender, body: SendCommandRequest
) -> SendCommandBody:
    """Queues the command under the message ID ``<queue>:<commandId>`` (``:<attempt>``
    added after the first attempt): the same command sent again within two hours is
    dropped, and ``duplicate`` says so. A project of another tenant is not found (404)."""
    await streams.ready()
    result = await operator.send_command(
        runtime, body.queue, body.command, tenant_id=principal.tenant_id
    )
    return SendCommandBody.of(body.command, result)
