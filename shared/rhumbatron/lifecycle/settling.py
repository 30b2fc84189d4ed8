"""Settling a Change that cannot move on its own (``change.settle``).

The integration module's settle handler (:class:`SettleHandler`, a part of
:class:`~rhumbatron.lifecycle.integration.IntegrationModule`): an open Change with a failed
Task fails; an open one with no Agent at work has its lost wakes sent again; a verifying one
with no open Candidate gets a ``candidate.create``. Then the Change's open dead letters close
as ``superseded``, unless a Task still waits for an operator's Retry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rhumbatron.actors.shard_commands import SettleChange
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.tasks import DEAD_LETTER_LIMIT, TaskState, TaskStatus
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.lifecycle.integration_core import IntegrationCore, change_of
from rhumbatron.messaging.queue_consumer import Delivery, Retry
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.actors.resource_shard import ResourceShard

__all__ = ["SettleHandler"]

#: Records ``change.settled`` (from, to, reason) in the transaction of the move.
_Settled = Callable[[ChangeStatus, ChangeStatus, str], None]


class SettleHandler(IntegrationCore):
    """``change.settle``: see :meth:`settle_change`."""

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

        project_id, change_id = command.project_id, change_of(command)
        shard = self.world.change_shard(project_id, change_id)
        change = shard.change_state(change_id)
        if change is None:
            return None
        settled = _settled_by(shard, self._caller(command), change_id, command)
        tasks = shard.tasks_of_change(change_id)
        waits_for_operator = any(
            t.status is TaskStatus.BLOCKED and t.blocked_limit == DEAD_LETTER_LIMIT for t in tasks
        )
        if change.status == ChangeStatus.OPEN.value:
            if await self._settle_open(command, change_id, tasks, settled):
                waits_for_operator = False
        elif change.status == ChangeStatus.VERIFYING.value and not any(
            c.open for c in shard.candidates(change_id=change_id)
        ):
            await self._settle_verifying(command, change_id, settled)
        if not waits_for_operator:
            supersede_letters_of_change(
                self.app.product(), change_id, self.app.clock.now().timestamp()
            )
        return None

    async def _settle_open(
        self, command: Command, change_id: str, tasks: Sequence[TaskState], settled: _Settled
    ) -> bool:
        """An open Change: it fails when a Task failed (True: no Task waits for an operator
        any more), or its lost wakes are sent again when no Agent is at work."""
        failed = [t for t in tasks if t.status is TaskStatus.FAILED]
        if failed:
            reasons = "; ".join(f"{t.task_id}: {t.reason}" for t in failed)
            settled(ChangeStatus.OPEN, ChangeStatus.FAILED, reasons)
            return True
        if not any(t.active for t in tasks):
            # A settle re-drives wakes that were lost (sent, but never admitted): its own
            # send round (the minute it was queued for) keeps JetStream from dropping
            # them as repeats of the first ones, and a redelivered settle sends the same.
            minute = int(command.created_at.timestamp() // 60)
            woken = await self.dispatch(command.project_id, change_id, send_round=minute)
            if woken:
                settled(
                    ChangeStatus.OPEN,
                    ChangeStatus.OPEN,
                    f"no agent at work; woke {len(woken)} ready task(s) again",
                )
        return False

    async def _settle_verifying(self, command: Command, change_id: str, settled: _Settled) -> None:
        """A verifying Change with no open Candidate: a ``candidate.create`` to compose one."""
        compose = lifecycle_command(
            "candidate.create",
            f"{command.command_id}_candidate",
            project_id=command.project_id,
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


def _settled_by(shard: ResourceShard, caller: Caller, change_id: str, command: Command) -> _Settled:
    """Record ``change.settled`` in the Change's shard, keyed by the settle command's ID."""

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

    return settled
