"""The Step Functions adapter of the workflow engine, through boto3 against moto (rulebook
"Idempotency and dedupe": S0-224, execution name = instance ID)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from rhumbatron.errors import ConfigurationError, WorkflowEngineError
from rhumbatron.workflows import WorkflowStart, WorkflowStatus
from rhumbatron.workflows.step_functions import StepFunctionsEngine, execution_arn

CANDIDATE = "cand_0123abcd"
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
