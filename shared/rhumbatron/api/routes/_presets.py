"""What the route modules share: the error responses their operations document, and the path
parameters of the lifecycle routes, as the client names them.

Each preset builds a new ``responses`` dict, so no two operations share one.
"""

from typing import Annotated, Any

from fastapi import Path

from rhumbatron.api.errors import error_responses
from rhumbatron.api.lifecycle_schemas import KEY_ID
from rhumbatron.protocol.ids import EVENT_ID_PATTERN, PROJECT_ID_PATTERN

__all__ = [
    "NO_CHANGE",
    "NO_PROJECT",
    "NO_TASK",
    "AppName",
    "ChangeId",
    "EventId",
    "ProjectId",
    "Responses",
    "TaskId",
    "accepted",
    "base_errors",
    "record_errors",
    "refusable_errors",
]

#: An operation's OpenAPI ``responses``: status → description, model, headers.
Responses = dict[int | str, dict[str, Any]]

NO_PROJECT = "No such project for this tenant (another tenant's project is not found either)."
NO_CHANGE = "No such project, or no such Change in it, for this tenant."
NO_TASK = "No such project, Change or Task for this tenant."

_ACCEPTED = (
    "Queued on the integration queue; `duplicate` when the same command ID was queued within "
    "2 hours (nothing more is done)."
)

# Path parameters, as the client names them.
ProjectId = Annotated[str, Path(alias="projectId", pattern=PROJECT_ID_PATTERN.pattern)]
EventId = Annotated[str, Path(alias="eventId", pattern=EVENT_ID_PATTERN.pattern)]
ChangeId = Annotated[str, Path(alias="changeId", pattern=KEY_ID)]
TaskId = Annotated[str, Path(alias="taskId", pattern=KEY_ID)]
AppName = Annotated[str, Path(alias="appName", pattern=PROJECT_ID_PATTERN.pattern)]


def base_errors() -> Responses:
    """Any operation: the caller or the request at fault, or the service down."""
    return error_responses(401, 403, 422, 503)


def record_errors(e404: str | None = None) -> Responses:
    """An operation on one record, which may not exist for this tenant (``e404`` words
    what)."""
    return error_responses(401, 403, 404, 422, 503, **({"e404": e404} if e404 else {}))


def refusable_errors(**meaning: str) -> Responses:
    """An operation on one record, which may not exist or whose state may refuse it (409);
    ``meaning`` words a status for the operation (``e404=...``, ``e409=...``)."""
    return error_responses(401, 403, 404, 409, 422, 503, **meaning)


def accepted(errors: Responses) -> Responses:
    """A command queued (202) besides ``errors``."""
    return {202: {"description": _ACCEPTED}, **errors}
