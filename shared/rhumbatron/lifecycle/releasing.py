"""Releasing a promoted Change: starting its release, and recovering one that stalls
(``release.recover``).

The integration module's release handlers (:class:`ReleaseHandlers`, a part of
:class:`~rhumbatron.lifecycle.integration.IntegrationModule`): the promoted Candidate goes to
the project's live app under a release ID derived from its generation, so a lost start and a
slow one meet; a Change still releasing long after promotion has its release finished or
started again.
"""

from __future__ import annotations

from rhumbatron.actors.shard_commands import FinishRelease, MoveChange
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.releases import ReleaseStatus, release_id_for
from rhumbatron.lifecycle.commands import lifecycle_command, release_command_id, workflow_input
from rhumbatron.lifecycle.integration_core import IntegrationCore, change_of
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows.engine import WorkflowStatus, workflow_start_for

__all__ = ["ReleaseHandlers"]


class ReleaseHandlers(IntegrationCore):
    """``release.recover``, and the start of a release after a promotion."""

    async def recover_release(self, command: Command, delivery: Delivery) -> Retry | None:
        """A Change still releasing long after promotion: finish what the release did, or
        start it again (its instance ID makes a lost start and a slow one meet)."""
        project_id, change_id = command.project_id, change_of(command)
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None or change.status != ChangeStatus.RELEASING.value:
            return None
        caller = self._caller(command)
        release_id = str(command.payload.model_dump()["release_id"])
        release = shard.release(release_id) if release_id else None
        if release is None:
            # Started directly on the engine: the first release.start may sit in JetStream's
            # duplicate window (2 h > 45 min), and the release ID makes the two meet anyway.
            await self.start_release(project_id, change_id, caller, direct=True)
            return None
        if release.status is not ReleaseStatus.STARTED:
            shard.apply(
                caller,
                FinishRelease(release_id=release_id, outcome=release.status, reason=release.reason),
            )
            return None
        instance = await self.engine.describe("release", release_id)
        if instance is None or instance.status is WorkflowStatus.running:
            resume = getattr(self.engine, "resume", None)
            if instance is not None and resume is not None:
                await resume(release_id)
            elif instance is None:
                await self.start_release(project_id, change_id, caller, direct=True)
        elif instance.status in (WorkflowStatus.failed, WorkflowStatus.cancelled):
            shard.apply(
                caller,
                FinishRelease(
                    release_id=release_id,
                    outcome=ReleaseStatus.FAILED,
                    reason=f"release workflow {instance.status}: {instance.error}",
                ),
            )
        else:
            shard.apply(
                caller, FinishRelease(release_id=release_id, outcome=ReleaseStatus.COMPLETED)
            )
        return None

    async def start_release(
        self, project_id: str, change_id: str, caller: Caller, *, direct: bool = False
    ) -> str:
        """Release the Change's promoted Candidate to the project's live app, or complete the
        Change when the project has no live app (nothing to release). ``direct`` starts the
        workflow on the engine instead of sending ``release.start`` (recovery)."""
        shard = self.world.change_shard(project_id, change_id)
        # The generation this Change's Candidate became, not canonical's current one: a
        # recovery 45 minutes later (or a late canonical.advanced) may find canonical moved
        # on, and that generation's release belongs to another Change.
        promoted = self.world.promoted_candidate(project_id, change_id)
        apps = self.world.admin_shard(project_id).live_apps()
        if not apps or promoted is None:
            shard.apply(
                caller,
                MoveChange(
                    change_id=change_id,
                    to=ChangeStatus.COMPLETED,
                    reason="promoted; the project has no live app to release"
                    if promoted is not None or not apps
                    else "no candidate of it was promoted; nothing to release",
                ),
            )
            return "completed_without_release"
        candidate, generation = promoted
        release_id = release_id_for(project_id, generation)
        start = lifecycle_command(
            "release.start",
            release_command_id(release_id),
            project_id=project_id,
            change_id=change_id,
            now=self.app.clock.now(),
            payload={
                "releaseId": release_id,
                "generation": generation,
                "candidateId": candidate.candidate_id,
                "appName": apps[0],
            },
        )
        if direct:
            workflow, instance_id = workflow_start_for(start)
            started = await self.engine.start(workflow, instance_id, workflow_input(start))
            return "started_directly" if started.started else "already_started"
        sent = await self.sender.start_workflow(start)
        return sent.outcome
