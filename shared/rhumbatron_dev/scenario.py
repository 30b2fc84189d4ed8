"""Run a scenario file (``samplefiles/scenario.json``) of real state changes through the actors.

Each step is one actor transaction; its facts land in that actor's outbox. The demo runs the
sample scenario; tests and benchmarks reuse it to drive the write path as a user would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from rhumbatron.actors.actor import TransactResult
from rhumbatron.actors.resource_shard import change_resource_key
from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    AppendChangeEvents,
    DeclareIntent,
    ReleaseClaim,
)
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import ConfigurationError
from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["iter_scenario", "load_scenario", "run_scenario"]

_CLAIM_TTL = timedelta(minutes=30)


def load_scenario(path: Path) -> dict[str, Any]:
    try:
        scenario = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"cannot read scenario {path}: {exc}") from exc
    for key in ("tenant", "projects", "steps"):
        if key not in scenario:
            raise ConfigurationError(f"scenario {path} has no {key!r}")
    return dict(scenario)


def iter_scenario(app: Rhumbatron, scenario: dict[str, Any]) -> Iterator[TransactResult]:
    """Apply every step to every project, one transaction at a time.

    Change IDs in a scenario are local to a project; the runner scopes them as
    ``<project>-<change>``, because a Change ID is global: its stable Event IDs do not
    include the project.
    """
    for project in scenario["projects"]:
        for step in scenario["steps"]:
            scoped = dict(step)
            if "change" in scoped:
                scoped["change"] = f"{project['id']}-{scoped['change']}"
            yield _run_step(app, scenario["tenant"], project, scoped)


def run_scenario(app: Rhumbatron, scenario: dict[str, Any]) -> list[TransactResult]:
    """Apply the whole scenario; return each transaction's result."""
    return list(iter_scenario(app, scenario))


def _run_step(
    app: Rhumbatron, tenant: str, project: dict[str, str], step: dict[str, Any]
) -> TransactResult:
    pid = project["id"]
    system = Caller(tenant, "system:demo", correlation_id=f"demo-{pid}")
    action = step["do"]
    if action == "create_project":
        return app.project_root(pid).create_project(system, name=project["name"])
    if action == "create_change":
        change = step["change"]
        facts = (
            ChangeFact(
                "change.created",
                {
                    "title": step["title"],
                    "clientRequestId": step["clientRequestId"],
                    "requestedBy": "user:demo",
                },
            ),
            ChangeFact("change.planned", {"taskIds": step["tasks"]}),
            *(ChangeFact("task.ready", {}, task_id=task) for task in step["tasks"]),
        )
        shard = app.resource_shard(pid, change_resource_key(change))
        return shard.apply(
            system, AppendChangeEvents(change_id=change, status="planned", facts=facts)
        )
    agent_caller = Caller(tenant, f"agent:{step.get('agent', 'none')}", f"demo-{pid}")
    if action == "declare_intent":
        paths = tuple(step["paths"])
        return app.resource_shard(pid, paths[0]).apply(
            agent_caller,
            DeclareIntent(
                intent_id=step["intent"],
                agent_id=step["agent"],
                paths=paths,
                change_id=step["change"],
            ),
        )
    if action == "acquire_claim":
        return app.resource_shard(pid, step["resource"]).apply(
            agent_caller,
            AcquireClaim(resource=step["resource"], agent_id=step["agent"], ttl=_CLAIM_TTL),
        )
    if action == "release_claim":
        return app.resource_shard(pid, step["resource"]).apply(
            agent_caller, ReleaseClaim(resource=step["resource"], agent_id=step["agent"])
        )
    if action == "complete_task":
        change = step["change"]
        fact = ChangeFact("task.completed", {"agentId": step["agent"]}, task_id=step["task"])
        return app.resource_shard(pid, change_resource_key(change)).apply(
            agent_caller, AppendChangeEvents(change_id=change, status="in_progress", facts=(fact,))
        )
    if action == "promote":
        return app.project_root(pid).promote(
            system,
            candidate_id=step["candidate"],
            artifact_id=step["artifact"],
            expected_generation=step["expectedGeneration"],
            change_ids=(step["change"],),
        )
    raise ConfigurationError(f"unknown scenario step {action!r} in project {pid}")
