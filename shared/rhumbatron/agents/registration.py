"""Registering a tenant's Agent on request: whether it is new, and the secret to show once.

The API's ``POST /agents`` calls :func:`register_agent`. It answers what the registry wrote
and what the caller may be told of it: whether the tenant had no Agent of that ID before
(created), and a secret this very registration generated — the only secret ever shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.agents.registry import AgentKind, AgentRecord
from rhumbatron.agents.url_safety import check_webhook_url

if TYPE_CHECKING:
    from rhumbatron.agents.registry import AgentRegistry

__all__ = ["Registration", "register_agent"]


@dataclass(frozen=True, slots=True)
class Registration:
    """What a registration did: the record, whether it is new, and a generated secret."""

    record: AgentRecord
    created: bool
    generated_secret: str | None


async def register_agent(
    registry: AgentRegistry,
    tenant_id: str,
    agent_id: str,
    kind: AgentKind,
    *,
    url: str | None,
    secrets: Sequence[str] | None,
    allowed_hosts: Sequence[str],
) -> Registration:
    """Register (or update) the tenant's Agent ``agent_id`` of ``kind``.

    A webhook Agent needs ``url``; without ``secrets`` it keeps its secrets, or one is
    generated — when it was no webhook Agent before — and returned to be shown once. Raises
    what the registry and the URL check raise (``AgentRegistryError``,
    ``UnsafeWebhookUrlError``, ``WebhookSecretError``).
    """
    before = registry.get(tenant_id, agent_id)
    if kind is not AgentKind.WEBHOOK:
        record = registry.register_scripted(tenant_id, agent_id)
        return Registration(record, created=before is None, generated_secret=None)
    assert url is not None  # the request model requires it of a webhook Agent
    # Resolving a name may take seconds: first off the event loop, so that an unresolvable
    # or unsafe URL never blocks it. The registry resolves it again on the loop (usually
    # from the resolver's cache: it was just asked).
    await asyncio.to_thread(check_webhook_url, url, allowed_hosts)
    record = registry.register_webhook(tenant_id, agent_id, url, secrets)
    generated = secrets is None and (before is None or before.kind is not AgentKind.WEBHOOK)
    return Registration(
        record, created=before is None, generated_secret=record.secrets[0] if generated else None
    )
