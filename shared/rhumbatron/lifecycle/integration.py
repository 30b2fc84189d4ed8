"""The integration module: one handler for the integration, verification and release queues.

Each command type has a handler that reads the Change where it lives, moves it through its
transitions (their facts commit with them) and sends what comes next with a stable command ID.
The consumer limits its own work (spec, MAX_DELIVERIES = 4):

1. a bounded command with more work asks for another delivery after 10 s
   (``integration_more_work_delay_s``);
2. a ``candidate.create`` that waits for a conflict review asks again after 45 s
   (``conflict_review_delay_s``); its last delivery composes anyway;
3. a thrown error retries after 30 s, and after 3 retries the command goes to the
   dead-letter queue (the queue runtime does this);
4. a bounded or waiting command gets at most 4 deliveries: on the 4th it is acknowledged and
   ``bounded_command_exhausted`` is counted; the quiet-Change settle sweep re-drives what is
   left (DECISIONS).

A command that no longer applies (its Change moved on or ended) is acknowledged: it did its
job before, or something else did.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rhumbatron.actors.shard_commands import (
    ComposeCandidate,
    FinishRelease,
    MoveChange,
    ProvisionApp,
    RemoveApp,
    SettleChange,
)
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.releases import ReleaseStatus, release_id_for
from rhumbatron.domain.tasks import DEAD_LETTER_LIMIT, TaskStatus
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.commands import (
    LifecycleSender,
    lifecycle_command,
    ready_wake_id,
    rebase_command_id,
    release_command_id,
    verify_command_id,
    workflow_input,
)
from rhumbatron.lifecycle.forks import ForkStore
from rhumbatron.lifecycle.world import LifecycleWorld
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows.engine import WorkflowEngine, WorkflowStatus, workflow_start_for

if TYPE_CHECKING:
    from rhumbatron.lifecycle.apps import AppProvisioner
    from rhumbatron.lifecycle.context import LifecycleContext

__all__ = [
    "BOUNDED_EXHAUSTED_METRIC",
    "FORKS_PER_DELIVERY",
    "RECOMPOSES_PER_DELIVERY",
    "ForkStore",
    "HandledCommand",
    "IntegrationModule",
]

_log = logging.getLogger(__name__)

BOUNDED_EXHAUSTED_METRIC = "bounded_command_exhausted"
#: Fork files one ``forks.sweep`` delivery deletes before it asks for another delivery.
FORKS_PER_DELIVERY = 100
#: Task states that have given their agent slot back.
_FREED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.BLOCKED})
#: Stale Candidates one ``candidates.recompose`` delivery re-composes.
RECOMPOSES_PER_DELIVERY = 10


@dataclass(frozen=True, slots=True)
class HandledCommand:
    """One handled delivery, kept for the demo's timeline and for tests."""

    command_id: str
    command_type: str
    delivered: int
    outcome: str


Handler = Callable[[Command, Delivery], Awaitable["Retry | None"]]


@dataclass
class IntegrationModule:
    """The integration, verification and release queues' handler."""

    app: LifecycleContext
    world: LifecycleWorld
    sender: LifecycleSender
    engine: WorkflowEngine
    forks: ForkStore
    apps: AppProvisioner
    handled: list[HandledCommand] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        handler = self._handlers().get(command.command_type)
        if handler is None:
            raise DomainError(
                f"the integration module does not handle {command.command_type!r}; it handles "
                + ", ".join(sorted(self._handlers()))
            )
        outcome = await handler(command, delivery)
        self.handled.append(
            HandledCommand(
                command.command_id,
                command.command_type,
                delivery.delivered,
                "retry" if outcome is not None else "done",
            )
        )
        return outcome

    def _handlers(self) -> dict[str, Handler]:
        return {
            "project.provision": self.provision_project,
            "app.provision": self.provision_app,
            "app.remove": self.remove_app,
            "project.cleanup": self.clean_up_project,
            "forks.sweep": self.sweep_forks,
            "change.dispatch": self.dispatch_change,
            "candidate.create": self.create_candidate,
            "change.settle": self.settle_change,
            "candidates.recompose": self.recompose_candidates,
            "release.recover": self.recover_release,
            "verification.start": self.start_workflow,
            "release.start": self.start_workflow,
        }

    # -- helpers -----------------------------------------------------------------------------
    def _caller(self, command: Command, tenant_id: str | None = None) -> Caller:
        tenant = tenant_id or self.app.project_tenant(command.project_id) or "platform"
        return Caller(tenant, "system:integration", command.command_id, caused_by=None)

    def _more_work(self, command: Command, delivery: Delivery, what: str) -> Retry | None:
        """A bounded command with more to do: another delivery in 10 s, unless this was
        its last (then acked and counted; the settle sweep re-drives what is left)."""
        if delivery.delivered < delivery.max_deliveries:
            return Retry(self.app.settings.integration_more_work_delay_s, f"more work: {what}")
        self._count_exhausted(command, what)
        return None

    def _count_exhausted(self, command: Command, what: str) -> None:
        from rhumbatron.metrics import MetricsRecorder

        _log.warning(
            "%s %s used its %d deliveries with work left (%s); acknowledged",
            command.command_type,
            command.command_id,
            4,
            what,
        )
        recorder = MetricsRecorder(self.app.product(), self.app.metrics_sink, self.app.clock)
        recorder.record_one(BOUNDED_EXHAUSTED_METRIC, 1.0)

    # -- projects ------------------------------------------------------------------------------
    async def provision_project(self, command: Command, delivery: Delivery) -> Retry | None:
        payload = command.payload.model_dump()
        caller = self._caller(command, tenant_id=payload["tenant_id"])
        self.app.project_root(command.project_id).create_project(caller, name=payload["name"])
        return None

    async def provision_app(self, command: Command, delivery: Delivery) -> Retry | None:
        app_name = str(command.payload.model_dump()["app_name"])
        await self.apps.provision(command.project_id, app_name, command.attempt)
        shard = self.world.admin_shard(command.project_id)
        shard.apply(self._caller(command), ProvisionApp(app_name=app_name))
        return None

    async def remove_app(self, command: Command, delivery: Delivery) -> Retry | None:
        app_name = str(command.payload.model_dump()["app_name"])
        shard = self.world.admin_shard(command.project_id)
        shard.apply(
            self._caller(command), RemoveApp(app_name=app_name, reason="removed on request")
        )
        return None

    async def clean_up_project(self, command: Command, delivery: Delivery) -> Retry | None:
        project_id = command.project_id
        status = self.world.project_status(project_id)
        if status == "active":
            _log.info("project.cleanup of active project %s: nothing to clean", project_id)
            return None
        shard = self.world.admin_shard(project_id)
        caller = self._caller(command)
        for app_name in shard.live_apps():
            shard.apply(caller, RemoveApp(app_name=app_name, reason=f"project {status}"))
        for _, candidate_id in self.forks.forks(project_id):
            self.forks.delete(project_id, candidate_id)
        return None

    async def sweep_forks(self, command: Command, delivery: Delivery) -> Retry | None:
        """Delete the forks nobody can promote any more: their Candidate was rejected or
        went stale, or its Change ended without it. Bounded per delivery."""
        deleted = 0
        for project_id, candidate_id in self.forks.forks():
            if deleted >= FORKS_PER_DELIVERY:
                return self._more_work(command, delivery, "forks left to sweep")
            located = self.world.find_candidate(project_id, candidate_id)
            abandoned = located is None or (
                located.candidate.status in (CandidateStatus.REJECTED, CandidateStatus.STALE)
                or (
                    located.change.ended
                    and located.candidate.status is not CandidateStatus.PROMOTED
                )
            )
            if abandoned and self.forks.delete(project_id, candidate_id):
                deleted += 1
        return None

    # -- the Change --------------------------------------------------------------------------
    async def dispatch_change(self, command: Command, delivery: Delivery) -> Retry | None:
        """Wake an Agent for each ready Task (``cmd_<task>_ready``), at most 8 active per
        Change: a Task over the limit stays ready, and a freed slot dispatches again."""
        change_id = _change_of(command)
        await self.dispatch(command.project_id, change_id)
        return None

    async def dispatch(
        self, project_id: str, change_id: str, *, send_round: int | None = None
    ) -> list[str]:
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None or change.status != ChangeStatus.OPEN.value:
            return []
        tasks = shard.tasks_of_change(change_id)
        free = self.app.settings.max_active_agents_per_change - sum(t.active for t in tasks)
        # The wake's command ID is the spec's cmd_<task>_ready; its send round is the number
        # of slots the Change has freed so far. A dispatch repeated without a freed slot is the
        # same message (JetStream drops it), while a wake turned away at the 8-agent limit is
        # sent again, as a new message, once a slot frees — not dropped for two hours.
        freed = sum(t.status in _FREED for t in tasks)
        woken: list[str] = []
        for task in [t for t in tasks if t.status is TaskStatus.READY][: max(free, 0)]:
            wake = lifecycle_command(
                "agent.wake",
                ready_wake_id(task.task_id),
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                now=self.app.clock.now(),
                payload={"agentId": task.planned_agent or "agent", "reason": "task_ready"},
            ).model_copy(update={"attempt": send_round or 1 + freed})
            await self.sender.send(wake)
            woken.append(wake.command_id)
        return woken

    async def create_candidate(self, command: Command, delivery: Delivery) -> Retry | None:
        """Compose the Change's work on the canonical base (the Candidate ID derives from the
        composition key), write its fork, and start its verification."""
        project_id, change_id = command.project_id, _change_of(command)
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None or change.status != ChangeStatus.VERIFYING.value:
            return None  # composed already and moved on, or ended
        base = self.world.canonical_generation(project_id)
        current = [
            c for c in shard.candidates(change_id=change_id) if c.open and c.base_generation == base
        ]
        if current:
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
            return None
        paths = {
            p
            for t in shard.tasks_of_change(change_id)
            if t.changeset_id and (cs := shard.changeset(t.changeset_id))
            for p in cs.paths
        }
        conflicts = [
            other.candidate.candidate_id
            for other in self.world.open_candidates(project_id)
            if other.change.change_id != change_id
            and other.candidate.status is CandidateStatus.CREATED
            and paths & set(other.candidate.paths)
        ]
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

    async def settle_change(self, command: Command, delivery: Delivery) -> Retry | None:
        """Decide the state of a Change that cannot move on its own, then close its open
        dead letters as ``superseded`` — unless a Task still waits, blocked by its dead
        letter, for an operator's Retry.

        Each decision that acts records ``change.settled`` (from, to, reason; keyed by the
        settle command's ID, so a redelivery records it once) in the transaction of the move:
        an open Change with a failed Task fails (with ``change.failed``); an open Change
        whose lost wakes are sent again, or a verifying one that gets a ``candidate.create``,
        stays where it is (``from == to``), recorded after the send. A pass that finds
        nothing to do (Agents still at work, nothing ready, an ended Change) records nothing:
        the sweep settles a quiet Change every few minutes for hours, and ``change.settled``
        can trigger reactions.
        """
        from rhumbatron.queues.dead_letter import supersede_letters_of_change

        project_id, change_id = command.project_id, _change_of(command)
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None:
            return None
        caller = self._caller(command)
        tasks = shard.tasks_of_change(change_id)
        waits_for_operator = any(
            t.status is TaskStatus.BLOCKED and t.blocked_limit == DEAD_LETTER_LIMIT for t in tasks
        )

        def settled(status: ChangeStatus, to: ChangeStatus, reason: str) -> None:
            shard.apply(
                caller,
                SettleChange(
                    change_id=change_id,
                    from_status=status,
                    to=to,
                    reason=reason,
                    key=command.command_id,
                ),
            )

        if change.status == ChangeStatus.OPEN.value:
            failed = [t for t in tasks if t.status is TaskStatus.FAILED]
            if failed:
                reasons = "; ".join(f"{t.task_id}: {t.reason}" for t in failed)
                settled(ChangeStatus.OPEN, ChangeStatus.FAILED, reasons)
                waits_for_operator = False
            elif not any(t.active for t in tasks):
                # A settle re-drives wakes that were lost (sent, but never admitted): its own
                # send round (the minute it was queued for) keeps JetStream from dropping
                # them as repeats of the first ones, and a redelivered settle sends the same.
                minute = int(command.created_at.timestamp() // 60)
                woken = await self.dispatch(project_id, change_id, send_round=minute)
                if woken:
                    settled(
                        ChangeStatus.OPEN,
                        ChangeStatus.OPEN,
                        f"no agent at work; woke {len(woken)} ready task(s) again",
                    )
        elif change.status == ChangeStatus.VERIFYING.value and not any(
            c.open for c in shard.candidates(change_id=change_id)
        ):
            compose = lifecycle_command(
                "candidate.create",
                f"{command.command_id}_candidate",
                project_id=project_id,
                change_id=change_id,
                now=self.app.clock.now(),
                payload={"reason": "settle"},
            )
            sent = await self.sender.send(compose)
            settled(
                ChangeStatus.VERIFYING,
                ChangeStatus.VERIFYING,
                f"no open candidate; candidate.create to compose one: {sent.outcome}",
            )
        if not waits_for_operator:
            supersede_letters_of_change(
                self.app.product(), change_id, self.app.clock.now().timestamp()
            )
        return None

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

    async def recover_release(self, command: Command, delivery: Delivery) -> Retry | None:
        """A Change still releasing long after promotion: finish what the release did, or
        start it again (its instance ID makes a lost start and a slow one meet)."""
        project_id, change_id = command.project_id, _change_of(command)
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
        elif instance.status is WorkflowStatus.failed:
            shard.apply(
                caller,
                FinishRelease(
                    release_id=release_id,
                    outcome=ReleaseStatus.FAILED,
                    reason=f"release workflow failed: {instance.error}",
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

    async def start_workflow(self, command: Command, delivery: Delivery) -> Retry | None:
        """``verification.start`` / ``release.start``: the idempotency key is the workflow
        instance ID, so a redelivery finds the existing instance."""
        workflow, instance_id = workflow_start_for(command)
        await self.engine.start(workflow, instance_id, workflow_input(command))
        return None


def _change_of(command: Command) -> str:
    if command.change_id is None:
        raise DomainError(
            f"{command.command_type} {command.command_id} names no change; it needs change_id"
        )
    return command.change_id
