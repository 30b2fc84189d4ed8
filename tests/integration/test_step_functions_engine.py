"""The Step Functions adapter of the workflow engine, through boto3 against moto (rulebook
"Idempotency and dedupe": S0-224, execution name = instance ID)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from rhumbatron.errors import ConfigurationError, WorkflowEngineError
from rhumbatron.workflows import WorkflowStart, WorkflowStatus
from rhumbatron.workflows.step_functions import (
    StepFunctionsEngine,
    execution_arn,
    steps_of_history,
)

CANDIDATE = "cand_0123abcd"
NOW = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
ROLE_ARN = "arn:aws:iam::123456789012:role/rhumbatron-workflows"
PASS_DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 stepfunctions client on moto, with fake credentials."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        yield boto3.client("stepfunctions", region_name="us-east-1")


@pytest.fixture
def state_machine(client: Any) -> str:
    answer = client.create_state_machine(
        name=f"verification-{uuid.uuid4().hex[:12]}", definition=PASS_DEFINITION, roleArn=ROLE_ARN
    )
    return str(answer["stateMachineArn"])


@pytest.fixture
def engine(client: Any, state_machine: str) -> StepFunctionsEngine:
    return StepFunctionsEngine(client, {"verification": state_machine, "release": ""})


async def test_a_second_start_of_one_execution_name_is_a_repeat(
    engine: StepFunctionsEngine, client: Any, state_machine: str
) -> None:
    # GIVEN/WHEN the same Candidate's verification is started twice
    first = await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    second = await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    # THEN the first started an execution named after the Candidate, the second found it,
    # and there is one execution
    assert first == WorkflowStart("verification", CANDIDATE, started=True)
    assert second == WorkflowStart("verification", CANDIDATE, started=False)
    executions = client.list_executions(stateMachineArn=state_machine)["executions"]
    assert [execution["name"] for execution in executions] == [CANDIDATE]


async def test_a_repeat_with_another_input_is_a_repeat_too(engine: StepFunctionsEngine) -> None:
    # GIVEN a started execution
    await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    # WHEN a start of the same name carries another input
    again = await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE, "n": 2})
    # THEN it is a repeat, not a second execution
    assert again.started is False


def test_step_functions_answers_a_same_input_repeat_while_running_with_the_first_execution(
    client: Any, state_machine: str
) -> None:
    # Why the engine asks before it starts: Standard workflows' StartExecution is idempotent
    # for a RUNNING execution with the same name and input, so its answer cannot tell a
    # repeat from a start. Another input (or a closed execution) is ExecutionAlreadyExists.
    # GIVEN a running execution
    first = client.start_execution(stateMachineArn=state_machine, name=CANDIDATE, input="{}")
    # WHEN the same name is started with the same input, then with another
    same = client.start_execution(stateMachineArn=state_machine, name=CANDIDATE, input="{}")
    with pytest.raises(ClientError) as other:
        client.start_execution(stateMachineArn=state_machine, name=CANDIDATE, input='{"n": 1}')
    # THEN the first is the answer to the same input, and the other input is refused
    assert same["executionArn"] == first["executionArn"]
    assert other.value.response["Error"]["Code"] == "ExecutionAlreadyExists"


async def test_a_started_execution_is_described_by_its_instance_id(
    engine: StepFunctionsEngine, state_machine: str, client: Any
) -> None:
    # GIVEN a started execution
    await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    # WHEN it is described
    instance = await engine.describe("verification", CANDIDATE)
    # THEN it is that instance, in one of our statuses, at the execution ARN we derive
    assert instance is not None
    assert instance.workflow == "verification"
    assert instance.instance_id == CANDIDATE
    assert instance.status in {WorkflowStatus.running, WorkflowStatus.succeeded}
    described = client.describe_execution(executionArn=execution_arn(state_machine, CANDIDATE))
    assert described["name"] == CANDIDATE


async def test_an_aborted_execution_is_described_as_failed(
    engine: StepFunctionsEngine, state_machine: str, client: Any
) -> None:
    # GIVEN an execution that was stopped
    await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    client.stop_execution(executionArn=execution_arn(state_machine, CANDIDATE))
    # WHEN it is described
    instance = await engine.describe("verification", CANDIDATE)
    # THEN it failed, with no output
    assert instance is not None
    assert instance.status is WorkflowStatus.failed
    assert instance.output is None
    assert instance.error


async def test_an_execution_never_started_is_described_as_none(
    engine: StepFunctionsEngine,
) -> None:
    # GIVEN/WHEN an instance ID no one started is described / THEN there is none
    assert await engine.describe("verification", "cand_never") is None


async def test_a_workflow_without_a_state_machine_names_the_setting(
    engine: StepFunctionsEngine,
) -> None:
    # GIVEN an engine with no release state machine configured
    # WHEN a release is started / THEN the error names the setting to set
    with pytest.raises(ConfigurationError, match="release_state_machine_arn"):
        await engine.start("release", "rel_acme-web_3", {})


async def test_another_step_functions_error_is_a_workflow_engine_error(client: Any) -> None:
    # GIVEN a state machine ARN that Step Functions refuses as malformed
    engine = StepFunctionsEngine(client, {"verification": "not-an-arn"})
    # WHEN an instance is started / THEN the error is the engine's, naming the instance
    with pytest.raises(WorkflowEngineError, match=CANDIDATE):
        await engine.start("verification", CANDIDATE, {})


# --------------------------------------------------------------------------- operations


async def test_executions_are_listed_newest_first_and_a_running_one_cancelled_or_terminated(
    engine: StepFunctionsEngine, state_machine: str, client: Any
) -> None:
    # GIVEN two running executions of two Changes (moto keeps them running)
    await engine.start("verification", "cand_a", {"candidateId": "cand_a", "changeId": "chg-1"})
    await engine.start("verification", "cand_b", {"candidateId": "cand_b", "changeId": "chg-2"})
    listed = await engine.list_instances("verification")
    assert {i.instance_id for i in listed} == {"cand_a", "cand_b"}
    assert all(i.status is WorkflowStatus.running for i in listed)
    of_change = await engine.list_instances("verification", change_id="chg-1")
    assert [(i.instance_id, i.change_id) for i in of_change] == [("cand_a", "chg-1")]
    # WHEN an operator cancels one and terminates the other
    cancelled = await engine.cancel("verification", "cand_a", "wrong candidate")
    terminated = await engine.terminate("verification", "cand_b", "stuck")
    # THEN each execution was stopped (StopExecution), and each answer says how
    assert cancelled is not None and terminated is not None
    assert (cancelled.done, cancelled.status) == (True, WorkflowStatus.cancelled)
    assert (terminated.done, terminated.status) == (True, WorkflowStatus.failed)
    for name in ("cand_a", "cand_b"):
        stopped = client.describe_execution(executionArn=execution_arn(state_machine, name))
        assert stopped["status"] == "ABORTED"
    # AND stopping a stopped execution changes nothing, and says why
    again = await engine.cancel("verification", "cand_a", "again")
    assert again is not None and not again.done
    assert again.detail.startswith("only a running instance is stopped")
    assert await engine.cancel("verification", "cand_never", "x") is None
    assert [i.instance_id for i in await engine.list_instances("verification", limit=1)] == [
        listed[0].instance_id
    ]


def test_an_execution_stopped_as_cancelled_is_told_from_one_terminated() -> None:
    # GIVEN Step Functions' answers for executions stopped with our two errors (moto does
    # not keep a StopExecution's error; AWS returns it in DescribeExecution)
    from rhumbatron.workflows.step_functions import CANCELLED_ERROR, TERMINATED_ERROR

    answers = {
        CANCELLED_ERROR: {"status": "ABORTED", "error": CANCELLED_ERROR, "cause": "wrong"},
        TERMINATED_ERROR: {"status": "ABORTED", "error": TERMINATED_ERROR, "cause": "stuck"},
    }

    class Answering:
        def __init__(self, answer: dict[str, str]) -> None:
            self.answer = answer

        def describe_execution(self, executionArn: str) -> dict[str, str]:
            return self.answer

    arn = "arn:aws:states:us-east-1:123456789012:stateMachine:verification"
    # WHEN each is described / THEN the cancelled one is cancelled, the other a failure
    for error, status in ((CANCELLED_ERROR, "cancelled"), (TERMINATED_ERROR, "failed")):
        engine = StepFunctionsEngine(Answering(answers[error]), {"verification": arn})
        instance = asyncio.run(engine.describe("verification", CANDIDATE))
        assert instance is not None and instance.status == status


async def test_the_history_of_an_execution_lists_its_states_with_their_errors(
    engine: StepFunctionsEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an execution whose history ends in a failed state (moto's recorded failure)
    monkeypatch.setenv("SF_EXECUTION_HISTORY_TYPE", "FAILURE")
    await engine.start("verification", CANDIDATE, {"candidateId": CANDIDATE})
    # WHEN its history is read
    history = await engine.history("verification", CANDIDATE)
    # THEN its one state is there, with the execution's error; a running execution waits on
    # it
    assert history is not None
    [step] = history.steps
    assert (step.name, step.attempts) == ("A State", 1)
    assert step.error == "AnError: An error occurred!"
    assert history.next_retry_at is None
    assert await engine.history("verification", "cand_never") is None


def test_step_functions_history_events_become_steps_with_attempts_and_the_failed_state() -> None:
    # GIVEN a history in Step Functions' own shape: a task state retried once, then a
    # second state whose task failed and ended the execution
    events = [
        {"type": "ExecutionStarted", "timestamp": NOW},
        {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": "Build"}},
        {"type": "TaskScheduled", "timestamp": NOW},
        {"type": "TaskFailed", "taskFailedEventDetails": {"error": "Timeout"}},
        {"type": "TaskScheduled", "timestamp": NOW},
        {"type": "TaskSucceeded", "timestamp": NOW},
        {"type": "TaskStateExited", "stateExitedEventDetails": {"name": "Build"}, "timestamp": NOW},
        {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": "Deploy"}},
        {"type": "TaskScheduled", "timestamp": NOW},
        {
            "type": "TaskFailed",
            "taskFailedEventDetails": {"error": "States.TaskFailed", "cause": "no app"},
            "timestamp": NOW,
        },
        {"type": "ExecutionFailed", "executionFailedEventDetails": {"error": "States.TaskFailed"}},
    ]
    # WHEN they are read as steps
    steps = steps_of_history(events, WorkflowStatus.failed)
    # THEN Build succeeded on its second attempt (its first error kept), Deploy failed
    assert [(s.name, s.status, s.attempts) for s in steps] == [
        ("Build", "succeeded", 2),
        ("Deploy", "failed", 1),
    ]
    assert steps[0].at == NOW.isoformat()
    assert steps[1].error == "States.TaskFailed"
    # AND while the execution runs, the state it is in is the running one
    assert steps_of_history(events[:9], WorkflowStatus.running)[-1].status == "running"


async def test_a_redrive_asks_step_functions_to_run_a_failed_execution_again() -> None:
    # GIVEN a failed execution (moto has no RedriveExecution: botocore's Stubber answers as
    # AWS does, and checks the request against the service's model)
    from botocore.stub import Stubber

    client = boto3.client(
        "stepfunctions", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:verification"
    arn = execution_arn(machine, CANDIDATE)
    failed = {
        "executionArn": arn,
        "stateMachineArn": machine,
        "status": "FAILED",
        "startDate": NOW,
        "error": "States.TaskFailed",
    }
    engine = StepFunctionsEngine(client, {"verification": machine})
    with Stubber(client) as stub:
        stub.add_response("describe_execution", failed, {"executionArn": arn})
        stub.add_response("redrive_execution", {"redriveDate": NOW}, {"executionArn": arn})
        stub.add_response("describe_execution", failed, {"executionArn": arn})
        stub.add_client_error(
            "redrive_execution",
            service_error_code="ExecutionNotRedrivable",
            service_message="the execution ended more than 14 days ago",
            expected_params={"executionArn": arn},
        )
        # WHEN it is redriven, and once more where Step Functions refuses
        redriven = await engine.redrive("verification", CANDIDATE)
        refused = await engine.redrive("verification", CANDIDATE)
        stub.assert_no_pending_responses()
    # THEN the first runs again; the second says Step Functions does not redrive it
    assert redriven is not None and (redriven.done, redriven.status) == (
        True,
        WorkflowStatus.running,
    )
    assert refused is not None and not refused.done
    assert "Step Functions does not redrive it" in refused.detail
    assert "14 days" in refused.detail
