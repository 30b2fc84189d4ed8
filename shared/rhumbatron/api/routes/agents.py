"""``POST /agents``: register (or update) an Agent of the caller's tenant, through
:func:`rhumbatron.agents.registration.register_agent`.

Agent IDs are the tenant's own: another tenant's agent of the same ID is neither seen nor
changed. A secret is never shown, except one the very registration generated (once), and a
refused secret is never quoted: the route checks how many there are itself, and answers the
registry's refusals without the value.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, Response

from rhumbatron.agents import registration
from rhumbatron.agents.registry import MAX_SECRETS, AgentKind
from rhumbatron.agents.url_safety import display_url
from rhumbatron.api.access import own_tenant
from rhumbatron.api.dependencies import AgentsWriter, Runtime
from rhumbatron.api.errors import error_responses
from rhumbatron.api.lifecycle_schemas import AgentBody, RegisterAgentRequest
from rhumbatron.errors import (
    AgentRegistryError,
    InvalidRequestError,
    UnsafeWebhookUrlError,
    WebhookSecretError,
)

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/agents",
    response_model=AgentBody,
    status_code=201,
    summary="Register an agent",
    responses={
        200: {"model": AgentBody, "description": "The agent was registered already."},
        **error_responses(
            401,
            403,
            422,
            503,
            e403="The token lacks agents:write, or is a platform token (owns no agent).",
            e422="The request is invalid (an unsafe URL, a malformed secret, ...); "
            "`field` names the first bad field.",
        ),
    },
)
async def register_agent(
    runtime: Runtime, principal: AgentsWriter, body: RegisterAgentRequest, response: Response
) -> AgentBody:
    """Registers (201) or updates (200) an agent of the caller's tenant. Agent IDs are
    the tenant's own: another tenant's agent of the same ID is neither seen nor changed.
    The answer shows no secret, except one this registration generated: it is shown
    once."""
    tenant = own_tenant(principal, "register an agent")
    if body.kind is AgentKind.WEBHOOK:
        _check_secrets(body.secrets)
    with _invalid():
        registered = await registration.register_agent(
            runtime.lifecycle().registry,
            tenant,
            body.agent_id,
            body.kind,
            url=body.url,
            secrets=body.secrets,
            allowed_hosts=runtime.settings.webhook_allowed_hosts,
        )
    response.status_code = 201 if registered.created else 200
    record = registered.record
    return AgentBody.of(
        record,
        url=display_url(record.url) if record.url else None,
        generated_secret=registered.generated_secret,
    )


def _check_secrets(secrets: list[str] | None) -> None:
    """How many secrets, and none twice, in a message that quotes none of them."""
    if secrets is None:
        return
    if not 1 <= len(secrets) <= MAX_SECRETS:
        raise InvalidRequestError(
            f"give 1 or {MAX_SECRETS} secrets (newest first), not {len(secrets)}; or none to "
            "keep the registered ones (or have one generated)",
            field="secrets",
        )
    if len(set(secrets)) != len(secrets):
        raise InvalidRequestError("the same secret is given twice", field="secrets")


@contextmanager
def _invalid() -> Iterator[None]:
    """The registry's refusals: an unsafe URL, a bad secret or agent ID is the request's
    fault (422)."""
    try:
        yield
    except WebhookSecretError as exc:
        raise InvalidRequestError(str(exc), field="secrets") from None
    except UnsafeWebhookUrlError as exc:
        raise InvalidRequestError(str(exc), field="url") from None
    except AgentRegistryError as exc:
        raise InvalidRequestError(str(exc), field="agentId") from None
