"""Building and sending the lifecycle's commands, with their stable IDs.

Every command the integration module sends has an ID derived from what caused it, so a
redelivered step sends the same ID and JetStream's duplicate window drops the repeat:
``cmd_<task>_ready`` (a dispatcher's wake), ``cmd_<candidate>_verify`` and
``cmd_<release>_release`` (workflow starts), ``cmd_<candidate>_rebase_<generation>`` (a
recompose after canonical advanced).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rhumbatron.errors import MessagingError
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows.engine import WorkflowEngine, WorkflowStart, workflow_start_for

if TYPE_CHECKING:
    from rhumbatron.causal.command_cap import CommandCap
    from rhumbatron.lifecycle.context import LifecycleContext

__all__ = [
    "LifecycleSender",
    "SentCommand",
    "lifecycle_command",
    "ready_wake",
    "ready_wake_id",
    "rebase_command_id",
    "release_command_id",
    "verify_command_id",
]

_log = logging.getLogger(__name__)


def ready_wake_id(task_id: str) -> str:
    """The dispatcher's wake of a ready Task (spec: ``cmd_<task>_ready``)."""
    return f"cmd_{task_id}_ready"


def verify_command_id(candidate_id: str) -> str:
    return f"cmd_{candidate_id}_verify"


def release_command_id(release_id: str) -> str:
    return f"cmd_{release_id}_release"


def rebase_command_id(candidate_id: str, generation: int) -> str:
    return f"cmd_{candidate_id}_rebase_{generation}"


def lifecycle_command(
    command_type: str,
    command_id: str,
    *,
    project_id: str,
    now: datetime,
    payload: dict[str, Any],
    change_id: str | None = None,
    task_id: str | None = None,
) -> Command:
    return Command.create(
        command_id=command_id,
        command_type=command_type,
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        created_at=now,
        payload=payload,
    )


def ready_wake(
    *, project_id: str, change_id: str, task_id: str, agent_id: str, now: datetime
) -> Command:
    """The dispatcher's wake of a ready Task for ``agent_id`` (``cmd_<task>_ready``), at its
    first send."""
    return lifecycle_command(
        "agent.wake",
        ready_wake_id(task_id),
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        now=now,
        payload={"agentId": agent_id, "reason": "task_ready"},
    )


@dataclass(frozen=True, slots=True)
class SentCommand:
    """What became of one command: sent, a duplicate, dropped by the cap, or started
    directly on the engine because the send failed."""

    command_id: str
    outcome: str


@dataclass
class LifecycleSender:
    """Sends lifecycle commands through the command bus, counted by the per-Change cap."""

    app: LifecycleContext
    cap: CommandCap
    engine: WorkflowEngine

    async def send(self, command: Command, *, queue: str | None = None) -> SentCommand:
        """Send ``command`` on its queue (or ``queue``); a counted command past the
        1,000-per-Change cap is dropped (logged and counted by the cap)."""
        if not self.cap.admit_command(command, self.app.clock.now()):
            return SentCommand(command.command_id, "dropped_by_cap")
        bus = await self.app.command_bus()
        result = await bus.send(queue or COMMAND_TYPES[command.command_type].queue, command)
        return SentCommand(command.command_id, "duplicate" if result.duplicate else "sent")

    async def start_workflow(self, command: Command) -> SentCommand:
        """Send a workflow start command; only when the send fails, start the workflow
        directly on the engine (spec workflow-commands.ts) — its instance ID makes the two
        paths meet in one instance."""
        try:
            return await self.send(command)
        except MessagingError as exc:
            workflow, instance_id = workflow_start_for(command)
            _log.warning(
                "sending %s failed (%s); starting workflow %s %s directly",
                command.command_id,
                exc,
                workflow,
                instance_id,
            )
            start: WorkflowStart = await self.engine.start(
                workflow, instance_id, workflow_input(command)
            )
            return SentCommand(
                command.command_id, "started_directly" if start.started else "already_started"
            )


def workflow_input(command: Command) -> dict[str, Any]:
    """What a workflow instance is started with: where its subject lives."""
    return {
        "projectId": command.project_id,
        "changeId": command.change_id,
        **command.payload.model_dump(mode="json"),
    }
