"""Composing Candidates (``candidate.create``) and composing them again after canonical
advanced (``candidates.recompose``).

The integration module's Candidate handlers (:class:`CompositionHandlers`, a part of
:class:`~rhumbatron.lifecycle.integration.IntegrationModule`): a verifying Change's work is
composed on the canonical base, its fork written and its verification started; a
``candidate.create`` that overlaps another Change's Candidate under verification waits for
its conflict review (``conflict_review_delay_s``) and composes anyway on its last delivery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rhumbatron.actors.shard_commands import ComposeCandidate, MoveChange
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.lifecycle.commands import lifecycle_command, rebase_command_id, verify_command_id
from rhumbatron.lifecycle.integration_core import IntegrationCore, change_of
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard

__all__ = ["RECOMPOSES_PER_DELIVERY", "CompositionHandlers"]

# The integration module's logger: its records keep the name they always had.
_log = logging.getLogger("rhumbatron.lifecycle.integration")

#: Stale Candidates one ``candidates.recompose`` delivery re-composes.
RECOMPOSES_PER_DELIVERY = 10


class CompositionHandlers(IntegrationCore):
    """``candidate.create`` and ``candidates.recompose``."""

    async def create_candidate(self, command: Command, delivery: Delivery) -> Retry | None:
        """Compose the Change's work on the canonical base (the Candidate ID derives from the
        composition key), write its fork, and start its verification."""
        project_id, change_id = command.project_id, change_of(command)
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None or change.status != ChangeStatus.VERIFYING.value:
            return None  # composed already and moved on, or ended
        base = self.world.canonical_generation(project_id)
        if await self._finish_current(shard, project_id, change_id, base):
            return None
        paths = _proposed_paths(shard, change_id)
        conflicts = self._conflicts(project_id, change_id, paths)
        if conflicts and not delivery.is_last:
            return Retry(
                self.app.settings.conflict_review_delay_s,
                f"waiting for the conflict review of {', '.join(sorted(conflicts))}",
            )
        if conflicts:
            _log.warning(
                "candidate.create %s composes anyway on its last delivery despite %s",
                command.command_id,
                conflicts,
            )
        if not paths:
            # Nothing to compose: the same empty composition would be every such Change's
            # Candidate (the key covers only the base and the changesets).
            shard.apply(
                self._caller(command),
                MoveChange(
                    change_id=change_id,
                    to=ChangeStatus.FAILED,
                    reason="its tasks completed without proposing a changeset; nothing to verify",
                ),
            )
            return None
        candidate = shard.apply(
            self._caller(command), ComposeCandidate(change_id=change_id, base_generation=base)
        )
        if candidate.status is CandidateStatus.CREATED:
            await self._start_verification(project_id, change_id, candidate)
        return None

    async def _finish_current(
        self, shard: ResourceShard, project_id: str, change_id: str, base: int
    ) -> bool:
        """True when the Change already has an open Candidate on ``base``: then a created
        one's fork and verification start are finished, and nothing is composed."""
        current = [
            c for c in shard.candidates(change_id=change_id) if c.open and c.base_generation == base
        ]
        if not current:
            return False
        _log.info(
            "change %s already has candidate %s on generation %d",
            change_id,
            [c.candidate_id for c in current],
            base,
        )
        # A delivery that composed the Candidate may have failed before its fork or its
        # verification start: this redelivery finishes them (both are idempotent), or
        # the Candidate would wait in ``created`` for a verification nobody started.
        for candidate in current:
            if candidate.status is CandidateStatus.CREATED:
                await self._start_verification(project_id, change_id, candidate)
        return True

    def _conflicts(self, project_id: str, change_id: str, paths: set[str]) -> list[str]:
        """Candidates of other Changes under verification (created) that touch ``paths``."""
        return [
            other.candidate.candidate_id
            for other in self.world.open_candidates(project_id)
            if other.change.change_id != change_id
            and other.candidate.status is CandidateStatus.CREATED
            and paths & set(other.candidate.paths)
        ]

    async def _start_verification(
        self, project_id: str, change_id: str, candidate: CandidateState
    ) -> None:
        """Write the Candidate's fork and start its verification (``cmd_<candidate>_verify``);
        again is harmless: the same fork, a duplicate send, an existing instance."""
        shard = self.world.change_shard(project_id, change_id)
        files = dict(self._canonical_files(project_id))
        for changeset in shard.changesets_of_candidate(candidate):
            files.update(changeset.files)
        self.forks.write(project_id, candidate.candidate_id, files)
        verify = lifecycle_command(
            "verification.start",
            verify_command_id(candidate.candidate_id),
            project_id=project_id,
            change_id=change_id,
            now=self.app.clock.now(),
            payload={"candidateId": candidate.candidate_id},
        )
        await self.sender.start_workflow(verify)

    def _canonical_files(self, project_id: str) -> dict[str, str]:
        snapshot = self.world.canonical_snapshot(project_id)
        return {} if snapshot is None else {d.path: d.content for d in snapshot.documents}

    async def recompose_candidates(self, command: Command, delivery: Delivery) -> Retry | None:
        """After canonical advanced: compose each stale Candidate's Change again on the new
        base (``candidate.create`` after a rebase, on the verification queue)."""
        project_id = command.project_id
        generation = int(command.payload.model_dump()["generation"])
        located = self.world.candidates(project_id)
        has_open = {c.change.change_id for c in located if c.candidate.open}
        stale = [
            c
            for c in located
            if c.candidate.status is CandidateStatus.STALE
            and c.change.status == ChangeStatus.VERIFYING.value
            and c.change.change_id not in has_open
        ]
        for index, item in enumerate(stale):
            if index >= RECOMPOSES_PER_DELIVERY:
                return self._more_work(command, delivery, f"{len(stale) - index} stale left")
            compose = lifecycle_command(
                "candidate.create",
                rebase_command_id(item.candidate.candidate_id, generation),
                project_id=project_id,
                change_id=item.change.change_id,
                now=self.app.clock.now(),
                payload={"baseGeneration": generation, "reason": "rebase"},
            )
            await self.sender.send(compose, queue="verification")
        return None


def _proposed_paths(shard: ResourceShard, change_id: str) -> set[str]:
    """Every path the Change's Tasks proposed in their changesets."""
    return {
        p
        for t in shard.tasks_of_change(change_id)
        if t.changeset_id and (cs := shard.changeset(t.changeset_id))
        for p in cs.paths
    }
