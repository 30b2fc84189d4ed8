"""Rule-based causal routing: plan each fresh Event, ask Clef-flash, cap, send.

:class:`RuleBasedRouting` implements the router's ``CausalRouting`` port. For each fresh
Event it takes the rules' plan (:func:`~rhumbatron.causal.rules.plan_for`), asks Clef-flash
each prefix-overlap question (a wake, an abstention or a reached call cap all wake), admits
each capped command against the 1,000-per-Change-per-day cap (a dropped command is logged and
counted there), hands the state effects to the lifecycle, and then sends the commands with
their stable IDs. Every step is idempotent per Event: the same plan, the same command IDs
(JetStream's duplicate window drops a repeat), recorded Clef-flash decisions, a cap that
counts a command ID once — so a redelivered Event causes nothing twice.

A Clef-flash question that was really asked of the model (not an abstention for want of a key,
nor a wake past the daily cap) records ``model.routed`` (the model, purpose ``clef_flash``) in
the Change of the Agent it was about, keyed by the Event's ID: the question is asked on that
Agent's behalf, and most resource Events (claims, challenges) name no Change of their own.

Outcomes per Event: applied; retried when NATS or a file is unavailable (nothing is the
Event's fault); failed when planning or applying it raised otherwise (counted, a poison letter
on the 5th).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rhumbatron.causal.rules import (
    ActiveAgent,
    ClefQuestion,
    PlannedCommand,
    RoutingWorld,
    StateEffect,
    acts_on,
    plan_for,
    wake_command,
)
from rhumbatron.core.clock import Clock
from rhumbatron.core.log_context import correlated
from rhumbatron.domain.agents import CLEF_FLASH_PURPOSE
from rhumbatron.errors import ActorError, MessagingError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.router.records import APPLIED, RecordOutcome, event_span

if TYPE_CHECKING:
    from rhumbatron.causal.clef_flash import ClefFlashDecision
    from rhumbatron.causal.command_cap import CommandCap
    from rhumbatron.messaging.commands import CommandBus

__all__ = ["EffectSink", "ModelRouteLog", "RoutedEvent", "RuleBasedRouting", "WakeDecider"]

_log = logging.getLogger(__name__)


class WakeDecider(Protocol):
    """Clef-flash: answers a prefix-overlap question."""

    async def ask(self, question: ClefQuestion) -> ClefFlashDecision: ...


@runtime_checkable
class ModelRouteLog(Protocol):
    """Where ``model.routed`` is recorded (:class:`~rhumbatron.causal.world.ShardWorld`:
    in the Change's shard, once per Event and Task)."""

    def record_model_routed(
        self, event: Event, agent: ActiveAgent, *, model: str, purpose: str
    ) -> None: ...


class EffectSink(Protocol):
    """The lifecycle: applies a state effect of an Event (idempotent per Event)."""

    async def apply(self, event: Event, effect: StateEffect) -> None: ...


@dataclass(frozen=True, slots=True)
class RoutedEvent:
    """What routing one Event did (kept for the demo's timeline and for tests)."""

    event_id: str
    rule: str
    sent: tuple[str, ...]
    duplicates: tuple[str, ...]
    dropped_by_cap: tuple[str, ...]
    clef_flash: tuple[tuple[str, str], ...]


@dataclass
class RuleBasedRouting:
    """The causal rules as the router's ``CausalRouting``."""

    world: RoutingWorld
    bus: Callable[[], Awaitable[CommandBus]]
    clock: Clock
    clef_flash: WakeDecider
    cap: CommandCap
    effects: EffectSink
    routed: list[RoutedEvent] | None = None

    def acts_on(self, event: Event) -> bool:
        return acts_on(event)

    async def route(
        self, events: Sequence[Event], traces: Mapping[str, str] | None = None
    ) -> dict[str, RecordOutcome]:
        outcomes: dict[str, RecordOutcome] = {}
        traces = traces or {}
        for event in events:
            # Its log lines carry its correlationId (Clef-flash's warnings, a failure here).
            with correlated(event.correlation_id):
                try:
                    # The commands it sends and the facts its effects write carry this span.
                    with event_span("route", event, traces.get(event.event_id)):
                        await self._route_one(event)
                    outcomes[event.event_id] = APPLIED
                except (MessagingError, ActorError, sqlite3.OperationalError) as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    outcomes[event.event_id] = RecordOutcome.retry(reason)
                except Exception as exc:
                    # The Event itself cannot be routed: counted, a poison letter on the 5th.
                    _log.exception("routing %s failed", event.event_id)
                    reason = f"{type(exc).__name__}: {exc}"
                    outcomes[event.event_id] = RecordOutcome.failed(reason)
        return outcomes

    async def _route_one(self, event: Event) -> None:
        now = self.clock.now()
        plan = plan_for(event, self.world, now=now)
        decisions: list[tuple[str, str]] = []
        commands: list[PlannedCommand] = list(plan.commands)
        for question in plan.questions:
            decision = await self.clef_flash.ask(question)
            decisions.append((question.agent.agent_id, str(decision.verdict)))
            if decision.asked_model:
                self._record_model_routed(question, decision.model)
            if decision.wakes:
                commands.append(wake_command(event, question.agent, now=now, reason="clef_flash"))
        sent: list[str] = []
        duplicates: list[str] = []
        dropped: list[str] = []
        # The state effects first: ``candidates.recompose`` settles the Candidates the stale
        # marking made (S0-145). Sent before it, a worker could take it, find nothing stale
        # and ack it, and a retry after a failed effect would resend it into the duplicate
        # window. The effects are idempotent, so a send that fails later repeats them safely.
        for effect in plan.effects:
            await self.effects.apply(event, effect)
        bus = await self.bus()
        for planned in commands:
            command = planned.command
            if planned.capped and not self.cap.admit_command(command, now):
                dropped.append(command.command_id)
                continue
            result = await bus.send(planned.queue, command)
            (duplicates if result.duplicate else sent).append(command.command_id)
        if self.routed is not None:
            self.routed.append(
                RoutedEvent(
                    event.event_id,
                    plan.rule,
                    tuple(sent),
                    tuple(duplicates),
                    tuple(dropped),
                    tuple(decisions),
                )
            )

    def _record_model_routed(self, question: ClefQuestion, model: str) -> None:
        """``model.routed`` for a question the model was asked. A failure raises: the Event
        is retried, its decision is reused (nothing is asked twice) and recorded then."""
        # The world records them when it can (ShardWorld: in the Change's shard).
        if isinstance(self.world, ModelRouteLog):
            self.world.record_model_routed(
                question.event, question.agent, model=model, purpose=CLEF_FLASH_PURPOSE
            )
