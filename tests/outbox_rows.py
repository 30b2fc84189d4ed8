"""Outbox rows written straight into an actor's file, for tests of what the publisher does
with them: rows of several projects in one outbox, which no domain transition writes."""

from __future__ import annotations

from collections.abc import Sequence

from rhumbatron.actors.actor import Actor
from rhumbatron.actors.outbox import append_facts
from rhumbatron.actors.storage import write_transaction
from rhumbatron.core.clock import ManualClock
from rhumbatron.domain.facts import Caller, FactContext


def append_ready_tasks(
    shard: Actor, caller: Caller, project: str, task_ids: Sequence[str], clock: ManualClock
) -> None:
    """Append a task.ready fact of ``project`` (its Change ``<project>-chg``) per Task to
    ``shard``'s outbox, in one transaction."""
    ctx = FactContext(caller, project, clock.now())
    facts = [ctx.fact("task.ready", {}, change_id=f"{project}-chg", task_id=t) for t in task_ids]
    with write_transaction(shard.connection, shard.path) as db:
        append_facts(
            db,
            facts,
            owner="resource_shard",
            project_id=project,
            now_s=clock.now().timestamp(),
            max_event_bytes=shard.settings.max_event_bytes,
        )
