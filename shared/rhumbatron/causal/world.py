"""The causal rules' view of a project, read from its ResourceShard actor files.

An *active agent* holds an ``assigned`` or ``running`` Task; its resources are the paths of
its declared intents and the resources it has claimed, across the project's shards. The
8-agent limit is per Change (DECISIONS): a ready Task waits at the limit when its Change has
``max_active_agents_per_change`` agents active. The rules only read; routing records one
thing through it: ``model.routed``, in the shard of the asked-about Agent's Change
(:class:`~rhumbatron.causal.routing.ModelRouteLog`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.actors.actor import ActorKind, ActorRef
from rhumbatron.actors.shard_commands import RecordModelRouted
from rhumbatron.causal.rules import ActiveAgent
from rhumbatron.domain.facts import Caller

if TYPE_CHECKING:
    from rhumbatron.actors.directory import ActorDirectory
    from rhumbatron.protocol.envelopes import Event

__all__ = ["ShardWorld"]

_ACTIVE = ("assigned", "running")


@dataclass
class ShardWorld:
    """Answers :class:`~rhumbatron.causal.rules.RoutingWorld` from the shard files, and
    records ``model.routed`` (a :class:`~rhumbatron.causal.routing.ModelRouteLog`)."""

    actors: ActorDirectory
    max_active_agents_per_change: int = 8

    def _shards(self, project_id: str) -> Iterator[sqlite3.Connection]:
        for ref in self.actors.actor_refs():
            if ref.kind is ActorKind.RESOURCE_SHARD and ref.project_id == project_id:
                yield self.actors.actor(ref).connection

    def _change_shard(self, project_id: str, change_id: str) -> sqlite3.Connection | None:
        from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key

        ref: ActorRef = ResourceShard.ref_for(
            project_id, change_resource_key(change_id), self.actors.settings.resource_shard_count
        )
        if not ref.path(self.actors.settings.state_dir).exists():
            return None  # a Change nobody wrote yet: nothing is ready, nobody active
        return self.actors.actor(ref).connection

    def active_agents(self, project_id: str) -> list[ActiveAgent]:
        holders: list[tuple[str, str, str]] = []
        resources: dict[str, list[str]] = {}
        for db in self._shards(project_id):
            holders += [
                (row["agent_id"], row["change_id"], row["task_id"])
                for row in db.execute(
                    "SELECT agent_id, change_id, task_id FROM tasks "
                    "WHERE status IN (?, ?) AND agent_id IS NOT NULL ORDER BY task_id",
                    _ACTIVE,
                )
            ]
            for row in db.execute("SELECT agent_id, paths FROM intents"):
                resources.setdefault(row["agent_id"], []).extend(json.loads(row["paths"]))
            for row in db.execute("SELECT agent_id, resource FROM claims"):
                resources.setdefault(row["agent_id"], []).append(row["resource"])
        return [
            ActiveAgent(agent, change, task, tuple(resources.get(agent, ())))
            for agent, change, task in holders
        ]

    def has_ready_tasks(self, project_id: str, change_id: str) -> bool:
        db = self._change_shard(project_id, change_id)
        if db is None:
            return False
        row = db.execute(
            "SELECT 1 FROM tasks WHERE change_id = ? AND status = 'ready' LIMIT 1", (change_id,)
        ).fetchone()
        return row is not None

    def waits_at_agent_limit(self, project_id: str, change_id: str) -> bool:
        db = self._change_shard(project_id, change_id)
        if db is None:
            return False
        counts: dict[str, int] = {
            str(row[0]): int(row[1])
            for row in db.execute(
                "SELECT status, COUNT(*) FROM tasks WHERE change_id = ? GROUP BY status",
                (change_id,),
            )
        }
        active = sum(counts.get(status, 0) for status in _ACTIVE)
        # Asked after a task.completed / task.failed committed: its slot is already free, so
        # the Change was at the limit when the freed agent still counted.
        return counts.get("ready", 0) > 0 and active + 1 >= self.max_active_agents_per_change

    def record_model_routed(
        self, event: Event, agent: ActiveAgent, *, model: str, purpose: str
    ) -> None:
        """``model.routed`` in the shard of ``agent``'s Change, on behalf of its Task, keyed
        by ``event``'s ID: a redelivered Event records it once."""
        from rhumbatron.actors.resource_shard import change_resource_key

        shard = self.actors.resource_shard(event.project_id, change_resource_key(agent.change_id))
        caller = Caller(
            event.tenant_id, "system:causal-router", event.event_id, caused_by=event.event_id
        )
        shard.apply(
            caller,
            RecordModelRouted(
                change_id=agent.change_id,
                task_id=agent.task_id,
                model=model,
                purpose=purpose,
                key=event.event_id,
            ),
        )
