"""The loop guards (S2-011 … S2-014): self-cause, causal depth, cooldown, and the record of
every suppression with its cause chain.

**The cause chain.** Every reaction that fires registers the IDs its effect will carry as a
*cause key*: the webhook ID ``<eventId>:<subscriptionId>``, the wake's command ID and the
workflow's instance ID. The facts that effect produces name one of them as ``causedBy`` or
``correlationId`` (the wake consumer's facts carry ``<commandId>:<attempt>``, a workflow's
facts its instance ID), so the consumer can look their chain up: the hops
``(eventId, subscriptionId)`` that led to them, oldest first. An event met with a non-empty
chain is itself registered under its ID, so facts caused by it (the causal router writes
``causedBy = eventId``) inherit the chain. The depth of an event is the length of its chain.

The reaction family of kinds is refused by the selector and the grammar already; the guard
checks it again so that no registry can open that loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.kinds import REACTION_FAMILY

__all__ = [
    "REACTION_ACTOR_PREFIX",
    "CauseChain",
    "Hop",
    "Suppression",
    "SuppressionReason",
    "cause_chain",
    "check_guards",
    "last_fire",
    "record_fire",
    "record_suppression",
    "register_causes",
    "suppressions",
]

#: The actor of facts a reaction writes itself: ``system:reaction:<subscriptionId>``.
REACTION_ACTOR_PREFIX = "system:reaction:"


class SuppressionReason(StrEnum):
    """Why a matching subscription did not fire."""

    SELF_CAUSE = "self_cause"
    DEPTH = "depth"
    COOLDOWN = "cooldown"
    REACTION_FAMILY = "reaction_family"
    BUDGET = "budget"
    NO_WORKFLOW = "no_workflow"


@dataclass(frozen=True, slots=True)
class Hop:
    """One reaction in a chain: ``subscription_id`` fired on ``event_id``."""

    event_id: str
    subscription_id: str


@dataclass(frozen=True, slots=True)
class CauseChain:
    """The reactions that led to an event, oldest first (empty: no reaction caused it)."""

    hops: tuple[Hop, ...] = ()

    @property
    def depth(self) -> int:
        return len(self.hops)

    def names(self, subscription_id: str) -> bool:
        return any(hop.subscription_id == subscription_id for hop in self.hops)

    def then(self, hop: Hop) -> CauseChain:
        return CauseChain((*self.hops, hop))

    def to_json(self) -> str:
        return json.dumps(
            [{"eventId": h.event_id, "subscriptionId": h.subscription_id} for h in self.hops],
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> CauseChain:
        return cls(tuple(Hop(h["eventId"], h["subscriptionId"]) for h in json.loads(text)))


@dataclass(frozen=True, slots=True)
class Suppression:
    """A recorded suppression (a ``reaction_suppressions`` row)."""

    delivery_key: str
    tenant_id: str
    project_id: str
    event_id: str
    event_type: str
    subscription_id: str
    reason: SuppressionReason
    detail: str
    depth: int
    cause_chain: CauseChain
    recorded_at_s: float


def _lookup_keys(event: Event) -> list[str]:
    keys: list[str] = []
    for value in (event.caused_by, event.correlation_id):
        if value:
            keys.append(value)
            # The wake consumer's correlation is ``<commandId>:<attempt>``.
            head, sep, tail = value.rpartition(":")
            if sep and tail.isdigit():
                keys.append(head)
    return keys


def cause_chain(db: sqlite3.Connection, event: Event) -> CauseChain:
    """The longest chain registered under the event's ``causedBy`` or ``correlationId``."""
    best = CauseChain()
    for key in _lookup_keys(event):
        row = db.execute("SELECT chain FROM reaction_causes WHERE cause_key = ?", (key,)).fetchone()
        if row is not None:
            chain = CauseChain.from_json(str(row[0]))
            if chain.depth > best.depth:
                best = chain
    return best


def check_guards(
    event: Event,
    chain: CauseChain,
    *,
    subscription_id: str,
    agent_id: str | None,
    depth_cap: int,
    cooldown_s: float,
    last_fire: tuple[str, float] | None,
    delivery_key: str,
    now_s: float,
) -> tuple[SuppressionReason, str] | None:
    """Why ``subscription_id`` must not fire on ``event`` (reason, detail), or None.

    ``last_fire`` is the subscription's last ``(delivery key, fired at)``: a retry of the
    same delivery is not held back by its own first attempt.
    """
    if event.event_type.split(".", 1)[0] == REACTION_FAMILY:
        return SuppressionReason.REACTION_FAMILY, f"{event.event_type} is a reaction's own fact"
    if event.actor == f"{REACTION_ACTOR_PREFIX}{subscription_id}":
        return (
            SuppressionReason.SELF_CAUSE,
            f"the event was written by this reaction ({event.actor})",
        )
    if agent_id is not None and event.actor == f"agent:{agent_id}":
        return SuppressionReason.SELF_CAUSE, f"agent {agent_id!r} never wakes on its own writes"
    if chain.names(subscription_id):
        return (
            SuppressionReason.SELF_CAUSE,
            f"the event's causedBy chain contains a reaction of {subscription_id!r}",
        )
    if chain.depth >= depth_cap:
        return (
            SuppressionReason.DEPTH,
            f"the event is {chain.depth} reaction(s) deep; the cap is {depth_cap} "
            "(RHUMBATRON_REACTION_DEPTH_CAP)",
        )
    if last_fire is not None:
        last_key, fired_at_s = last_fire
        waited = now_s - fired_at_s
        if last_key != delivery_key and waited < cooldown_s:
            return (
                SuppressionReason.COOLDOWN,
                f"the subscription fired {waited:.1f} s ago (on {last_key}); its cooldown is "
                f"{cooldown_s:g} s",
            )
    return None


def last_fire(db: sqlite3.Connection, subscription_id: str) -> tuple[str, float] | None:
    """The subscription's last ``(delivery key, fired at)``, or None if it never fired."""
    row = db.execute(
        "SELECT delivery_key, fired_at_s FROM reaction_fires WHERE subscription_id = ?",
        (subscription_id,),
    ).fetchone()
    return None if row is None else (str(row[0]), float(row[1]))


def record_fire(
    db: sqlite3.Connection,
    *,
    tenant_id: str,
    subscription_id: str,
    delivery_key: str,
    chain: CauseChain,
    cause_keys: Iterable[str],
    now_s: float,
) -> None:
    """Start the cooldown and register the IDs the reaction's effect carries, with the
    chain its facts will inherit (``chain`` already ends with this reaction's hop)."""
    db.execute(
        "INSERT INTO reaction_fires (subscription_id, delivery_key, fired_at_s) VALUES (?, ?, ?) "
        "ON CONFLICT (subscription_id) DO UPDATE SET delivery_key = excluded.delivery_key, "
        "fired_at_s = excluded.fired_at_s",
        (subscription_id, delivery_key, now_s),
    )
    register_causes(db, tenant_id=tenant_id, chain=chain, cause_keys=cause_keys, now_s=now_s)


def register_causes(
    db: sqlite3.Connection,
    *,
    tenant_id: str,
    chain: CauseChain,
    cause_keys: Iterable[str],
    now_s: float,
) -> None:
    """Register ``chain`` under each of ``cause_keys`` (a longer chain already there stays)."""
    if chain.depth == 0:
        return
    db.executemany(
        "INSERT INTO reaction_causes (cause_key, tenant_id, depth, chain, recorded_at_s) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (cause_key) DO UPDATE SET depth = excluded.depth, "
        "chain = excluded.chain WHERE excluded.depth > reaction_causes.depth",
        [(key, tenant_id, chain.depth, chain.to_json(), now_s) for key in cause_keys],
    )


def record_suppression(
    db: sqlite3.Connection,
    event: Event,
    *,
    subscription_id: str,
    delivery_key: str,
    reason: SuppressionReason,
    detail: str,
    chain: CauseChain,
    now_s: float,
) -> bool:
    """Record one suppression with the event's cause chain; False if it was recorded before
    (a redelivery)."""
    return (
        db.execute(
            "INSERT OR IGNORE INTO reaction_suppressions (delivery_key, tenant_id, project_id, "
            "event_id, event_type, subscription_id, reason, detail, depth, cause_chain, "
            "recorded_at_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                delivery_key,
                event.tenant_id,
                event.project_id,
                event.event_id,
                event.event_type,
                subscription_id,
                reason.value,
                detail,
                chain.depth,
                chain.to_json(),
                now_s,
            ),
        ).rowcount
        == 1
    )


def suppressions(
    db: sqlite3.Connection, *, tenant_id: str | None = None, limit: int = 100
) -> Sequence[Suppression]:
    """The newest suppressions first (of one tenant when given)."""
    rows = db.execute(
        "SELECT delivery_key, tenant_id, project_id, event_id, event_type, subscription_id, "
        "reason, detail, depth, cause_chain, recorded_at_s FROM reaction_suppressions "
        "WHERE ? IS NULL OR tenant_id = ? ORDER BY recorded_at_s DESC, delivery_key LIMIT ?",
        (tenant_id, tenant_id, limit),
    ).fetchall()
    return [
        Suppression(
            delivery_key=str(r[0]),
            tenant_id=str(r[1]),
            project_id=str(r[2]),
            event_id=str(r[3]),
            event_type=str(r[4]),
            subscription_id=str(r[5]),
            reason=SuppressionReason(str(r[6])),
            detail=str(r[7]),
            depth=int(r[8]),
            cause_chain=CauseChain.from_json(str(r[9])),
            recorded_at_s=float(r[10]),
        )
        for r in rows
    ]
