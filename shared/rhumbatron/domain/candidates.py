"""Candidates: a Change's changesets composed on a base generation, verified, then promoted.

The composition key is SHA-256 over the base generation and the sorted changeset IDs
(DECISIONS), and the Candidate ID derives from it: composing the same work on the same base
twice is the same Candidate, so a redelivered ``candidate.create`` creates nothing new.

A Candidate is ``created`` (verification running), then ``verified`` or ``rejected``; an open
one (created or verified) becomes ``stale`` when canonical advances past its base, and the
promoted one ``promoted``. Candidates live in the shard of their Change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Insert, Transition, Update, parse_state
from rhumbatron.errors import DomainError

__all__ = [
    "CANDIDATE_MOVES",
    "OPEN_CANDIDATE_STATUSES",
    "CandidateState",
    "CandidateStatus",
    "candidate_id_for",
    "composition_key",
    "create_candidate",
    "decide_candidate",
]


class CandidateStatus(StrEnum):
    CREATED = "created"
    VERIFIED = "verified"
    REJECTED = "rejected"
    STALE = "stale"
    PROMOTED = "promoted"


_C = CandidateStatus
#: Open Candidates can still be promoted; canonical advancing past their base makes them stale.
OPEN_CANDIDATE_STATUSES = frozenset({_C.CREATED, _C.VERIFIED})
CANDIDATE_MOVES: MappingProxyType[CandidateStatus, frozenset[CandidateStatus]] = MappingProxyType(
    {
        _C.CREATED: frozenset({_C.VERIFIED, _C.REJECTED, _C.STALE}),
        _C.VERIFIED: frozenset({_C.PROMOTED, _C.STALE}),
    }
)


@dataclass(frozen=True, slots=True)
class CandidateState:
    """One ``candidates`` row."""

    candidate_id: str
    change_id: str
    composition_key: str
    base_generation: int
    changeset_ids: tuple[str, ...]
    paths: tuple[str, ...]
    status: CandidateStatus
    reason: str = ""

    @property
    def open(self) -> bool:
        return self.status in OPEN_CANDIDATE_STATUSES


def composition_key(base_generation: int, changeset_ids: Sequence[str]) -> str:
    """SHA-256 (hex) over the base generation and the sorted changeset IDs, joined by the
    unit separator (U+001F), which no ID may hold — so no two inputs share a byte string."""
    if base_generation < 0:
        raise DomainError(f"base generation {base_generation} is negative")
    bad = [i for i in changeset_ids if "\x1f" in i]
    if bad:
        raise DomainError(f"changeset IDs {bad!r} hold U+001F, the key's separator")
    parts = [str(base_generation), *sorted(changeset_ids)]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def candidate_id_for(key: str) -> str:
    """``cand_`` + the first 32 hex characters of the composition key."""
    return f"cand_{key[:32]}"


def create_candidate(
    existing: CandidateState | None,
    change_status: str | None,
    ctx: FactContext,
    *,
    change_id: str,
    base_generation: int,
    changeset_ids: Sequence[str],
    paths: Sequence[str],
) -> tuple[CandidateState, Transition]:
    """Compose the Candidate (``candidate.created``); composing the same work on the same
    base again returns the existing one and writes nothing."""
    key = composition_key(base_generation, changeset_ids)
    candidate_id = candidate_id_for(key)
    if existing is not None:
        if existing.candidate_id != candidate_id or existing.change_id != change_id:
            raise DomainError(
                f"candidate {existing.candidate_id!r} of change {existing.change_id!r} is not "
                f"the composition {candidate_id!r} of change {change_id!r}"
            )
        return existing, Transition()
    _check_composable(change_id, change_status, changeset_ids)
    candidate = CandidateState(
        candidate_id=candidate_id,
        change_id=change_id,
        composition_key=key,
        base_generation=base_generation,
        changeset_ids=tuple(sorted(changeset_ids)),
        paths=tuple(sorted(set(paths))),
        status=CandidateStatus.CREATED,
    )
    row = _candidate_row(candidate, ctx)
    fact = ctx.fact(
        "candidate.created",
        {
            "candidateId": candidate_id,
            "baseGeneration": base_generation,
            "compositionKey": key,
            "changesetIds": list(candidate.changeset_ids),
        },
        change_id=change_id,
        key=candidate_id,
    )
    return candidate, Transition(patch=(Insert("candidates", row),), facts=(fact,))


def _check_composable(
    change_id: str, change_status: str | None, changeset_ids: Sequence[str]
) -> None:
    """A Candidate is composed only of a verifying Change, and of at least one changeset."""
    if change_status != "verifying":
        raise DomainError(
            f"change {change_id!r} is {change_status or 'unknown'}; a candidate is composed "
            "only while it is verifying"
        )
    if not changeset_ids:
        raise DomainError(
            f"change {change_id!r} has no changeset: nothing to compose (an empty composition "
            "would be every such Change's Candidate)"
        )


def _candidate_row(candidate: CandidateState, ctx: FactContext) -> dict[str, Any]:
    """The ``candidates`` row of a new Candidate."""
    return {
        "candidate_id": candidate.candidate_id,
        "change_id": candidate.change_id,
        "composition_key": candidate.composition_key,
        "base_generation": candidate.base_generation,
        "changeset_ids": json.dumps(list(candidate.changeset_ids)),
        "paths": json.dumps(list(candidate.paths)),
        "status": candidate.status.value,
        "reason": "",
        "created_at": ctx.now.isoformat(),
        "updated_at": ctx.now.isoformat(),
    }


def decide_candidate(
    candidate: CandidateState | None,
    ctx: FactContext,
    *,
    candidate_id: str,
    to: CandidateStatus | str,
    reason: str = "",
) -> Transition:
    """Move the Candidate (``candidate.<status>``); already there is nothing; an illegal move
    raises :class:`DomainError` naming the legal ones."""
    target = parse_state(CandidateStatus, to)
    if candidate is None:
        raise DomainError(f"no candidate {candidate_id!r}; compose it first")
    if candidate.status is target:
        return Transition()
    allowed = CANDIDATE_MOVES.get(candidate.status, frozenset())
    if target not in allowed:
        legal = ", ".join(sorted(s.value for s in allowed)) or "none"
        raise DomainError(
            f"candidate {candidate_id!r} is {candidate.status}; it cannot become {target} "
            f"(legal: {legal})"
        )
    moved = replace(candidate, status=target, reason=reason)
    fact = ctx.fact(
        f"candidate.{target.value}",
        {"candidateId": candidate_id, "reason": reason},
        change_id=candidate.change_id,
        key=candidate_id,
    )
    return Transition(
        patch=(
            Update(
                "candidates",
                {"candidate_id": candidate_id},
                {"status": moved.status.value, "reason": reason, "updated_at": ctx.now.isoformat()},
            ),
        ),
        facts=(fact,),
    )
