"""The webhook agent runtime: a relevant wake becomes one signed POST to the Agent's URL.

The external Agent answers 2xx to take the wake and reports its work later through the API.
Anything else — a non-2xx answer, a timeout, a refused connection, a URL that is no longer
safe — raises, and the agent-wakeups queue retries the command (30 s, at most 3 times) and
then dead-letters it. ``webhook-id`` is the command ID, the same on every retry, so the
receiver can drop a wake it already took.

The body points at the work (IDs and the Task's status) and embeds no event payload: the
Agent reads what it needs through the API, with its own credentials.

The Agent woken is the one of the command's project's tenant (``tenant_of``): an agent ID
is a tenant's own, so a wake never reaches another tenant's Agent of the same ID.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

from rhumbatron.agents.registry import AgentKind, AgentRecord, AgentRegistry
from rhumbatron.agents.signing import signed_headers
from rhumbatron.agents.url_safety import check_webhook_url, display_url
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.tasks import TaskState
from rhumbatron.errors import (
    AgentNotFoundError,
    AgentRegistryError,
    EnvelopeError,
    WebhookDeliveryError,
)
from rhumbatron.protocol.command_types import AgentWake
from rhumbatron.protocol.envelopes import Command

__all__ = ["WAKE_TYPE", "WebhookAgentRuntime", "wake_body"]

#: The ``type`` of a wake body.
WAKE_TYPE = "agent.wake"
#: Characters of a refusing answer quoted in the error (and so in the dead letter).
_ANSWER_QUOTE_CHARS = 200
#: Bytes read from a refusing answer: enough for the quote, bounded against a huge body.
_ANSWER_READ_BYTES = 4 * _ANSWER_QUOTE_CHARS


def wake_body(agent_id: str, task: TaskState | None, command: Command) -> bytes:
    """The signed JSON body of a wake: sorted keys, compact, UTF-8. A reaction's wake about
    no Task has ``taskId`` and ``taskStatus`` null, and says the event's ``eventKind``."""
    payload = command.payload
    if not isinstance(payload, AgentWake):
        raise EnvelopeError(
            f"command {command.command_id} is {command.command_type}, not {WAKE_TYPE}; only "
            "a wake is sent to an agent"
        )
    body: dict[str, Any] = {
        "type": WAKE_TYPE,
        "commandId": command.command_id,
        "attempt": command.attempt,
        "projectId": command.project_id,
        "changeId": command.change_id,
        "taskId": command.task_id if task is None else task.task_id,
        "agentId": agent_id,
        "reason": payload.reason,
        "eventId": payload.event_id,
        "taskStatus": None if task is None else task.status.value,
    }
    if payload.event_kind is not None:
        body["eventKind"] = payload.event_kind
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


class WebhookAgentRuntime:
    """An :class:`~rhumbatron.queues.wake_consumer.AgentRuntime` for webhook Agents.

    ``tenant_of`` names the tenant owning a project (the composition root's
    ``project_tenant``): the Agent woken is that tenant's. ``client`` is an
    :class:`httpx.AsyncClient` to reuse (the caller closes it); without one the runtime makes
    its own on first use and :meth:`aclose` closes it.
    """

    def __init__(
        self,
        registry: AgentRegistry,
        settings: Settings,
        clock: Clock,
        client: httpx.AsyncClient | None = None,
        *,
        tenant_of: Callable[[str], str | None],
    ) -> None:
        self._registry = registry
        self._tenant_of = tenant_of
        self._settings = settings
        self._clock = clock
        self._client = client
        self._owns_client = client is None

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        """POST the signed wake to the Agent's URL; return on 2xx, raise otherwise."""
        record = self._webhook_agent(agent_id, command)
        assert record.url is not None  # a webhook row always has one (register_webhook)
        # Checked again at every send: the allow-list may have shrunk, or the name may
        # resolve elsewhere now. getaddrinfo blocks, so it runs off the event loop.
        await asyncio.to_thread(check_webhook_url, record.url, self._settings.webhook_allowed_hosts)
        body = wake_body(agent_id, task, command)
        timestamp = int(self._clock.now().timestamp())
        headers = signed_headers(record.secrets, command.command_id, timestamp, body)
        headers["content-type"] = "application/json"
        await self._post(record, command, body, headers)

    async def aclose(self) -> None:
        """Close the HTTP client if this runtime made it."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    def _webhook_agent(self, agent_id: str, command: Command) -> AgentRecord:
        tenant = self._tenant_of(command.project_id)
        record = None if tenant is None else self._registry.get(tenant, agent_id)
        if record is None:
            raise AgentNotFoundError(
                f"wake {command.command_id} is for agent {agent_id!r}, which the tenant "
                f"({tenant!r}) of project {command.project_id!r} has not registered; register "
                "it as a webhook agent (AgentRegistry.register_webhook)"
            )
        if record.kind is not AgentKind.WEBHOOK:
            raise AgentRegistryError(
                f"wake {command.command_id} is for agent {agent_id!r}, which is registered as "
                f"{record.kind.value}; the webhook runtime wakes only webhook agents"
            )
        return record

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client

    async def _post(
        self, record: AgentRecord, command: Command, body: bytes, headers: dict[str, str]
    ) -> None:
        url = record.url or ""
        timeout_s = self._settings.webhook_timeout_s
        what = (
            f"wake {command.command_id} (attempt {command.attempt}) of agent "
            f"{record.agent_id!r} at {display_url(url)!r}"
        )
        try:
            # httpx's timeout bounds each phase; asyncio.timeout bounds the whole exchange,
            # so a receiver trickling bytes cannot hold the queue's message for long.
            async with (
                asyncio.timeout(timeout_s),
                self._http().stream(
                    "POST",
                    url,
                    content=body,
                    headers=headers,
                    timeout=timeout_s,
                    # A redirect could lead anywhere, past the URL check: a 3xx is a refusal.
                    follow_redirects=False,
                ) as response,
            ):
                if response.is_success:
                    return
                answer = await _first_bytes(response)
        except (TimeoutError, httpx.TimeoutException):
            raise WebhookDeliveryError(
                f"{what} got no answer within {timeout_s} s (RHUMBATRON_WEBHOOK_TIMEOUT_S); "
                "the queue retries it"
            ) from None
        except httpx.HTTPError as exc:
            raise WebhookDeliveryError(
                f"{what} failed: {type(exc).__name__}: {exc}; the queue retries it"
            ) from exc
        quote = answer.decode("utf-8", "replace")[:_ANSWER_QUOTE_CHARS]
        raise WebhookDeliveryError(
            f"{what} was answered {response.status_code}, not 2xx: {quote!r}; the queue retries it"
        )


async def _first_bytes(response: httpx.Response) -> bytes:
    """Up to ``_ANSWER_READ_BYTES`` of the answer: enough to quote, never the whole of it."""
    read = b""
    async for chunk in response.aiter_bytes():
        read += chunk
        if len(read) >= _ANSWER_READ_BYTES:
            break
    return read[:_ANSWER_READ_BYTES]
