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

:class:`IntegrationModule` joins the handlers of its parts: settling a Change
(:mod:`~rhumbatron.lifecycle.settling`), composing Candidates
(:mod:`~rhumbatron.lifecycle.composition`) and releasing (:mod:`~rhumbatron.lifecycle.releasing`),
on what they share (:mod:`~rhumbatron.lifecycle.integration_core`); the projects, the fork
sweep, the dispatch of a Change and the workflow starts are handled here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rhumbatron.actors.shard_commands import ProvisionApp, RemoveApp
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.commands import workflow_input
from rhumbatron.lifecycle.composition import CompositionHandlers
from rhumbatron.lifecycle.integration_core import change_of
from rhumbatron.lifecycle.releasing import ReleaseHandlers
from rhumbatron.lifecycle.settling import SettleHandler
from rhumbatron.lifecycle.subjects import check_command_subject
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows.engine import workflow_start_for

__all__ = [
    "FORKS_PER_DELIVERY",
    "HandledCommand",
    "IntegrationModule",
]

_log = logging.getLogger(__name__)

#: Fork files one ``forks.sweep`` delivery deletes before it asks for another delivery.
FORKS_PER_DELIVERY = 100


@dataclass(frozen=True, slots=True)
class HandledCommand:
    """One handled delivery, kept for the demo's timeline and for tests."""

    command_id: str
    command_type: str
    delivered: int
    outcome: str


Handler = Callable[[Command, Delivery], Awaitable["Retry | None"]]


@dataclass
class IntegrationModule(SettleHandler, CompositionHandlers, ReleaseHandlers):
    """The integration, verification and release queues' handler."""

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

    # -- projects ------------------------------------------------------------------------------
    async def provision_project(self, command: Command, delivery: Delivery) -> Retry | None:
        payload = command.payload.model_dump()
        caller = self._caller(command, tenant_id=payload["tenant_id"])
        self.app.project_root(command.project_id).create_project(caller, name=payload["name"])
        return None

    async def provision_app(self, command: Command, delivery: Delivery) -> Retry | None:
        check_command_subject(self.world, command)  # an app of no project: a failure
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
        change_id = change_of(command)
        await self.dispatch(command.project_id, change_id)
        return None

    async def start_workflow(self, command: Command, delivery: Delivery) -> Retry | None:
        """``verification.start`` / ``release.start``: the idempotency key is the workflow
        instance ID, so a redelivery finds the existing instance. A start whose Change,
        Candidate, generation or app does not exist is a failure, never started."""
        check_command_subject(self.world, command)
        workflow, instance_id = workflow_start_for(command)
        await self.engine.start(workflow, instance_id, workflow_input(command))
        return None
