"""The workflow engine port: start a Workflow instance once per idempotency key.

Two commands start Workflows (rulebook "Queues"): ``verification.start`` (one per Candidate,
instance ID = Candidate ID) and ``release.start`` (one per promoted generation with a live app,
instance ID = release ID ``rel_<project>_<generation>``). The consumer uses that key as the
instance ID, so a redelivered command finds the existing instance: the engine answers a second
start of the same ID with ``started=False`` and runs nothing again ("Idempotency and dedupe").

Two adapters share this port: AWS Step Functions in the cloud (execution name = instance ID)
and an in-process engine locally, with the same idempotency and the same ID rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from rhumbatron.core.tracing import Span, current_span, span
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Command

__all__ = [
    "INSTANCE_ID_PATTERN",
    "WORKFLOW_COMMANDS",
    "OperableWorkflowEngine",
    "WorkflowControl",
    "WorkflowEngine",
    "WorkflowHistory",
    "WorkflowInstance",
    "WorkflowOperations",
    "WorkflowStart",
    "WorkflowStatus",
    "WorkflowStepRecord",
    "check_instance_id",
    "ledger_ids",
    "step_span",
    "workflow_start_for",
]

#: Step Functions execution names: 1..80 characters of letters, digits, ``_`` and ``-``. The
#: in-process engine enforces it too, so an ID that works locally cannot fail in the cloud.
INSTANCE_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,80}$")

#: Command type → the Workflow it starts. Read-only.
WORKFLOW_COMMANDS: Mapping[str, str] = MappingProxyType(
    {"verification.start": "verification", "release.start": "release"}
)

# The payload field of each starting command that carries the idempotency key.
_INSTANCE_ID_FIELD: Mapping[str, str] = MappingProxyType(
    {"verification.start": "candidate_id", "release.start": "release_id"}
)


@dataclass(frozen=True)
class WorkflowStart:
    """The answer to a start: ``started`` is False when the instance already existed."""

    workflow: str
    instance_id: str
    started: bool


class WorkflowStatus(StrEnum):
    """Where an instance is: still running, or finished one way or the other. A
    ``cancelled`` instance was stopped by an operator for good; a ``failed`` one (a step
    failed, or an operator terminated it) may be redriven from its failed step."""

    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


@dataclass(frozen=True)
class WorkflowInstance:
    """One instance as the engine sees it; ``output`` only once it succeeded. The project
    and Change it works for come from its input (every start carries them, see
    ``workflow_input``), so an operator finds a Change's instances in ledger terms."""

    workflow: str
    instance_id: str
    status: WorkflowStatus
    output: dict[str, Any] | None
    error: str | None
    project_id: str | None = None
    change_id: str | None = None


def ledger_ids(input: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(projectId, changeId)`` of a start's input, each None where it is not a string."""
    values = input or {}
    project, change = values.get("projectId"), values.get("changeId")
    return (
        project if isinstance(project, str) else None,
        change if isinstance(change, str) else None,
    )


@dataclass(frozen=True)
class WorkflowStepRecord:
    """One step of an instance: ``succeeded``, ``failed``, ``running`` (the pending step of
    a running instance) or ``not_started``; how many times it ran, when it last finished or
    failed, and its last error."""

    name: str
    status: str
    attempts: int
    at: str | None
    error: str | None


@dataclass(frozen=True)
class WorkflowHistory:
    """An instance with its steps in order, the step it waits on, and when that step is
    retried next (``None``: the engine retries nothing by itself)."""

    instance: WorkflowInstance
    steps: tuple[WorkflowStepRecord, ...]
    pending_step: str | None
    next_retry_at: str | None


@dataclass(frozen=True)
class WorkflowControl:
    """What a control action (cancel, terminate, redrive) did: ``done`` is False when the
    instance was already past it (then nothing changed), and ``detail`` says why."""

    workflow: str
    instance_id: str
    action: str
    done: bool
    status: WorkflowStatus
    detail: str

    @classmethod
    def past(cls, instance: WorkflowInstance, action: str) -> WorkflowControl:
        """The answer to ``action`` (cancel, terminate, redrive) on an instance already past
        the state it applies to: nothing changed, and the detail says why."""
        wanted, acted = ("failed", "redriven") if action == "redrive" else ("running", "stopped")
        return cls(
            instance.workflow,
            instance.instance_id,
            action,
            False,
            instance.status,
            f"only a {wanted} instance is {acted}; this one is {instance.status}",
        )


class WorkflowEngine(Protocol):
    """Starts and describes Workflow instances; one instance per ID, ever."""

    async def start(
        self, workflow: str, instance_id: str, input: Mapping[str, Any]
    ) -> WorkflowStart:
        """Start ``workflow`` as ``instance_id`` unless that instance exists (then a repeat)."""
        ...

    async def describe(self, workflow: str, instance_id: str) -> WorkflowInstance | None:
        """The instance of ``workflow`` with this ID, or None if it was never started."""
        ...


class WorkflowOperations(Protocol):
    """An operator's view and control of the instances (docs/operations.md, "Workflows").

    Each control action is idempotent: it acts on an instance in the state it applies to
    and answers ``done=False`` for one already past it, so a retried call changes nothing.
    """

    async def list_instances(
        self,
        workflow: str,
        *,
        status: WorkflowStatus | None = None,
        change_id: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowInstance]:
        """The newest instances of ``workflow`` first (of one Change's, with ``change_id``),
        at most ``limit``."""
        ...

    async def history(self, workflow: str, instance_id: str) -> WorkflowHistory | None:
        """The instance's steps with their attempts and failures, or None if none."""
        ...

    async def cancel(self, workflow: str, instance_id: str, reason: str) -> WorkflowControl | None:
        """Stop a running instance for good before its next step (``cancelled``)."""
        ...

    async def terminate(
        self, workflow: str, instance_id: str, reason: str
    ) -> WorkflowControl | None:
        """Stop a running instance now, as a failure (``failed``), which may be redriven."""
        ...

    async def redrive(self, workflow: str, instance_id: str) -> WorkflowControl | None:
        """Run a failed instance again from its failed step (its finished steps stand)."""
        ...


def check_instance_id(instance_id: str) -> str:
    """Return ``instance_id`` if Step Functions accepts it as an execution name; else raise.

    Raises :class:`DomainError` naming the value: 1 to 80 characters of ``[A-Za-z0-9_-]``.
    """
    if not isinstance(instance_id, str) or INSTANCE_ID_PATTERN.fullmatch(instance_id) is None:
        raise DomainError(
            f"workflow instance ID {instance_id!r} is not a valid execution name: use 1 to 80 "
            "characters of letters, digits, '_' and '-'"
        )
    return instance_id


def workflow_start_for(command: Command) -> tuple[str, str]:
    """``workflowStartFor``: the ``(workflow, instance_id)`` a starting command maps to.

    ``verification.start`` → ``("verification", candidate_id)``; ``release.start`` →
    ``("release", release_id)``. Any other type raises :class:`DomainError`.
    """
    workflow = WORKFLOW_COMMANDS.get(command.command_type)
    if workflow is None:
        raise DomainError(
            f"command {command.command_id} of type {command.command_type!r} starts no "
            f"workflow; only {' and '.join(WORKFLOW_COMMANDS)} do"
        )
    payload = command.payload.model_dump()
    instance_id = payload[_INSTANCE_ID_FIELD[command.command_type]]
    return workflow, check_instance_id(str(instance_id))


class OperableWorkflowEngine(WorkflowEngine, WorkflowOperations, Protocol):
    """An engine an operator can read and steer: both adapters are one."""


def step_span(workflow: str, step: str, input: Mapping[str, Any]) -> AbstractContextManager[Span]:
    """The span of one step: in the trace of the Change its input names (``projectId``,
    ``changeId``), child of the span that started or resumed the instance, if any.

    The input carries no ``traceparent`` on purpose: Step Functions answers a repeated start
    under the same execution name with a *different* input as an error, and a header would
    differ on every delivery of the starting command. The Change's trace ID is computed
    from the input instead."""
    change_id, project_id = input.get("changeId"), input.get("projectId")
    parent = current_span()
    return span(
        f"workflow {workflow} {step}",
        parent=None if parent is None else parent.context,
        project_id=project_id if isinstance(project_id, str) else None,
        change_id=change_id if isinstance(change_id, str) else None,
    )
