"""The workflow operations' bodies: frozen pydantic models, camelCase on the wire, like
:mod:`rhumbatron.api.schemas`."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rhumbatron.workflows.engine import (
    WorkflowControl,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowStatus,
)

__all__ = [
    "StopRequest",
    "WorkflowBody",
    "WorkflowControlBody",
    "WorkflowHistoryBody",
    "WorkflowListBody",
    "WorkflowName",
    "WorkflowStepBody",
]

#: The workflows the engine runs: a Candidate's verification and a generation's release.
WorkflowName = Literal["verification", "release"]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class WorkflowBody(_Wire):
    """One instance: a Candidate's verification (instance ID = Candidate ID) or a release
    (instance ID = release ID, ``rel_<project>_<generation>``)."""

    workflow: WorkflowName
    instance_id: str
    project_id: str | None = Field(description="The project it works for (from its input).")
    change_id: str | None = Field(description="The Change it works for (from its input).")
    status: WorkflowStatus
    error: str | None = Field(description="Why it failed or was stopped.")
    output: dict[str, object] | None = Field(description="What it returned, once succeeded.")

    @classmethod
    def of(cls, instance: WorkflowInstance) -> "WorkflowBody":
        return cls(
            workflow=instance.workflow,
            instance_id=instance.instance_id,
            project_id=instance.project_id,
            change_id=instance.change_id,
            status=instance.status,
            error=instance.error,
            output=instance.output,
        )


class WorkflowListBody(_Wire):
    """Instances of one workflow, newest first."""

    items: list[WorkflowBody]


class WorkflowStepBody(_Wire):
    """One step: succeeded, failed, running (the step a running instance waits on) or
    not_started; how many times it ran, when it last finished or failed, its last error."""

    name: str
    status: Literal["succeeded", "failed", "running", "not_started"]
    attempts: int = Field(ge=0)
    at: str | None
    error: str | None


class WorkflowHistoryBody(_Wire):
    """An instance with its steps, the step it waits on and when that step is retried next
    (null: the engine retries nothing by itself, or does not say)."""

    instance: WorkflowBody
    steps: list[WorkflowStepBody]
    pending_step: str | None
    next_retry_at: str | None

    @classmethod
    def of(cls, history: WorkflowHistory) -> "WorkflowHistoryBody":
        return cls(
            instance=WorkflowBody.of(history.instance),
            steps=[
                WorkflowStepBody(
                    name=step.name,
                    status=step.status,
                    attempts=step.attempts,
                    at=step.at,
                    error=step.error,
                )
                for step in history.steps
            ],
            pending_step=history.pending_step,
            next_retry_at=history.next_retry_at,
        )


class StopRequest(_Wire):
    """Why an operator stops the instance: kept as its error."""

    reason: str = Field(min_length=1, max_length=1_000)


class WorkflowControlBody(_Wire):
    """What a cancel, terminate or redrive did: ``done`` is false when the instance was
    already past it (nothing changed), and ``detail`` says why."""

    workflow: WorkflowName
    instance_id: str
    action: Literal["cancel", "terminate", "redrive"]
    done: bool
    status: WorkflowStatus
    detail: str

    @classmethod
    def of(cls, control: WorkflowControl) -> "WorkflowControlBody":
        return cls(
            workflow=control.workflow,
            instance_id=control.instance_id,
            action=control.action,
            done=control.done,
            status=control.status,
            detail=control.detail,
        )
