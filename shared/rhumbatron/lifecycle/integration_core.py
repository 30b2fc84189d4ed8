"""What every part of the integration module shares: its collaborators, the caller it acts as,
the bounded-work rule and the dispatch of a Change's ready Tasks.

:class:`IntegrationCore` is the base of the integration module's parts
(:mod:`~rhumbatron.lifecycle.settling`, :mod:`~rhumbatron.lifecycle.composition`,
:mod:`~rhumbatron.lifecycle.releasing`) and of
:class:`~rhumbatron.lifecycle.integration.IntegrationModule`, which joins them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import TaskStatus
from rhumbatron.errors import DomainError
from rhumbatron.lifecycle.commands import LifecycleSender, ready_wake
from rhumbatron.lifecycle.forks import ForkStore
from rhumbatron.lifecycle.world import LifecycleWorld
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows.engine import WorkflowEngine

if TYPE_CHECKING:
    from rhumbatron.lifecycle.apps import AppProvisioner
    from rhumbatron.lifecycle.context import LifecycleContext

__all__ = ["BOUNDED_EXHAUSTED_METRIC", "IntegrationCore", "change_of"]

# The integration module's logger: its records keep the name they always had.
_log = logging.getLogger("rhumbatron.lifecycle.integration")

BOUNDED_EXHAUSTED_METRIC = "bounded_command_exhausted"
#: Task states that have given their agent slot back.
_FREED = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.BLOCKED})


@dataclass
class IntegrationCore:
    """The integration module's collaborators and the helpers its handlers share."""

    app: LifecycleContext
    world: LifecycleWorld
    sender: LifecycleSender
    engine: WorkflowEngine
    forks: ForkStore
    apps: AppProvisioner

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

    # -- the Change --------------------------------------------------------------------------
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
            wake = ready_wake(
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=task.planned_agent or "agent",
                now=self.app.clock.now(),
            ).model_copy(update={"attempt": send_round or 1 + freed})
            await self.sender.send(wake)
            woken.append(wake.command_id)
        return woken


def change_of(command: Command) -> str:
    """The Change a command names; a :class:`DomainError` when it names none."""
    if command.change_id is None:
        raise DomainError(
            f"{command.command_type} {command.command_id} names no change; it needs change_id"
        )
    return command.change_id
