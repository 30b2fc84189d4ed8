"""The workflow-step function, run the way Lambda runs it, and driven by the state machines.

``functions/workflow_step/app.py`` is loaded from its path and its settings come from
``RHUMBATRON_*`` environment variables. The Change, its Candidate and the Candidate's fork
are written by another role into the same state directory, through the real actors.

No Step Functions here: :func:`run_state_machine` follows ``statemachines/*.asl.json`` the
way Step Functions applies ``Parameters``, ``ResultSelector``, ``ResultPath`` and
``OutputPath``, and calls the function for each Task — so the tests show what each step
receives and what flows to the next, with the definitions the template deploys.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import (
    AdmitAgent,
    CompleteTask,
    ComposeCandidate,
    CreateChange,
    ProposeChangeset,
    StartTask,
)
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.errors import EnvelopeError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.selectors import Selector, event_selector_matches
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

from .support import ROOT, FakeLambdaContext, load_app, sample_event

PROJECT = "acme-web"
CHANGE = "chg_0123456789abcdef0123"
AGENT = "builder-1"
CALLER = Caller("acme", "system:test", correlation_id="corr-workflow")
STATE_MACHINES = ROOT / "statemachines"


# -- a state machine, followed as Step Functions follows it ------------------------------------


def _get(document: Any, path: str) -> Any:
    """A reference path (``$`` or ``$.a.b``) into ``document``."""
    assert path == "$" or path.startswith("$."), path
    for key in path[2:].split(".") if path != "$" else []:
        document = document[key]
    return document


def _set(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``document`` with ``value`` at the reference path (a ResultPath)."""
    if path == "$":
        return dict(value)
    *parents, last = path[2:].split(".")
    updated = json.loads(json.dumps(document))
    node = updated
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return updated


def _parameters(template: Any, document: Any) -> Any:
    """A payload template: keys ending in ``.$`` take the value at their path."""
    if not isinstance(template, dict):
        return template
    return {
        (key[:-2] if key.endswith(".$") else key): (
            _get(document, value) if key.endswith(".$") else _parameters(value, document)
        )
        for key, value in template.items()
    }


def run_state_machine(
    definition: dict[str, Any], execution_input: dict[str, Any], invoke: Callable[[Any], Any]
) -> tuple[str, Any]:
    """``("SUCCEEDED", output)`` or ``("FAILED", {"Error", "Cause"})``. Tasks call ``invoke``
    with their payload; a Task's exception goes to its Catch (the retries that come first in
    the cloud are not played: here the first failure is the last)."""
    document: Any = execution_input
    at = definition["StartAt"]
    for _ in range(100):
        state = definition["States"][at]
        kind = state["Type"]
        if kind == "Succeed":
            return "SUCCEEDED", _get(document, state.get("OutputPath", "$"))
        if kind == "Fail":
            error = _get(document, state["ErrorPath"])
            return "FAILED", {"Error": error, "Cause": _get(document, state["CausePath"])}
        if kind == "Pass":
            document = _parameters(state.get("Parameters"), document) or document
        else:
            assert kind == "Task" and state["Resource"] == "arn:aws:states:::lambda:invoke"
            payload = _parameters(state["Parameters"], document)["Payload"]
            try:
                # Lambda receives JSON and answers JSON.
                answer = json.loads(json.dumps(invoke(json.loads(json.dumps(payload)))))
            except Exception as exc:
                (catch,) = state["Catch"]
                assert catch["ErrorEquals"] == ["States.ALL"]
                # Lambda's error: its type's name and its message
                failure = {"Error": type(exc).__name__, "Cause": str(exc)}
                document, at = _set(document, catch["ResultPath"], failure), catch["Next"]
                continue
            result = _parameters(state["ResultSelector"], {"Payload": answer, "StatusCode": 200})
            document = _set(document, state["ResultPath"], result)
        at = state["Next"]
    raise AssertionError("the state machine did not end within 100 states")


def _definition(workflow: str) -> dict[str, Any]:
    definition: dict[str, Any] = json.loads((STATE_MACHINES / f"{workflow}.asl.json").read_text())
    return definition


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def lambda_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The function's environment as template.yaml sets it (no NATS: a step never connects)."""
    for name, value in {
        "RHUMBATRON_STATE_DIR": str(tmp_path / "state"),
        "RHUMBATRON_JOURNAL_MODE": "DELETE",
        "RHUMBATRON_NETWORK_FILESYSTEM": "true",
        # Nobody listens here: a step that tried to connect would fail the test.
        "RHUMBATRON_NATS_URL": "nats://127.0.0.1:1",
        "POWERTOOLS_SERVICE_NAME": "workflow-step",
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings()


@pytest.fixture
def function(lambda_env: Settings) -> Iterator[ModuleType]:
    """A fresh container: ``app`` loaded, no runtime cached yet."""
    process.reset_for_tests()
    yield load_app("workflow_step")
    process.reset_for_tests()


@pytest.fixture
def writer(lambda_env: Settings) -> Iterator[Rhumbatron]:
    """Another role (the integration queue) writing the Change, its Candidate and the fork."""
    app = bootstrap(lambda_env)
    app.project_root(PROJECT).create_project(CALLER, name="Acme web")
    yield app
    asyncio.run(app.close())


def _shard(app: Rhumbatron) -> ResourceShard:
    return app.resource_shard(PROJECT, change_resource_key(CHANGE))


def _candidate_with_fork(app: Rhumbatron, files: dict[str, str]) -> str:
    """A Change whose one Task proposed a changeset, composed into a Candidate (created),
    and the Candidate's fork holding ``files``; the Candidate's ID."""
    shard = _shard(app)
    task = TaskPlan(f"{CHANGE}-t1", "one", AGENT)
    shard.apply(
        CALLER,
        CreateChange(
            change_id=CHANGE,
            title="Gift cards",
            client_request_id="req-1",
            requested_by="user:ann",
            tasks=[task],
        ),
    )
    shard.apply(CALLER, AdmitAgent(change_id=CHANGE, task_id=task.task_id, agent_id=AGENT))
    shard.apply(CALLER, StartTask(task_id=task.task_id, agent_id=AGENT))
    shard.apply(
        CALLER,
        ProposeChangeset(
            changeset_id="cs-1",
            task_id=task.task_id,
            agent_id=AGENT,
            files=files,
            base_generation=0,
        ),
    )
    shard.apply(
        CALLER,
        CompleteTask(change_id=CHANGE, task_id=task.task_id, agent_id=AGENT, changeset_id="cs-1"),
    )
    candidate = shard.apply(CALLER, ComposeCandidate(change_id=CHANGE, base_generation=0))
    app.lifecycle().forks.write(PROJECT, candidate.candidate_id, files)
    return candidate.candidate_id


def _verification_input(candidate_id: str) -> dict[str, Any]:
    """What the integration module starts a verification with (``workflow_input``)."""
    return {"projectId": PROJECT, "changeId": CHANGE, "candidate_id": candidate_id}


def _invoke(function: ModuleType) -> Callable[[Any], Any]:
    return lambda payload: function.lambda_handler(payload, FakeLambdaContext())


def _status(app: Rhumbatron, candidate_id: str) -> tuple[CandidateStatus, str]:
    shard = _shard(app)
    candidate, change = shard.candidate(candidate_id), shard.change_state(CHANGE)
    assert candidate is not None and change is not None
    return candidate.status, change.status


# -- the state machines ------------------------------------------------------------------------


def test_verification_checks_the_fork_then_verifies_the_candidate(
    function: ModuleType, writer: Rhumbatron
) -> None:
    # GIVEN a created Candidate whose fork parses
    candidate_id = _candidate_with_fork(writer, {"src/gift_card.py": "class GiftCard: ...\n"})

    # WHEN its verification execution runs, each Task invoking the function
    outcome, output = run_state_machine(
        _definition("verification"), _verification_input(candidate_id), _invoke(function)
    )

    # THEN check's problems reached decide, and the execution's output is the final state
    assert (outcome, output) == ("SUCCEEDED", {"problems": [], "decision": "verified"})
    # AND the Candidate is verified and its Change awaits approval
    assert _status(writer, candidate_id) == (CandidateStatus.VERIFIED, "awaiting_approval")


def test_verification_rejects_a_fork_that_does_not_parse(
    function: ModuleType, writer: Rhumbatron
) -> None:
    # GIVEN a Candidate whose fork holds a Python file with a syntax error
    candidate_id = _candidate_with_fork(writer, {"src/broken.py": "def broken(:\n"})
    # WHEN its verification runs
    outcome, output = run_state_machine(
        _definition("verification"), _verification_input(candidate_id), _invoke(function)
    )
    # THEN decide saw check's problem and rejected the Candidate, failing its Change
    assert outcome == "SUCCEEDED"
    assert output["decision"] == "rejected"
    assert [p.split(":")[0] for p in output["problems"]] == ["src/broken.py"]
    assert _status(writer, candidate_id) == (CandidateStatus.REJECTED, "failed")


def test_a_verification_verdict_names_its_workflow_as_an_actor_a_filter_can_select(
    function: ModuleType, writer: Rhumbatron
) -> None:
    # GIVEN a created Candidate whose fork parses, verified by its execution
    candidate_id = _candidate_with_fork(writer, {"src/gift_card.py": "class GiftCard: ...\n"})
    run_state_machine(
        _definition("verification"), _verification_input(candidate_id), _invoke(function)
    )
    # WHEN the verdict (our CI's fact) is read from the Change's outbox
    rows = (
        _shard(writer)
        .connection.execute("SELECT envelope FROM outbox WHERE event_type = 'candidate.verified'")
        .fetchall()
    )
    (verdict,) = [Event.parse(bytes(row[0])) for row in rows]
    # THEN it names the verification workflow as its actor, correlated by the Candidate
    assert (verdict.actor, verdict.correlation_id) == ("workflow:verification", candidate_id)
    # AND a subscription filter on subject.actor selects it, and one on another actor not
    ci = Selector.create(["candidate.*"], {"subject.actor": "workflow:verification"})
    other = Selector.create(["candidate.*"], {"subject.actor": CALLER.actor})
    assert event_selector_matches(ci, verdict)
    assert not event_selector_matches(other, verdict)


def test_a_step_that_fails_fails_the_execution_with_its_error(
    function: ModuleType, writer: Rhumbatron
) -> None:
    # GIVEN a release whose Candidate's fork is gone
    release_input = sample_event("workflow_step_release_deploy.json")["input"]
    # WHEN the release execution runs
    outcome, failure = run_state_machine(_definition("release"), release_input, _invoke(function))
    # THEN deploy's error became the execution's: its type and its message
    assert outcome == "FAILED"
    assert failure["Error"] == "FileNotFoundError"
    assert release_input["candidate_id"] in failure["Cause"]


# -- one step ----------------------------------------------------------------------------------


def test_the_sample_check_reports_a_missing_fork_as_the_problem(function: ModuleType) -> None:
    # GIVEN the sample check event, for a Candidate whose fork was never written
    event = sample_event("workflow_step_verification_check.json")
    # WHEN the function runs it
    answer = function.lambda_handler(event, FakeLambdaContext())
    # THEN the state it returns carries the problem for decide
    assert answer == {"state": {"problems": ["the candidate's fork is missing"]}}


def test_a_step_keeps_the_state_it_was_given_and_adds_what_it_returns(
    function: ModuleType, writer: Rhumbatron
) -> None:
    # GIVEN a Candidate's fork, and a state carrying an earlier step's values
    candidate_id = _candidate_with_fork(writer, {"app.json": "{}"})
    event = {
        "workflow": "verification",
        "step": "check",
        "input": _verification_input(candidate_id),
        "state": {"earlier": {"kept": True}, "problems": ["replaced"]},
    }
    # WHEN check runs
    answer = function.lambda_handler(event, FakeLambdaContext())
    # THEN what it returned replaced its key and everything else stayed
    assert answer == {"state": {"earlier": {"kept": True}, "problems": []}}


def test_the_deploy_step_of_a_missing_fork_raises_for_the_state_machine_to_retry(
    function: ModuleType,
) -> None:
    with pytest.raises(FileNotFoundError, match=r"cand_0123456789abcdef0123456789abcdef"):
        function.lambda_handler(
            sample_event("workflow_step_release_deploy.json"), FakeLambdaContext()
        )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"workflow": "verify"},
            r"field 'workflow'='verify': unknown workflow; workflows are release, verification",
        ),
        (
            {"step": "deploy"},
            r"field 'step'='deploy': workflow 'verification' has no such step; its steps are "
            r"check, decide",
        ),
        ({"input": None}, r"field 'input'=None"),
        ({"state": [1]}, r"field 'state'=\[1\]"),
        ({"extra": 1}, r"field 'extra'=1"),
    ],
)
def test_a_bad_event_is_refused_naming_the_field(
    function: ModuleType, change: dict[str, Any], expected: str
) -> None:
    event = {**sample_event("workflow_step_verification_check.json"), **change}
    with pytest.raises(EnvelopeError, match=expected):
        function.lambda_handler(event, FakeLambdaContext())


def test_a_missing_field_is_named(function: ModuleType) -> None:
    event = sample_event("workflow_step_verification_check.json")
    del event["step"]
    with pytest.raises(EnvelopeError, match=r"field 'step' is missing"):
        function.lambda_handler(event, FakeLambdaContext())
