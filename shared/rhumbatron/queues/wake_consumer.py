"""The wake consumer: the agent-wakeups queue's handler (spec workers/agents wake-consumer).

It checks relevance again before any agent work, because a wake can outlive its reason:

* the Change ended, or the Task is gone, finished or blocked → a **stale** wake: it ends at
  once and counts as a false wakeup (``agent_false_wakeup`` in METRICS);
* a ready wake (``cmd_<task>_ready``, from the dispatcher) → ``admitAgent``: the Task is
  assigned to the Agent once. A ready wake for a Task the same Agent already holds is a
  duplicate (nothing happens again) — unless the Agent never got it: a handling that failed
  after the admission (the runtime raised, the function stopped) leaves no record in
  ``delivered_ready_wakes``, so the redelivery, or an operator's Retry of its dead letter,
  gives the Agent the wake it missed. A wake is recorded there once the runtime took it: a
  redelivery after a lost ack is a duplicate. One held by another Agent is stale; over the
  8-agent limit the Task stays ready and the router dispatches again when a slot frees;
* a router wake (``cmd_<event>_<task>``) for the Agent that holds the Task → relevant;
* a reaction's wake (``reason = reaction:<subscriptionId>``, seed 002: a subscription wakes an
  agent about a fact) → relevant whatever its Task, if any, is doing — unless its Change was
  cancelled since (cascade cancel: work caused by a cancelled Change's facts is dropped; a
  reaction to ``change.cancelled`` itself still goes), or the agent was already woken about
  that event (below).

**One wake per (agent, event).** Every delivered wake that names its event is recorded under
``(agentId, eventId)`` (``agent_event_wakes``, in the product database). A reaction's wake
for a pair already recorded by another wake — a second subscription, or the causal router's
own wake about the same fact — is a duplicate: the agent is activated once per event (seed
002's one-pass collapse). A redelivery of the same wake is not a second one. The causal
router's wake for a pair a reaction's wake already took **joins** that activation, in the
other order (DECISIONS "One activation per (agent, event)"): it carries its Task's lifecycle,
so it records ``agent.woke`` for the Task, but the agent, already woken about that event, is
not woken a second time.

A relevant wake goes to the Agent's runtime (:class:`AgentRuntime`: the scripted and webhook
agents), with the Task it names (None for a reaction's wake about no Task).

**agent.woke.** A wake that names a Change records ``agent.woke`` in the Change's shard: a
delivered wake just before the runtime gets it (so the Change's history reads woke, started,
completed, and the project view's active Agent is never revived by a late fact), a stale one
with ``falseWakeup: true`` next to the ``agent_false_wakeup`` count (the project view ignores
those). Its key is :func:`~rhumbatron.domain.agents.woke_fact_key` (command, attempt, Agent):
a redelivered message records it once. A duplicate or a wake held at the 8-agent limit woke
nobody and records nothing; nor does a wake about no Change, a Change the shard does not
know (``agent.woke`` is a Change Event), or a reaction's wake (it tells the agent about a
fact; it is no work on the Task it names, which the project view would show it active on).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import AdmitAgent, RecordAgentWoke
from rhumbatron.domain.agents import Admission, woke_fact_key
from rhumbatron.domain.changes import TERMINAL_STATUSES, ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.command_types import AgentWake
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.queues.context import QueueContext

__all__ = [
    "AGENT_EVENT_WAKES_SCHEMA",
    "FALSE_WAKEUP_METRIC",
    "AgentRuntime",
    "WakeConsumer",
    "WakeOutcome",
    "is_reaction_wake",
]

_log = logging.getLogger(__name__)

FALSE_WAKEUP_METRIC = "agent_false_wakeup"

#: The wakes delivered, by (agent, event): a reaction's wake for a pair taken is a duplicate.
#: And the ready wakes the agents' runtime took, by command: a ready wake for a Task its Agent
#: already holds is a duplicate once its runtime took it (both age out with the reactions'
#: history: a wake that old is never redelivered).
AGENT_EVENT_WAKES_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_event_wakes (
    agent_id    TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    command_id  TEXT NOT NULL,
    woken_at_s  REAL NOT NULL,
    PRIMARY KEY (agent_id, event_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS delivered_ready_wakes (
    command_id      TEXT NOT NULL PRIMARY KEY,
    agent_id        TEXT NOT NULL,
    delivered_at_s  REAL NOT NULL
) WITHOUT ROWID;
"""


class WakeOutcome(StrEnum):
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    STALE = "stale"
    AT_LIMIT = "at_limit"
    #: A router wake whose (agent, event) a reaction's wake already activated: its Task's
    #: agent.woke is recorded, the agent is not woken again.
    JOINED = "joined"


class AgentRuntime(Protocol):
    """Runs an Agent on its Task (scripted locally, a webhook for an external agent).

    ``task`` is the Task the wake names; None only for a reaction's wake that names none.
    """

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None: ...


@dataclass
class WakeConsumer:
    """The handler of ``agent-wakeups``: relevance, admission, then the Agent's runtime."""

    app: QueueContext
    runtime: AgentRuntime
    max_active_agents_per_change: int = 8
    outcomes: list[tuple[str, WakeOutcome]] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        outcome = self._decide(command)
        reaction = is_reaction_wake(command)
        if outcome is WakeOutcome.DUPLICATE and not reaction and not self._runtime_took(command):
            # The handling that admitted the Agent failed before its runtime took the wake
            # (the ack was not lost: the work was). Deliver the wake it missed.
            outcome = WakeOutcome.DELIVERED
        if outcome is WakeOutcome.DELIVERED and not reaction and self._pair_taken(command):
            outcome = WakeOutcome.JOINED
        self.outcomes.append((command.command_id, outcome))
        if outcome is WakeOutcome.STALE:
            self._count_false_wakeup(command)
            if not reaction:
                self._record_woke(command, false_wakeup=True)
        elif outcome is WakeOutcome.JOINED:
            self._record_woke(command, false_wakeup=False)
        elif outcome is WakeOutcome.DELIVERED:
            self._record_wake(command)
            if not reaction:
                # A reaction's wake is about a fact, not work on the Task it names: it must
                # not show the agent active there (the project view reads agent.woke so).
                self._record_woke(command, false_wakeup=False)
            task = None
            if command.task_id is not None and command.change_id is not None:
                task = self._shard(command).task_state(command.task_id)
            assert task is not None or is_reaction_wake(command)
            await self.runtime.wake(_agent_of(command), task, command)
            if _is_ready_wake(command):
                self._record_runtime_took(command)
        return None

    def _shard(self, command: Command) -> ResourceShard:
        assert command.change_id is not None
        return self.app.resource_shard(command.project_id, change_resource_key(command.change_id))

    def _decide(self, command: Command) -> WakeOutcome:
        if is_reaction_wake(command):
            return self._decide_reaction(command)
        if command.change_id is None or command.task_id is None:
            _log.warning("wake %s names no Task; nothing to wake for", command.command_id)
            return WakeOutcome.STALE
        shard = self._shard(command)
        change = shard.change_state(command.change_id)
        if change is not None and change.status in TERMINAL_STATUSES:
            return WakeOutcome.STALE
        agent = _agent_of(command)
        if _is_ready_wake(command):
            tenant = self.app.project_tenant(command.project_id) or "unknown"
            caller = Caller(tenant, f"agent:{agent}", f"{command.command_id}:{command.attempt}")
            admission = shard.apply(
                caller,
                AdmitAgent(
                    change_id=command.change_id,
                    task_id=command.task_id,
                    agent_id=agent,
                    limit=self.max_active_agents_per_change,
                ),
            )
            return {
                Admission.ADMITTED: WakeOutcome.DELIVERED,
                Admission.ALREADY_HOLDS: WakeOutcome.DUPLICATE,
                Admission.AT_LIMIT: WakeOutcome.AT_LIMIT,
                Admission.HELD_BY_OTHER: WakeOutcome.STALE,
                Admission.NOT_READY: WakeOutcome.STALE,
            }[admission]
        task = shard.task_state(command.task_id)
        holds = (
            task is not None
            and task.status in (TaskStatus.ASSIGNED, TaskStatus.RUNNING)
            and task.agent_id == agent
        )
        return WakeOutcome.DELIVERED if holds else WakeOutcome.STALE

    def _decide_reaction(self, command: Command) -> WakeOutcome:
        """A reaction's wake is relevant unless its Change was cancelled (cascade cancel), or
        another wake already woke the agent about the same event."""
        payload = _wake_of(command)
        if command.change_id is not None:
            change = self._shard(command).change_state(command.change_id)
            cancelled = change is not None and change.status == ChangeStatus.CANCELLED
            if cancelled and payload.event_kind != "change.cancelled":
                return WakeOutcome.STALE
        if self._pair_taken(command):
            return WakeOutcome.DUPLICATE
        return WakeOutcome.DELIVERED

    def _pair_taken(self, command: Command) -> bool:
        """Whether another wake (not a redelivery of this one) already activated the agent
        about this wake's event."""
        payload = _wake_of(command)
        if payload.event_id is None:
            return False
        row = (
            self.app.product()
            .connection.execute(
                "SELECT command_id FROM agent_event_wakes WHERE agent_id = ? AND event_id = ?",
                (payload.agent_id, payload.event_id),
            )
            .fetchone()
        )
        return row is not None and row[0] != command.command_id

    def _record_wake(self, command: Command) -> None:
        """Record a delivered wake under its (agent, event); the first wake keeps the pair."""
        payload = _wake_of(command)
        if payload.event_id is None:
            return
        with self.app.product().transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO agent_event_wakes (agent_id, event_id, command_id, "
                "woken_at_s) VALUES (?, ?, ?, ?)",
                (
                    payload.agent_id,
                    payload.event_id,
                    command.command_id,
                    self.app.clock.now().timestamp(),
                ),
            )

    def _runtime_took(self, command: Command) -> bool:
        """Whether the agents' runtime already took this (ready) wake."""
        row = (
            self.app.product()
            .connection.execute(
                "SELECT 1 FROM delivered_ready_wakes WHERE command_id = ?", (command.command_id,)
            )
            .fetchone()
        )
        return row is not None

    def _record_runtime_took(self, command: Command) -> None:
        """After the runtime returned: a later delivery of this wake is a duplicate."""
        with self.app.product().transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO delivered_ready_wakes (command_id, agent_id, "
                "delivered_at_s) VALUES (?, ?, ?)",
                (command.command_id, _agent_of(command), self.app.clock.now().timestamp()),
            )

    def _record_woke(self, command: Command, *, false_wakeup: bool) -> None:
        """``agent.woke`` in the Change's shard, once per wake message (module docstring)."""
        if command.change_id is None:
            return  # a reaction's wake about no Change: agent.woke is a Change Event
        agent = _agent_of(command)
        tenant = self.app.project_tenant(command.project_id) or "unknown"
        caller = Caller(
            tenant,
            f"agent:{agent}",
            f"{command.command_id}:{command.attempt}",
            caused_by=_wake_of(command).event_id,
        )
        self._shard(command).apply(
            caller,
            RecordAgentWoke(
                change_id=command.change_id,
                task_id=command.task_id,
                agent_id=agent,
                key=woke_fact_key(command, agent),
                false_wakeup=false_wakeup,
            ),
        )

    def _count_false_wakeup(self, command: Command) -> None:
        from rhumbatron.metrics import MetricsRecorder

        app = self.app
        recorder = MetricsRecorder(app.product(), app.metrics_sink, app.clock)
        recorder.record_one(FALSE_WAKEUP_METRIC, 1.0)
        _log.info("stale wake %s: counted as a false wakeup", command.command_id)


def is_reaction_wake(command: Command) -> bool:
    """Whether ``command`` is an agent reaction's wake (``reason = reaction:<sub>``)."""
    from rhumbatron.reactions.deliveries import REACTION_REASON_PREFIX

    payload = command.payload
    return isinstance(payload, AgentWake) and payload.reason.startswith(REACTION_REASON_PREFIX)


def _wake_of(command: Command) -> AgentWake:
    """The wake's payload: agent-wakeups carries nothing else (a command of another type sent
    there fails every delivery and ends as a dead letter that names it)."""
    payload = command.payload
    if not isinstance(payload, AgentWake):
        raise TypeError(
            f"{command.command_id} is a {command.command_type}, not an agent.wake: only wakes "
            "belong on agent-wakeups"
        )
    return payload


def _is_ready_wake(command: Command) -> bool:
    """The dispatcher's wake of a ready Task (``cmd_<task>_ready``): the one that admits."""
    return command.task_id is not None and command.command_id == f"cmd_{command.task_id}_ready"


def _agent_of(command: Command) -> str:
    return _wake_of(command).agent_id
