"""``POST /commands``: an operator sends a command to a queue, through
:func:`rhumbatron.operator.send_command`."""

from fastapi import APIRouter

from rhumbatron import operator
from rhumbatron.api.dependencies import CommandSender, Runtime, Streams
from rhumbatron.api.routes._presets import record_errors
from rhumbatron.api.schemas import SendCommandBody, SendCommandRequest
from rhumbatron.lifecycle.subjects import check_command_subject

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
    dropped, and ``duplicate`` says so. A project of another tenant is not found (404). A
    command that refers to what does not exist — a project never provisioned, a Change, a
    Candidate, a generation never promoted, an app not live — is refused (422, ``field``
    names it) and not sent."""
    await streams.ready()
    world = runtime.lifecycle().world
    result = await operator.send_command(
        runtime,
        body.queue,
        body.command,
        tenant_id=principal.tenant_id,
        check_subject=lambda command: check_command_subject(world, command),
    )
    return SendCommandBody.of(body.command, result)
