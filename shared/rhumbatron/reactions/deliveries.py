"""Running one admitted reaction: a signed webhook, a workflow start, or an agent wake.

Each effect carries an ID derived from ``(eventId, subscriptionId)`` so that a redelivery
meets its first attempt instead of repeating it:

* webhook: ``webhook-id`` = ``<eventId>:<subscriptionId>`` (the receiver dedupes on it);
* workflow: instance ID ``reaction-<eventId>-<subscriptionId>`` (DECISIONS), the engine
  answers a second start with ``started=False``;
* agent: command ID ``cmd_<eventId>_<subscriptionId>``, dropped by the command stream's
  duplicate window.

A Step Functions execution name holds at most 80 characters, and ``reaction-`` + an event ID
(``evt_`` + 32 hex) + ``-`` + a registry subscription ID (``sub_`` + 32 hex) is 82. So when
the full form does not fit, the instance ID drops the two type prefixes —
``reaction-<32 hex of the event>-<32 hex of the subscription>``, 74 characters, both IDs still
readable. A subscription ID that fits neither form (a command ID's characters, or no
``sub_`` prefix and too long) is replaced by ``h`` + the first 24 hex digits of its SHA-256.
All three are stable: the same pair always gives the same ID.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from rhumbatron.agents.signing import signed_headers
from rhumbatron.agents.url_safety import check_webhook_url, display_url
from rhumbatron.core.settings import Settings
from rhumbatron.errors import ReactionDeliveryError, RhumbatronError
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.reactions.kinds import KIND_GRAMMAR
from rhumbatron.reactions.ports import WebhookReactionLike
from rhumbatron.reactions.webhook_ledger import Attempt
from rhumbatron.workflows.engine import INSTANCE_ID_PATTERN, WorkflowEngine, WorkflowStart

__all__ = [
    "REACTION_REASON_PREFIX",
    "ReactionEffects",
    "agent_command_id",
    "agent_wake_command",
    "attempt_webhook",
    "pointer_body",
    "post_webhook",
    "webhook_id",
    "workflow_input",
    "workflow_instance_id",
]

#: An agent reaction's wake says ``reason = reaction:<subscriptionId>``.
REACTION_REASON_PREFIX = "reaction:"
_COMMAND_ID = re.compile(r"^cmd_[A-Za-z0-9_.:\-]{1,200}$")
_DIGEST_HEX = 24
#: Characters of a refusing answer quoted in the error (and so in a dead letter).
_ANSWER_QUOTE_CHARS = 200


def _digest(subscription_id: str) -> str:
    return "h" + hashlib.sha256(subscription_id.encode()).hexdigest()[:_DIGEST_HEX]


def webhook_id(event_id: str, subscription_id: str) -> str:
    """``<eventId>:<subscriptionId>``: the delivery's key and its ``webhook-id``."""
    return f"{event_id}:{subscription_id}"


def workflow_instance_id(event_id: str, subscription_id: str) -> str:
    """``reaction-<eventId>-<subscriptionId>`` when that is a valid execution name (1..80 of
    ``[A-Za-z0-9_-]``), else without the ``evt_``/``sub_`` prefixes, else with the
    subscription's digest (see the module's docstring)."""
    wanted = f"reaction-{event_id}-{subscription_id}"
    if INSTANCE_ID_PATTERN.fullmatch(wanted):
        return wanted
    event_part = event_id.removeprefix("evt_")
    compact = f"reaction-{event_part}-{subscription_id.removeprefix('sub_')}"
    if INSTANCE_ID_PATTERN.fullmatch(compact):
        return compact
    return f"reaction-{event_part}-{_digest(subscription_id)}"


def agent_command_id(event_id: str, subscription_id: str) -> str:
    """``cmd_<eventId>_<subscriptionId>``, or with the subscription's digest."""
    wanted = f"cmd_{event_id}_{subscription_id}"
    if _COMMAND_ID.fullmatch(wanted):
        return wanted
    return f"cmd_{event_id}_{_digest(subscription_id)}"


def _subject(event: Event) -> dict[str, str | None]:
    kind = KIND_GRAMMAR.get(event.event_type)
    if kind is None:  # unreachable for a parsed Event; kept total for the body's sake
        return {"type": "project", "id": event.project_id}
    part, name = kind.subject_id_key.split(".", 1)
    source = event.to_wire() if part == "subject" else event.payload.model_dump(by_alias=True)
    value = source.get(name)
    return {"type": kind.about.value, "id": None if value is None else str(value)}


def pointer_body(event: Event, *, link_template: str) -> bytes:
    """The webhook body: a pointer to the event, never its payload (sorted, compact JSON)."""
    body: dict[str, Any] = {
        "eventId": event.event_id,
        "kind": event.event_type,
        "subject": _subject(event),
        "projectId": event.project_id,
        "link": link_template.format(projectId=event.project_id, eventId=event.event_id),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


async def post_webhook(
    client: httpx.AsyncClient,
    *,
    url: str,
    secrets: Sequence[str],
    msg_id: str,
    body: bytes,
    timestamp: int,
    allowed_hosts: Sequence[str],
    timeout_s: float,
) -> int:
    """Check the URL again (SSRF, at send), sign with every secret, POST; return the 2xx
    status, or raise :class:`ReactionDeliveryError`. A redirect is a refusal."""
    # getaddrinfo blocks: the check runs off the event loop.
    await asyncio.to_thread(check_webhook_url, url, allowed_hosts)
    headers = signed_headers(secrets, msg_id, timestamp, body)
    headers["content-type"] = "application/json"
    what = f"webhook {msg_id} to {display_url(url)!r}"
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(
                url, content=body, headers=headers, timeout=timeout_s, follow_redirects=False
            )
    except (TimeoutError, httpx.TimeoutException):
        raise ReactionDeliveryError(
            f"{what} got no answer within {timeout_s} s (RHUMBATRON_WEBHOOK_TIMEOUT_S)"
        ) from None
    except httpx.HTTPError as exc:
        raise ReactionDeliveryError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    if not response.is_success:
        quote = response.text[:_ANSWER_QUOTE_CHARS]
        raise ReactionDeliveryError(
            f"{what} was answered {response.status_code}, not 2xx: {quote!r}",
            status_code=response.status_code,
        )
    return response.status_code


async def attempt_webhook(
    client: httpx.AsyncClient,
    reaction: WebhookReactionLike,
    *,
    msg_id: str,
    body: bytes,
    timestamp: int,
    settings: Settings,
) -> Attempt:
    """One signed POST of a webhook reaction, as the delivery ledger records it: never
    raises for the receiver's or the URL's sake (a refused URL, a timeout, a non-2xx)."""
    try:
        status = await post_webhook(
            client,
            url=reaction.url,
            secrets=list(reaction.secrets),
            msg_id=msg_id,
            body=body,
            timestamp=timestamp,
            allowed_hosts=settings.webhook_allowed_hosts,
            timeout_s=reaction.timeout_s or settings.webhook_timeout_s,
        )
    except ReactionDeliveryError as exc:
        return Attempt(ok=False, status_code=exc.status_code, error=str(exc))
    except RhumbatronError as exc:  # an unsafe URL at send, a secret that does not parse
        return Attempt(ok=False, error=f"{type(exc).__name__}: {exc}")
    return Attempt(ok=True, status_code=status)


def workflow_input(event: Event, subscription_id: str) -> dict[str, Any]:
    """What a reaction's workflow starts with: a pointer to its event, like a webhook."""
    return {
        "eventId": event.event_id,
        "kind": event.event_type,
        "projectId": event.project_id,
        "changeId": event.change_id,
        "taskId": event.task_id,
        "subscriptionId": subscription_id,
    }


def agent_wake_command(event: Event, subscription_id: str, agent_id: str, now: datetime) -> Command:
    """The ``agent.wake`` of an agent reaction (``cmd_<eventId>_<subscriptionId>``)."""
    return Command.create(
        command_id=agent_command_id(event.event_id, subscription_id),
        command_type="agent.wake",
        project_id=event.project_id,
        change_id=event.change_id,
        task_id=event.task_id,
        created_at=now,
        payload={
            "agentId": agent_id,
            "reason": f"{REACTION_REASON_PREFIX}{subscription_id}",
            "eventId": event.event_id,
            "eventKind": event.event_type,
        },
    )


@dataclass
class ReactionEffects:
    """Where reactions go: an HTTP client for webhooks, the workflow engine (None: no
    workflows here, and a workflow reaction is skipped visibly), and the command path that
    sends an agent's wake (``LifecycleSender.send``)."""

    http: Callable[[], httpx.AsyncClient]
    engine: WorkflowEngine | None
    send_command: Callable[[Command], Awaitable[object]]

    async def start_workflow(
        self, workflow: str, instance_id: str, input: Mapping[str, Any]
    ) -> WorkflowStart | None:
        """Start the instance; None when this process has no engine."""
        if self.engine is None:
            return None
        return await self.engine.start(workflow, instance_id, input)
