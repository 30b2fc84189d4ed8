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
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from rhumbatron.errors import ConfigurationError, WorkflowEngineError
from rhumbatron.workflows.engine import (
    WorkflowInstance,
    WorkflowStart,
    WorkflowStatus,
    check_instance_id,
)

__all__ = ["STATUS_OF_EXECUTION", "StepFunctionsEngine", "execution_arn"]

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
        return WorkflowInstance(
            workflow=workflow,
            instance_id=instance_id,
            status=status,
            output=json.loads(output) if status is WorkflowStatus.succeeded and output else None,
            error=None if error is None else (f"{error}: {cause}" if cause else str(error)),
        )

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
