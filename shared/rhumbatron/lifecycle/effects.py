"""What ``canonical.advanced`` does to Candidates and Changes (the router's state effect).

After canonical advanced (spec "Causal routing" notes): the promoted Candidate is marked
``promoted``; every other open Candidate on an earlier base ``stale``; a Change in
``awaiting_approval`` with no verified Candidate left goes back to ``verifying``; then the
``candidates.recompose`` the router sent settles each stale Candidate. The promoted Change,
now ``releasing``, gets its release started (or completes when the project has no live app).

Every step is a transition that does nothing when repeated, so a redelivered
``canonical.advanced`` changes nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.shard_commands import DecideCandidate, MoveChange, RecordPromotion
from rhumbatron.causal.rules import StateEffect
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Event

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard
    from rhumbatron.lifecycle.integration import IntegrationModule
    from rhumbatron.lifecycle.world import LocatedCandidate

__all__ = ["LifecycleEffects"]

_log = logging.getLogger(__name__)


@dataclass
class LifecycleEffects:
    """The router's :class:`~rhumbatron.causal.routing.EffectSink`."""

    integration: IntegrationModule

    async def apply(self, event: Event, effect: StateEffect) -> None:
        if effect.kind != "candidates_after_advance":
            raise DomainError(f"unknown state effect {effect.kind!r} of {event.event_type}")
        world = self.integration.world
        project_id = event.project_id
        generation = int(effect.detail["generation"])
        promoted_id = str(effect.detail["promoted_candidate_id"])
        caller = Caller(
            event.tenant_id, "system:causal-router", event.event_id, caused_by=event.event_id
        )
        promoted = world.find_candidate(project_id, promoted_id)
        if promoted is not None and promoted.candidate.status is not CandidateStatus.PROMOTED:
            _mark_promoted(
                world.change_shard(project_id, promoted.change.change_id),
                caller,
                promoted,
                generation,
            )
        for other in world.open_candidates(project_id):
            candidate = other.candidate
            if candidate.candidate_id == promoted_id or candidate.base_generation >= generation:
                continue
            world.change_shard(project_id, other.change.change_id).apply(
                caller,
                DecideCandidate(
                    candidate_id=candidate.candidate_id,
                    to=CandidateStatus.STALE,
                    reason=f"canonical advanced to generation {generation}",
                ),
            )
        for change in world.changes(project_id, (ChangeStatus.AWAITING_APPROVAL.value,)):
            shard = world.change_shard(project_id, change.change_id)
            if not any(
                c.status is CandidateStatus.VERIFIED
                for c in shard.candidates(change_id=change.change_id)
            ):
                shard.apply(
                    caller,
                    MoveChange(
                        change_id=change.change_id,
                        to=ChangeStatus.VERIFYING,
                        reason=f"its candidate went stale at generation {generation}",
                        key=f"advance:{generation}",
                    ),
                )
        if promoted is not None:
            latest = world.change_shard(project_id, promoted.change.change_id).change_state(
                promoted.change.change_id
            )
            if latest is not None and latest.status == ChangeStatus.RELEASING.value:
                outcome = await self.integration.start_release(project_id, latest.change_id, caller)
                _log.info("release of %s after %s: %s", latest.change_id, event.event_id, outcome)


def _mark_promoted(
    shard: ResourceShard, caller: Caller, promoted: LocatedCandidate, generation: int
) -> None:
    """The Candidate canonical advanced to is ``promoted``, and its Change records the
    promotion (a repeat of what the approval recorded adds nothing)."""
    candidate_id = promoted.candidate.candidate_id
    shard.apply(
        caller,
        DecideCandidate(
            candidate_id=candidate_id,
            to=CandidateStatus.PROMOTED,
            reason=f"canonical generation {generation}",
        ),
    )
    shard.apply(
        caller,
        RecordPromotion(
            change_id=promoted.change.change_id,
            candidate_id=candidate_id,
            expected_generation=generation - 1,
        ),
    )
