"""The resource shard aggregate: claims, intents and challenges on a project's resources.

Claims, intents and challenges are the shard's own transactions: their facts get IDs minted
inside the transaction. A resource key (``file:src/app.py``) lives in exactly one shard of its
project.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Delete, Insert, Transition, Upsert
from rhumbatron.errors import DomainError
from rhumbatron.protocol.ids import new_event_id

__all__ = [
    "Challenge",
    "Claim",
    "Intent",
    "acquire_claim",
    "create_challenge",
    "declare_intent",
    "expire_claims",
    "release_claim",
]


@dataclass(frozen=True, slots=True)
class Claim:
    resource: str
    claim_id: str
    agent_id: str
    mode: str
    expires_at: datetime

    def live_at(self, moment: datetime) -> bool:
        return moment < self.expires_at


@dataclass(frozen=True, slots=True)
class Intent:
    intent_id: str
    agent_id: str
    paths: tuple[str, ...]
    summary: str


@dataclass(frozen=True, slots=True)
class Challenge:
    """An Agent's objection to another's claim or intent on a resource (one ``challenges``
    row). ``target_agent_id`` None: whoever holds or means to touch the resource."""

    challenge_id: str
    agent_id: str
    resource: str
    target_agent_id: str | None
    reason: str
    change_id: str | None = None


def _claim_row(claim: Claim) -> dict[str, object]:
    return {
        "resource": claim.resource,
        "claim_id": claim.claim_id,
        "agent_id": claim.agent_id,
        "mode": claim.mode,
        "expires_at": claim.expires_at.timestamp(),
    }


def acquire_claim(
    current: Claim | None,
    ctx: FactContext,
    *,
    resource: str,
    agent_id: str,
    ttl: timedelta,
    mode: str = "exclusive",
) -> Transition:
    """Claim ``resource`` for ``agent_id``; the holder renews, anyone else is refused."""
    expires_at = ctx.now + ttl
    if current is not None and current.live_at(ctx.now):
        if current.agent_id != agent_id:
            raise DomainError(
                f"{resource} is claimed by agent {current.agent_id!r} until "
                f"{current.expires_at.isoformat()}; wait for claim.released or claim.expired"
            )
        renewed = Claim(resource, current.claim_id, agent_id, current.mode, expires_at)
        return Transition(patch=(Upsert("claims", _claim_row(renewed), key=("resource",)),))
    claim = Claim(resource, "clm_" + new_event_id()[4:], agent_id, mode, expires_at)
    fact = ctx.fact(
        "claim.acquired",
        {"claimId": claim.claim_id, "agentId": agent_id, "mode": mode, "expiresAt": expires_at},
        resource=resource,
    )
    return Transition(
        patch=(Upsert("claims", _claim_row(claim), key=("resource",)),), facts=(fact,)
    )


def release_claim(
    current: Claim | None, ctx: FactContext, *, resource: str, agent_id: str
) -> Transition:
    """Release ``resource``; only its holder may, and releasing twice changes nothing."""
    if current is None:
        return Transition()
    if current.agent_id != agent_id:
        raise DomainError(
            f"agent {agent_id!r} cannot release {resource}: agent {current.agent_id!r} holds it"
        )
    fact = ctx.fact(
        "claim.released", {"claimId": current.claim_id, "agentId": agent_id}, resource=resource
    )
    return Transition(patch=(Delete("claims", {"resource": resource}),), facts=(fact,))


def expire_claims(claims: list[Claim], ctx: FactContext) -> Transition:
    """Every claim past its expiry is removed with a claim.expired fact."""
    expired = [c for c in claims if not c.live_at(ctx.now)]
    patch = tuple(Delete("claims", {"resource": c.resource}) for c in expired)
    facts = tuple(
        ctx.fact(
            "claim.expired",
            {"claimId": c.claim_id, "agentId": c.agent_id, "expiredAt": c.expires_at},
            resource=c.resource,
        )
        for c in expired
    )
    return Transition(patch=patch, facts=facts)


def declare_intent(
    current: Intent | None,
    ctx: FactContext,
    *,
    intent_id: str,
    agent_id: str,
    paths: tuple[str, ...],
    summary: str = "",
    change_id: str | None = None,
) -> Transition:
    """Declare an intent (intent.declared) or change it (intent.changed); same = no-op."""
    if not paths:
        raise DomainError(f"intent {intent_id!r} names no paths; declare at least one")
    if current is not None and current.agent_id != agent_id:
        raise DomainError(f"intent {intent_id!r} belongs to agent {current.agent_id!r}")
    if current is not None and (current.paths, current.summary) == (paths, summary):
        return Transition()
    event_type = "intent.declared" if current is None else "intent.changed"
    row = {
        "intent_id": intent_id,
        "agent_id": agent_id,
        "paths": json.dumps(list(paths)),
        "summary": summary,
        "updated_at": ctx.now.astimezone(UTC).isoformat(),
    }
    fact = ctx.fact(
        event_type,
        {"intentId": intent_id, "agentId": agent_id, "paths": list(paths), "summary": summary},
        change_id=change_id,
        resource=paths[0] if len(paths) == 1 else _common_prefix(paths),
    )
    return Transition(patch=(Upsert("intents", row, key=("intent_id",)),), facts=(fact,))


def create_challenge(
    current: Challenge | None,
    ctx: FactContext,
    *,
    challenge_id: str,
    agent_id: str,
    resource: str,
    target_agent_id: str | None,
    reason: str,
    change_id: str | None = None,
) -> Transition:
    """``agent_id`` challenges ``target_agent_id``'s claim or intent on ``resource``
    (``challenge.created``, a resource Event: the causal router wakes the active Agents whose
    resources overlap it, never its author).

    Idempotent on ``challenge_id``: the same challenge again is nothing; the ID reused for
    another challenge is refused. An Agent cannot challenge itself, and a challenge needs a
    reason.
    """
    challenge = Challenge(
        challenge_id, agent_id, resource, target_agent_id, reason.strip(), change_id
    )
    if current is not None:
        if current == challenge:
            return Transition()
        raise DomainError(
            f"challenge {challenge_id!r} already exists (by agent {current.agent_id!r} on "
            f"{current.resource!r}); use a new challenge ID for another challenge"
        )
    if not challenge.reason:
        raise DomainError(f"challenge {challenge_id!r} needs a reason; say what is wrong")
    if not resource:
        raise DomainError(f"challenge {challenge_id!r} names no resource")
    if target_agent_id == agent_id:
        raise DomainError(f"agent {agent_id!r} cannot challenge itself; name another agent or none")
    row = {
        "challenge_id": challenge_id,
        "agent_id": agent_id,
        "resource": resource,
        "target_agent_id": target_agent_id,
        "reason": challenge.reason,
        "change_id": change_id,
        "created_at": ctx.now.astimezone(UTC).isoformat(),
    }
    fact = ctx.fact(
        "challenge.created",
        {
            "challengeId": challenge_id,
            "agentId": agent_id,
            "targetAgentId": target_agent_id,
            "reason": challenge.reason,
        },
        change_id=change_id,
        resource=resource,
    )
    return Transition(patch=(Insert("challenges", row),), facts=(fact,))


def _common_prefix(paths: tuple[str, ...]) -> str:
    parts = [p.split("/") for p in paths]
    prefix: list[str] = []
    for segment in zip(*parts, strict=False):
        if len(set(segment)) != 1:
            break
        prefix.append(segment[0])
    return "/".join(prefix) + "/" if prefix else "/"
