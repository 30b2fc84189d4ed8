"""Workflows: verification and release, started once per idempotency key.

:mod:`~rhumbatron.workflows.engine` is the port (``WorkflowEngine``, ``workflow_start_for``,
``check_instance_id``); :mod:`~rhumbatron.workflows.in_process` runs workflows locally with
their progress in SQLite; :mod:`~rhumbatron.workflows.step_functions` runs them on AWS Step
Functions (execution name = instance ID). boto3 is imported only by the last one, which is
therefore not imported here: a local run never pays for it.
"""

from __future__ import annotations

from rhumbatron.errors import WorkflowEngineError
from rhumbatron.workflows.engine import (
    INSTANCE_ID_PATTERN,
    WORKFLOW_COMMANDS,
    OperableWorkflowEngine,
    WorkflowControl,
    WorkflowEngine,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowOperations,
    WorkflowStart,
    WorkflowStatus,
    WorkflowStepRecord,
    check_instance_id,
    workflow_start_for,
)
from rhumbatron.workflows.in_process import (
    InProcessEngine,
    StepFunction,
    WorkflowDefinition,
    WorkflowStep,
)

__all__ = [
    "INSTANCE_ID_PATTERN",
    "WORKFLOW_COMMANDS",
    "InProcessEngine",
    "OperableWorkflowEngine",
    "StepFunction",
    "WorkflowControl",
    "WorkflowDefinition",
    "WorkflowEngine",
    "WorkflowEngineError",
    "WorkflowHistory",
    "WorkflowInstance",
    "WorkflowOperations",
    "WorkflowStart",
    "WorkflowStatus",
    "WorkflowStep",
    "WorkflowStepRecord",
    "check_instance_id",
    "workflow_start_for",
]
