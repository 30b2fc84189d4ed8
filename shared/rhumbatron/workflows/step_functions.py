"""The cloud workflow engine: AWS Step Functions, execution name = instance ID.

Step Functions keeps an execution name for 90 days after the execution closes and answers a
second ``StartExecution`` with that name by ``ExecutionAlreadyExists`` — except when the
first one is still RUNNING with the same input: then it succeeds and returns the first
execution again (Standard workflows' idempotent start). Both are repeats to us, but the
second looks like a fresh start, so :meth:`StepFunctionsEngine.start` first asks whether the
execution exists. Two starts racing past that check with the same input both answer
``started=True``; Step Functions still runs the one execution.

boto3 is synchronous: every call runs in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from rhumbatron.errors import ConfigurationError, WorkflowEngineError
from rhumbatron.workflows.engine import (
    WorkflowControl,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowStart,
    WorkflowStatus,
    WorkflowStepRecord,
    check_instance_id,
    ledger_ids,
)

__all__ = [
    "CANCELLED_ERROR",
    "STATUS_OF_EXECUTION",
    "TERMINATED_ERROR",
    "StepFunctionsEngine",
    "execution_arn",
    "steps_of_history",
]

#: Step Functions execution status → ours. A timed-out or aborted execution failed.
STATUS_OF_EXECUTION: Mapping[str, WorkflowStatus] = {
    "RUNNING": WorkflowStatus.running,
    "PENDING_REDRIVE": WorkflowStatus.running,
    "SUCCEEDED": WorkflowStatus.succeeded,
    "FAILED": WorkflowStatus.failed,
    "TIMED_OUT": WorkflowStatus.failed,
    "ABORTED": WorkflowStatus.failed,
}

# The setting that names each workflow's state machine, for the error when it is missing.
_ARN_SETTING = {
    "verification": "verification_state_machine_arn",
    "release": "release_state_machine_arn",
}


#: The errors our StopExecution calls record: a cancelled execution is told from one
#: terminated (or aborted by anyone else), which stays a failure that may be redriven.
CANCELLED_ERROR = "rhumbatron.cancelled"
TERMINATED_ERROR = "rhumbatron.terminated"

#: Our status → the Step Functions status a listing filters on (then each is described).
_LISTED_AS: Mapping[WorkflowStatus, str] = {
    WorkflowStatus.running: "RUNNING",
    WorkflowStatus.succeeded: "SUCCEEDED",
    WorkflowStatus.failed: "FAILED",
    WorkflowStatus.cancelled: "ABORTED",
}

# History event types that schedule a task (each one an attempt of its state).
_SCHEDULED = ("TaskScheduled", "LambdaFunctionScheduled", "ActivityScheduled")


def steps_of_history(
    events: Sequence[Mapping[str, Any]], status: WorkflowStatus
) -> list[WorkflowStepRecord]:
    """Step Functions' event history as our steps: a state per ``…StateEntered`` event, in
    order; ``succeeded`` once exited, ``failed`` when the execution ended in it with an
    error, ``running`` while a running execution is in it. A ``…Failed`` event's error and
    cause are its state's last error."""
    steps: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for event in events:
        kind = str(event.get("type", ""))
        at = event.get("timestamp")
        when = None if at is None else (at.isoformat() if isinstance(at, datetime) else str(at))
        if kind.endswith("StateEntered"):
            current = str(event.get("stateEnteredEventDetails", {}).get("name", ""))
            step = steps.setdefault(
                current, {"status": "running", "tasks": 0, "entered": 0, "at": None, "error": None}
            )
            step["entered"] += 1
            step["status"] = "running"
        elif kind.endswith("StateExited"):
            name = str(event.get("stateExitedEventDetails", {}).get("name", current or ""))
            if name in steps:
                steps[name].update(status="succeeded", at=when)
            current = None
        elif kind in _SCHEDULED and current in steps:
            steps[current]["tasks"] += 1
        elif kind.endswith("Failed") or kind.endswith("TimedOut") or kind.endswith("Aborted"):
            details: Mapping[str, Any] = next(
                (v for k, v in event.items() if k.endswith("EventDetails")), {}
            )
            error = details.get("error") or kind
            cause = details.get("cause")
            if current in steps:
                steps[current]["error"] = f"{error}: {cause}" if cause else str(error)
                steps[current]["at"] = when
                if kind.startswith("Execution"):
                    steps[current]["status"] = "failed"
    records = []
    for name, step in steps.items():
        state = step["status"]
        if state == "running" and status is not WorkflowStatus.running:
            state = (
                "failed" if status in (WorkflowStatus.failed, WorkflowStatus.cancelled) else state
            )
        records.append(
            WorkflowStepRecord(
                name=name,
                status=state,
                attempts=step["tasks"] or step["entered"],
                at=step["at"],
                error=step["error"],
            )
        )
    return records


def execution_arn(state_machine_arn: str, instance_id: str) -> str:
    """The ARN of the execution named ``instance_id`` of a Standard state machine."""
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{instance_id}"


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class StepFunctionsEngine:
    """The :class:`~rhumbatron.workflows.engine.WorkflowEngine` on AWS Step Functions.

    ``client`` is a boto3 ``stepfunctions`` client; ``state_machine_arns`` maps a workflow
    name to its state machine (an empty or missing value is a configuration error, raised
    when that workflow is first used so the other one still works).
    """

    def __init__(self, client: Any, state_machine_arns: Mapping[str, str | None]) -> None:
        self._client = client
        self._arns = dict(state_machine_arns)

    async def start(
        self, workflow: str, instance_id: str, input: Mapping[str, Any]
    ) -> WorkflowStart:
        """Start an execution named ``instance_id``; an existing one is a repeat."""
        arn = self._state_machine(workflow)
        check_instance_id(instance_id)
        try:
            body = json.dumps(dict(input), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise WorkflowEngineError(
                f"input of workflow {workflow!r} instance {instance_id!r} is not JSON ({exc}); "
                "pass only JSON values"
            ) from None
        repeat = WorkflowStart(workflow=workflow, instance_id=instance_id, started=False)
        if await self._describe_raw(workflow, arn, instance_id) is not None:
            return repeat
        try:
            await asyncio.to_thread(
                self._client.start_execution, stateMachineArn=arn, name=instance_id, input=body
            )
        except ClientError as exc:
            if _error_code(exc) == "ExecutionAlreadyExists":
                return repeat
            raise self._engine_error("start", workflow, instance_id, exc) from exc
        except BotoCoreError as exc:
            raise self._engine_error("start", workflow, instance_id, exc) from exc
        return WorkflowStart(workflow=workflow, instance_id=instance_id, started=True)

    async def describe(self, workflow: str, instance_id: str) -> WorkflowInstance | None:
        """The execution named ``instance_id``, or None if there is none."""
        arn = self._state_machine(workflow)
        check_instance_id(instance_id)
        answer = await self._describe_raw(workflow, arn, instance_id)
        if answer is None:
            return None
        raw_status = str(answer.get("status", ""))
        status = STATUS_OF_EXECUTION.get(raw_status)
        if raw_status == "ABORTED" and answer.get("error") == CANCELLED_ERROR:
            status = WorkflowStatus.cancelled
        if status is None:
            raise WorkflowEngineError(
                f"execution {instance_id!r} of workflow {workflow!r} has status {raw_status!r}, "
                f"which is none of {', '.join(STATUS_OF_EXECUTION)}; update STATUS_OF_EXECUTION"
            )
        output = answer.get("output")
        error = answer.get("error")
        cause = answer.get("cause")
        if status is WorkflowStatus.failed and error is None:
            error = raw_status  # a timed-out or aborted execution carries no error code
        try:
            project_id, change_id = ledger_ids(json.loads(answer.get("input") or "{}"))
        except (TypeError, ValueError):
            project_id, change_id = None, None
        return WorkflowInstance(
            workflow=workflow,
            instance_id=instance_id,
            status=status,
            output=json.loads(output) if status is WorkflowStatus.succeeded and output else None,
            error=None if error is None else (f"{error}: {cause}" if cause else str(error)),
            project_id=project_id,
            change_id=change_id,
        )

    # -- an operator's view and control (WorkflowOperations) ----------------------------

    async def list_instances(
        self,
        workflow: str,
        *,
        status: WorkflowStatus | None = None,
        change_id: str | None = None,
        limit: int = 100,
    ) -> list[WorkflowInstance]:
        """The newest executions first, at most ``limit``, each described (its error,
        output and the Change its input names); with ``status`` or ``change_id``, those that
        match."""
        arn = self._state_machine(workflow)
        try:
            answer = await asyncio.to_thread(
                self._client.list_executions,
                stateMachineArn=arn,
                maxResults=limit if status is None and change_id is None else 1000,
                **({} if status is None else {"statusFilter": _LISTED_AS[status]}),
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._engine_error("list", workflow, "*", exc) from exc
        found: list[WorkflowInstance] = []
        for execution in answer.get("executions", []):
            instance = await self.describe(workflow, str(execution["name"]))
            if (
                instance is not None
                and (status is None or instance.status is status)
                and (change_id is None or instance.change_id == change_id)
            ):
                found.append(instance)
            if len(found) == limit:
                break
        return found

    async def history(self, workflow: str, instance_id: str) -> WorkflowHistory | None:
        """The execution's states in the order they were entered, from its event history:
        each state's attempts (its task schedules, retries included; one for a state with
        no task), its last error, and the state a running execution is in. Step Functions
        does not say when a retry is due (``next_retry_at`` is None)."""
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        arn = execution_arn(self._state_machine(workflow), instance_id)
        try:
            answer = await asyncio.to_thread(
                self._client.get_execution_history, executionArn=arn, maxResults=1000
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._engine_error("read the history of", workflow, instance_id, exc) from exc
        steps = steps_of_history(answer.get("events", []), instance.status)
        pending = next((step.name for step in steps if step.status == "running"), None)
        return WorkflowHistory(instance, tuple(steps), pending, next_retry_at=None)

    async def cancel(self, workflow: str, instance_id: str, reason: str) -> WorkflowControl | None:
        """Stop a running execution for good (``StopExecution`` with the error
        ``rhumbatron.cancelled``: described as ``cancelled``, never redriven by us)."""
        return await self._stop(workflow, instance_id, "cancel", CANCELLED_ERROR, reason)

    async def terminate(
        self, workflow: str, instance_id: str, reason: str
    ) -> WorkflowControl | None:
        """Stop a running execution as a failure (``StopExecution`` with the error
        ``rhumbatron.terminated``: ABORTED, which Step Functions can redrive)."""
        return await self._stop(workflow, instance_id, "terminate", TERMINATED_ERROR, reason)

    async def redrive(self, workflow: str, instance_id: str) -> WorkflowControl | None:
        """``RedriveExecution``: Step Functions runs a failed, timed-out or aborted Standard
        execution again from its failed state, within 14 days of its end. Where it refuses
        (``ExecutionNotRedrivable``, ``ExecutionLimitExceeded``), the answer says so."""
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        if instance.status is not WorkflowStatus.failed:
            return WorkflowControl.past(instance, "redrive")
        arn = execution_arn(self._state_machine(workflow), instance_id)
        try:
            await asyncio.to_thread(self._client.redrive_execution, executionArn=arn)
        except ClientError as exc:
            if _error_code(exc) in ("ExecutionNotRedrivable", "ExecutionLimitExceeded"):
                detail = f"Step Functions does not redrive it: {exc}"
                return WorkflowControl(
                    workflow, instance_id, "redrive", False, instance.status, detail
                )
            raise self._engine_error("redrive", workflow, instance_id, exc) from exc
        except BotoCoreError as exc:
            raise self._engine_error("redrive", workflow, instance_id, exc) from exc
        detail = "Step Functions runs it again from its failed state"
        return WorkflowControl(
            workflow, instance_id, "redrive", True, WorkflowStatus.running, detail
        )

    async def _stop(
        self, workflow: str, instance_id: str, action: str, error: str, reason: str
    ) -> WorkflowControl | None:
        instance = await self.describe(workflow, instance_id)
        if instance is None:
            return None
        if instance.status is not WorkflowStatus.running:
            return WorkflowControl.past(instance, action)
        arn = execution_arn(self._state_machine(workflow), instance_id)
        try:
            await asyncio.to_thread(
                self._client.stop_execution, executionArn=arn, error=error, cause=reason[:32_768]
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._engine_error(f"{action}", workflow, instance_id, exc) from exc
        to = WorkflowStatus.cancelled if error == CANCELLED_ERROR else WorkflowStatus.failed
        return WorkflowControl(workflow, instance_id, action, True, to, f"{error}: {reason}")

    async def _describe_raw(
        self, workflow: str, arn: str, instance_id: str
    ) -> Mapping[str, Any] | None:
        try:
            answer: Mapping[str, Any] = await asyncio.to_thread(
                self._client.describe_execution, executionArn=execution_arn(arn, instance_id)
            )
        except ClientError as exc:
            if _error_code(exc) == "ExecutionDoesNotExist":
                return None
            raise self._engine_error("describe", workflow, instance_id, exc) from exc
        except BotoCoreError as exc:
            raise self._engine_error("describe", workflow, instance_id, exc) from exc
        return answer

    def _state_machine(self, workflow: str) -> str:
        arn = self._arns.get(workflow)
        if not arn:
            setting = _ARN_SETTING.get(workflow)
            if setting is not None:
                what = f"set {setting} (RHUMBATRON_{setting.upper()}) to its ARN"
            else:
                configured = sorted(name for name, value in self._arns.items() if value)
                what = f"configured workflows: {', '.join(configured) or 'none'}"
            raise ConfigurationError(f"workflow {workflow!r} has no state machine ARN; {what}")
        return arn

    @staticmethod
    def _engine_error(
        doing: str, workflow: str, instance_id: str, exc: Exception
    ) -> WorkflowEngineError:
        return WorkflowEngineError(
            f"Step Functions could not {doing} workflow {workflow!r} instance {instance_id!r}: "
            f"{exc}; check the state machine ARN and the role's permissions, or retry if Step "
            "Functions was throttled or unavailable"
        )
