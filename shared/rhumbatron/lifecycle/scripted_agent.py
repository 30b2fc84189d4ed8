"""The scripted agent: a deterministic Agent that plays a Task's script from ``samplefiles/``.

A script is a list of steps, each one agent callback: ``declare_intent`` (paths),
``acquire_claim`` / ``release_claim`` (a resource), ``propose_changeset`` (files),
``complete`` or ``fail`` (a reason), and ``wait``. On the wake that admitted it (the Task is
``assigned``) the agent starts the Task and plays its script through :class:`AgentCallbacks`
— the same calls an external agent makes through the API — up to the first ``wait``; each
later wake for the Task it runs (a resource overlap, canonical advanced) plays the next part.
A wake with nothing left to play is noted and ignored. Progress through the parts is kept in
memory: the scripted agent is the local stand-in of an external agent, one process long.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rhumbatron.agents.registry import AgentKind, AgentRegistry
from rhumbatron.domain.tasks import TaskState, TaskStatus
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Command

if TYPE_CHECKING:
    from rhumbatron.lifecycle.requests import AgentCallbacks
    from rhumbatron.queues.wake_consumer import AgentRuntime

__all__ = ["AgentRuntimes", "ScriptLibrary", "ScriptedAgentRuntime", "WakeRecord"]

_STEPS = frozenset(
    {
        "declare_intent",
        "acquire_claim",
        "release_claim",
        "propose_changeset",
        "complete",
        "fail",
        "wait",
    }
)

#: The steps about the Agent's resources; the others are about its Task.
_RESOURCE_STEPS = ("declare_intent", "acquire_claim", "release_claim")


@dataclass(frozen=True, slots=True)
class ScriptLibrary:
    """Named scripts, from the ``scripts`` object of a sample file."""

    scripts: Mapping[str, Sequence[Mapping[str, Any]]]

    @classmethod
    def from_file(cls, path: Path) -> ScriptLibrary:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls.from_mapping(data.get("scripts", {}), source=str(path))

    @classmethod
    def from_mapping(
        cls, scripts: Mapping[str, Sequence[Mapping[str, Any]]], *, source: str = "scripts"
    ) -> ScriptLibrary:
        for name, steps in scripts.items():
            for number, step in enumerate(steps, start=1):
                if not isinstance(step, Mapping) or step.get("do") not in _STEPS:
                    found = (
                        f"does {step.get('do')!r}" if isinstance(step, Mapping) else f"is {step!r}"
                    )
                    raise DomainError(
                        f"{source}: script {name!r} step {number} {found}; a step is an "
                        f"object that does one of {', '.join(sorted(_STEPS))}"
                    )
        return cls(dict(scripts))

    def script(self, name: str) -> Sequence[Mapping[str, Any]]:
        try:
            return self.scripts[name]
        except KeyError:
            raise DomainError(
                f"no script {name!r}; the scripts are {', '.join(sorted(self.scripts)) or 'none'}"
            ) from None


@dataclass(frozen=True, slots=True)
class WakeRecord:
    agent_id: str
    task_id: str | None
    command_id: str
    played: bool


@dataclass
class ScriptedAgentRuntime:
    """Plays Task scripts (see the module docstring)."""

    callbacks: AgentCallbacks
    library: ScriptLibrary
    wakes: list[WakeRecord] = field(default_factory=list)
    _parts_played: dict[str, int] = field(default_factory=dict)
    _changesets: dict[str, str] = field(default_factory=dict)

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        from rhumbatron.queues.wake_consumer import is_reaction_wake

        if task is None or is_reaction_wake(command):
            # A reaction's wake tells the agent about a fact; a scripted agent plays Task
            # scripts only, so it notes the wake (an external agent acts on it).
            self.wakes.append(WakeRecord(agent_id, command.task_id, command.command_id, False))
            return
        admitted = task.status is TaskStatus.ASSIGNED and task.agent_id == agent_id
        running = task.status is TaskStatus.RUNNING and task.agent_id == agent_id
        if task.script is None and (admitted or running):
            raise DomainError(
                f"task {task.task_id!r} has no script; a scripted agent plays only scripted "
                "tasks (register an external agent as a webhook agent)"
            )
        parts = _parts(self.library.script(task.script)) if task.script else []
        # A running Task this process has no record of was started by a wake whose handling
        # failed (or by another process): play it from the start again — every callback is
        # idempotent on its natural key, so what was done already changes nothing.
        played = 0 if admitted else self._parts_played.get(task.task_id, 0)
        play = (admitted or running) and played < len(parts)
        self.wakes.append(WakeRecord(agent_id, task.task_id, command.command_id, play))
        if not play:
            return
        project_id, change_id = command.project_id, task.change_id
        tenant = self.callbacks.app.project_tenant(project_id) or "platform"
        if admitted:
            self.callbacks.start(
                tenant,
                project_id=project_id,
                change_id=change_id,
                task_id=task.task_id,
                agent_id=agent_id,
            )
        self._play(
            parts[played],
            tenant=tenant,
            project_id=project_id,
            change_id=change_id,
            task=task,
            agent_id=agent_id,
            changeset_id=self._changesets.get(task.task_id),
        )
        self._parts_played[task.task_id] = played + 1

    def _play(
        self,
        part: list[tuple[int, Mapping[str, Any]]],
        *,
        tenant: str,
        project_id: str,
        change_id: str,
        task: TaskState,
        agent_id: str,
        changeset_id: str | None,
    ) -> None:
        for number, step in part:
            if step["do"] in _RESOURCE_STEPS:
                self._play_resource_step(
                    number,
                    step,
                    tenant=tenant,
                    project_id=project_id,
                    change_id=change_id,
                    task=task,
                    agent_id=agent_id,
                )
            else:
                changeset_id = self._play_task_step(
                    number,
                    step,
                    tenant=tenant,
                    project_id=project_id,
                    change_id=change_id,
                    task=task,
                    agent_id=agent_id,
                    changeset_id=changeset_id,
                )

    def _play_resource_step(
        self,
        number: int,
        step: Mapping[str, Any],
        *,
        tenant: str,
        project_id: str,
        change_id: str,
        task: TaskState,
        agent_id: str,
    ) -> None:
        """An intent, or a claim taken or released."""
        cb = self.callbacks
        match step["do"]:
            case "declare_intent":
                cb.declare_intent(
                    tenant,
                    project_id=project_id,
                    change_id=change_id,
                    agent_id=agent_id,
                    intent_id=f"int_{task.task_id}_{number}",
                    paths=list(step["paths"]),
                    summary=str(step.get("summary", "")),
                )
            case "acquire_claim":
                cb.acquire_claim(
                    tenant,
                    project_id=project_id,
                    agent_id=agent_id,
                    resource=str(step["resource"]),
                )
            case "release_claim":
                cb.release_claim(
                    tenant,
                    project_id=project_id,
                    agent_id=agent_id,
                    resource=str(step["resource"]),
                )

    def _play_task_step(
        self,
        number: int,
        step: Mapping[str, Any],
        *,
        tenant: str,
        project_id: str,
        change_id: str,
        task: TaskState,
        agent_id: str,
        changeset_id: str | None,
    ) -> str | None:
        """A changeset proposed, or the Task completed or failed; returns the Task's
        changeset ID (a proposal's new one)."""
        cb = self.callbacks
        match step["do"]:
            case "propose_changeset":
                changeset_id = f"cs_{task.task_id}_{number}"
                self._changesets[task.task_id] = changeset_id
                cb.propose_changeset(
                    tenant,
                    project_id=project_id,
                    change_id=change_id,
                    task_id=task.task_id,
                    agent_id=agent_id,
                    changeset_id=changeset_id,
                    files={str(k): str(v) for k, v in step["files"].items()},
                )
            case "complete":
                cb.complete(
                    tenant,
                    project_id=project_id,
                    change_id=change_id,
                    task_id=task.task_id,
                    agent_id=agent_id,
                    changeset_id=changeset_id,
                )
            case "fail":
                cb.fail(
                    tenant,
                    project_id=project_id,
                    change_id=change_id,
                    task_id=task.task_id,
                    agent_id=agent_id,
                    reason=str(step.get("reason", "the script failed the task")),
                )
        return changeset_id


def _parts(
    steps: Sequence[Mapping[str, Any]],
) -> list[list[tuple[int, Mapping[str, Any]]]]:
    """The script cut at each ``wait``: one part per wake, steps numbered from 1."""
    parts: list[list[tuple[int, Mapping[str, Any]]]] = [[]]
    for number, step in enumerate(steps, start=1):
        if step["do"] == "wait":
            parts.append([])
        else:
            parts[-1].append((number, step))
    return parts


@dataclass
class AgentRuntimes:
    """The wake consumer's :class:`AgentRuntime`: a webhook agent registered by the tenant of
    the command's project gets a signed HTTP wake; every other agent is played by the
    scripted runtime. Another tenant's agent of the same ID is never looked at."""

    registry: AgentRegistry
    scripted: AgentRuntime
    webhook: AgentRuntime
    #: The tenant owning a project (the composition root's ``project_tenant``).
    tenant_of: Callable[[str], str | None]

    async def wake(self, agent_id: str, task: TaskState | None, command: Command) -> None:
        tenant = self.tenant_of(command.project_id)
        record = None if tenant is None else self.registry.get(tenant, agent_id)
        runtime = (
            self.webhook
            if record is not None and record.kind is AgentKind.WEBHOOK
            else self.scripted
        )
        await runtime.wake(agent_id, task, command)
