"""The verification and release workflows: their steps, and the engine that runs them.

Verification (one per Candidate; instance ID = Candidate ID): check the Candidate's fork,
then decide — ``candidate.verified`` with the Change ``verifying → awaiting_approval``, or
``candidate.rejected`` with the Change ``failed``. A Candidate that went stale meanwhile is
left alone (recompose composes a new one).

Release (one per promoted generation with a live app; instance ID = ``rel_<project>_<gen>``):
record ``release.started``, deploy the Candidate's fork to the app, then ``release.completed``
with the Change ``completed``.

Each step is idempotent on its own (the transitions are no-ops when repeated), so an engine
that runs a step again after a crash changes nothing twice. The workflow produces facts
through its steps' transitions; it never decides reactions (the router does).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rhumbatron.actors.shard_commands import DecideCandidate, FinishRelease, StartRelease
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import ChangeStatus
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.releases import ReleaseStatus
from rhumbatron.errors import DomainError
from rhumbatron.workflows.in_process import WorkflowDefinition

if TYPE_CHECKING:
    from rhumbatron.lifecycle.apps import AppDeployer
    from rhumbatron.lifecycle.forks import ForkStore
    from rhumbatron.lifecycle.world import LifecycleWorld

__all__ = ["LifecycleWorkflows", "check_files"]


def _text(input: Mapping[str, Any], name: str) -> str:
    """The workflow input's ``name``, which must be set: a missing or null value is never
    written into a fact as ``"None"``; the step fails, naming it."""
    value = input.get(name)
    if value is None or value == "":
        raise DomainError(
            f"the workflow input has no {name!r} (keys: {', '.join(sorted(input))}); the "
            "command that started it must name it"
        )
    return str(value)


def check_files(files: Mapping[str, str]) -> list[str]:
    """The local verification: every Python file parses, every JSON file parses, and no
    file is empty. Returns the problems (none: verified)."""
    problems: list[str] = []
    if not files:
        return ["the candidate has no files"]
    for path, content in sorted(files.items()):
        if not content.strip():
            problems.append(f"{path}: empty")
        elif path.endswith(".py"):
            try:
                ast.parse(content, filename=path)
            except SyntaxError as exc:
                problems.append(f"{path}:{exc.lineno}: {exc.msg}")
        elif path.endswith(".json"):
            try:
                json.loads(content)
            except ValueError as exc:
                problems.append(f"{path}: {exc}")
    return problems


@dataclass
class LifecycleWorkflows:
    """The two workflow definitions, bound to the actors they move."""

    world: LifecycleWorld
    forks: ForkStore
    deployer: AppDeployer

    def definitions(self) -> dict[str, WorkflowDefinition]:
        return {
            "verification": WorkflowDefinition(
                "verification", (("check", self._check), ("decide", self._decide))
            ),
            "release": WorkflowDefinition(
                "release",
                (("start", self._start), ("deploy", self._deploy), ("finish", self._finish)),
            ),
        }

    def _caller(self, input: Mapping[str, Any], workflow: str, instance_id: str) -> Caller:
        project_id = _text(input, "projectId")
        tenant = self.world.actors.project_tenant(project_id) or "platform"
        return Caller(tenant, f"workflow:{workflow}", instance_id)

    # -- verification ----------------------------------------------------------------------
    async def _check(self, input: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        files = self.forks.read(_text(input, "projectId"), _text(input, "candidate_id"))
        problems = ["the candidate's fork is missing"] if files is None else check_files(files)
        return {"problems": problems}

    async def _decide(self, input: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        project_id, candidate_id = _text(input, "projectId"), _text(input, "candidate_id")
        shard = self.world.change_shard(project_id, _text(input, "changeId"))
        candidate = shard.candidate(candidate_id)
        if candidate is None or candidate.status is not CandidateStatus.CREATED:
            status = candidate.status.value if candidate else "missing"
            return {"decision": f"left alone ({status})"}
        caller = self._caller(input, "verification", candidate_id)
        problems: list[str] = list(state.get("problems", []))
        if problems:
            shard.apply(
                caller,
                DecideCandidate(
                    candidate_id=candidate_id,
                    to=CandidateStatus.REJECTED,
                    reason="; ".join(problems)[:1000],
                    change_to=ChangeStatus.FAILED,
                ),
            )
            return {"decision": "rejected"}
        shard.apply(
            caller,
            DecideCandidate(
                candidate_id=candidate_id,
                to=CandidateStatus.VERIFIED,
                reason="every check passed",
                change_to=ChangeStatus.AWAITING_APPROVAL,
            ),
        )
        return {"decision": "verified"}

    # -- release ---------------------------------------------------------------------------
    async def _start(self, input: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        project_id, release_id = _text(input, "projectId"), _text(input, "release_id")
        start = StartRelease(  # every subject read before anything is written
            change_id=_text(input, "changeId"),
            generation=int(input["generation"]),
            candidate_id=_text(input, "candidate_id"),
            app_name=_text(input, "app_name"),
        )
        shard = self.world.change_shard(project_id, start.change_id)
        shard.apply(self._caller(input, "release", release_id), start)
        return {"releaseId": release_id}

    async def _deploy(self, input: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        project_id = _text(input, "projectId")
        files = self.forks.read(project_id, _text(input, "candidate_id"))
        if files is None:
            raise FileNotFoundError(
                f"the fork of candidate {input['candidate_id']} is gone; it cannot be released"
            )
        target = await self.deployer.deploy(
            project_id, _text(input, "app_name"), int(input["generation"]), files
        )
        return {"deployedTo": str(target), "files": len(files)}

    async def _finish(self, input: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        release_id = _text(input, "release_id")
        shard = self.world.change_shard(_text(input, "projectId"), _text(input, "changeId"))
        shard.apply(
            self._caller(input, "release", release_id),
            FinishRelease(
                release_id=release_id,
                outcome=ReleaseStatus.COMPLETED,
                reason=f"deployed {state.get('files', 0)} files",
            ),
        )
        return {"released": True}
