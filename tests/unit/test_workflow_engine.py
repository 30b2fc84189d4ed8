"""The workflow engine port and its in-process adapter (rulebook "Queues": S0-185, S0-186,
S0-188; "Idempotency and dedupe": S0-224, S0-226). Real SQLite in a temp dir, no NATS."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import DomainError
from rhumbatron.protocol.envelopes import Command
from rhumbatron.workflows import (
    InProcessEngine,
    StepFunction,
    WorkflowDefinition,
    WorkflowStart,
    WorkflowStatus,
    check_instance_id,
    workflow_start_for,
)

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
PROJECT = "acme-web"
CANDIDATE = "cand_0123abcd"
RELEASE = "rel_acme-web_3"


class Killed(BaseException):
    """Stands for the process dying mid-step: not an Exception, so no step failure."""


class Steps:
    """Three recording steps, ``one`` → ``two`` → ``three``; each returns what it saw."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.kill_in: str | None = None
        self.fail_in: str | None = None
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    def step(self, name: str) -> StepFunction:
        async def run(input: Mapping[str, Any], state: dict[str, Any]) -> Mapping[str, Any]:
            self.runs[name] += 1
            self.entered.set()
            if self.gate is not None:
                await self.gate.wait()
            if self.kill_in == name:
                self.kill_in = None  # the process dies once; the next one gets through
                raise Killed(name)
            if self.fail_in == name:
                raise ValueError(f"{name} broke on {input['candidate']}")
            return {name: sorted(state)}

        return run

    def definition(self, workflow: str = "verification") -> WorkflowDefinition:
        return WorkflowDefinition(
            workflow, tuple((name, self.step(name)) for name in ("one", "two", "three"))
        )


@pytest.fixture
def steps() -> Steps:
    return Steps()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "state" / "workflows.sqlite"


@pytest.fixture
def engine(
    store: Path, offline_settings: Settings, clock: ManualClock, steps: Steps
) -> Iterator[InProcessEngine]:
    engine = InProcessEngine(
        store, offline_settings, clock, {"verification": steps.definition("verification")}
    )
    yield engine
    engine.close()


def start_command(command_type: str, payload: dict[str, Any]) -> Command:
    return Command.create(
        command_id=f"cmd_{command_type}_1",
        command_type=command_type,
        project_id=PROJECT,
        change_id="chg-1",
        created_at=NOW,
        payload=payload,
    )


# --------------------------------------------------------------------------- workflowStartFor


def test_verification_start_maps_to_the_candidate_id() -> None:
    # GIVEN a verification.start command for one Candidate
    command = start_command("verification.start", {"candidateId": CANDIDATE})
    # WHEN it is mapped to its workflow start
    # THEN the instance ID is the Candidate ID
    assert workflow_start_for(command) == ("verification", CANDIDATE)


def test_release_start_maps_to_the_release_id() -> None:
    # GIVEN a release.start command for a promoted generation
    command = start_command("release.start", {"releaseId": RELEASE, "generation": 3})
    # WHEN it is mapped / THEN the instance ID is the release ID
    assert workflow_start_for(command) == ("release", RELEASE)


def test_a_command_that_starts_no_workflow_is_refused_naming_the_ones_that_do() -> None:
    # GIVEN an agent.wake command
    command = start_command("agent.wake", {"agentId": "agent-7", "reason": "task_ready"})
    # WHEN it is mapped / THEN a DomainError names its type and the two starting types
    with pytest.raises(DomainError) as refused:
        workflow_start_for(command)
    assert "'agent.wake'" in str(refused.value)
    assert "verification.start" in str(refused.value)
    assert "release.start" in str(refused.value)


# --------------------------------------------------------------------------- check_instance_id


@pytest.mark.parametrize("instance_id", [CANDIDATE, RELEASE, "x", "a" * 80])
def test_candidate_and_release_ids_are_valid_instance_ids(instance_id: str) -> None:
    # GIVEN/WHEN an ID Step Functions accepts as an execution name / THEN it passes unchanged
    assert check_instance_id(instance_id) == instance_id


@pytest.mark.parametrize("instance_id", ["a" * 81, "a b", "", "rel.acme.3", "cand/1"])
def test_an_id_step_functions_would_refuse_is_refused_with_the_value(instance_id: str) -> None:
    # GIVEN/WHEN an ID outside 1..80 of [A-Za-z0-9_-] / THEN a DomainError names it
    with pytest.raises(DomainError) as refused:
        check_instance_id(instance_id)
    assert repr(instance_id) in str(refused.value)


async def test_the_in_process_engine_refuses_the_ids_step_functions_refuses(
    engine: InProcessEngine, steps: Steps
) -> None:
    # GIVEN the local engine / WHEN an instance ID with a space is started
    with pytest.raises(DomainError, match="'a b'"):
        await engine.start("verification", "a b", {"candidate": CANDIDATE})
    # THEN nothing ran and nothing was recorded
    assert steps.runs == Counter()
    assert await engine.describe("verification", "a b") is None


# --------------------------------------------------------------------------- start / describe


async def test_a_second_start_of_one_instance_is_a_repeat_and_runs_nothing(
    engine: InProcessEngine, steps: Steps
) -> None:
    # GIVEN an instance started once
    first = await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # WHEN the same ID is started again (a redelivered verification.start)
    second = await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # THEN the first started it, the second found it, and each step ran once
    assert first == WorkflowStart("verification", CANDIDATE, started=True)
    assert second == WorkflowStart("verification", CANDIDATE, started=False)
    assert steps.runs == Counter({"one": 1, "two": 1, "three": 1})


async def test_a_finished_instance_is_described_with_the_state_its_steps_returned(
    engine: InProcessEngine,
) -> None:
    # GIVEN an instance that ran to the end
    await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # WHEN it is described
    instance = await engine.describe("verification", CANDIDATE)
    # THEN it succeeded, and each step saw the keys the steps before it returned
    assert instance is not None
    assert instance.status is WorkflowStatus.succeeded
    assert instance.error is None
    assert instance.output == {"one": [], "two": ["one"], "three": ["one", "two"]}


async def test_an_instance_never_started_is_described_as_none(engine: InProcessEngine) -> None:
    # GIVEN/WHEN an ID no one started is described / THEN there is no instance
    assert await engine.describe("verification", "cand_never") is None


async def test_a_step_that_raises_marks_the_instance_failed_with_the_error(
    engine: InProcessEngine, steps: Steps
) -> None:
    # GIVEN a workflow whose second step raises
    steps.fail_in = "two"
    # WHEN it is started
    started = await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # THEN start still answers started (a failed run is an outcome), the later step never ran,
    # and the instance is failed with the error's type and message
    assert started.started is True
    assert steps.runs == Counter({"one": 1, "two": 1})
    instance = await engine.describe("verification", CANDIDATE)
    assert instance is not None
    assert instance.status is WorkflowStatus.failed
    assert instance.output is None
    assert instance.error is not None
    assert f"ValueError: two broke on {CANDIDATE}" in instance.error


async def test_an_unknown_workflow_is_refused_naming_the_known_ones(
    engine: InProcessEngine,
) -> None:
    # GIVEN an engine that knows only verification
    # WHEN a release is started / THEN a DomainError names both
    with pytest.raises(DomainError) as refused:
        await engine.start("release", RELEASE, {})
    assert "'release'" in str(refused.value)
    assert "verification" in str(refused.value)


def test_a_definition_with_a_repeated_step_name_is_refused(steps: Steps) -> None:
    # GIVEN/WHEN two steps share a name / THEN the definition is refused, naming it
    with pytest.raises(DomainError, match="one"):
        WorkflowDefinition("verification", (("one", steps.step("one")), ("one", steps.step("a"))))


# --------------------------------------------------------------------------- resume


async def test_a_killed_run_resumes_from_the_unfinished_step_in_a_new_engine(
    store: Path, offline_settings: Settings, clock: ManualClock, steps: Steps
) -> None:
    # GIVEN a run killed inside step two (step one finished, the instance still running)
    steps.kill_in = "two"
    first = InProcessEngine(store, offline_settings, clock, {"verification": steps.definition()})
    with pytest.raises(Killed):
        await first.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    first.close()
    # WHEN a new engine (a new process) on the same file resumes it
    engine = InProcessEngine(store, offline_settings, clock, {"verification": steps.definition()})
    running = await engine.describe("verification", CANDIDATE)
    resumed = await engine.resume(CANDIDATE)
    # THEN it was running, step one did not run again, steps two and three ran to the end
    assert running is not None
    assert running.status is WorkflowStatus.running
    assert steps.runs == Counter({"one": 1, "two": 2, "three": 1})
    assert resumed is not None
    assert resumed.status is WorkflowStatus.succeeded
    assert resumed.output == {"one": [], "two": ["one"], "three": ["one", "two"]}
    engine.close()


async def test_a_repeated_start_of_a_killed_run_does_not_run_it_again(
    store: Path, offline_settings: Settings, clock: ManualClock, steps: Steps
) -> None:
    # GIVEN a run killed inside step two
    steps.kill_in = "two"
    engine = InProcessEngine(store, offline_settings, clock, {"verification": steps.definition()})
    with pytest.raises(Killed):
        await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # WHEN the command is redelivered
    again = await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # THEN it is a repeat: resuming is the sweep's job, not the consumer's
    assert again.started is False
    assert steps.runs == Counter({"one": 1, "two": 1})
    engine.close()


async def test_resume_running_resumes_every_running_instance_and_no_other(
    store: Path, offline_settings: Settings, clock: ManualClock, steps: Steps
) -> None:
    # GIVEN two runs killed in step two and one that finished
    engine = InProcessEngine(store, offline_settings, clock, {"verification": steps.definition()})
    for candidate in ("cand_a", "cand_b"):
        steps.kill_in = "two"
        with pytest.raises(Killed):
            await engine.start("verification", candidate, {"candidate": candidate})
    await engine.start("verification", "cand_done", {"candidate": "cand_done"})
    # WHEN the sweep resumes running instances
    resumed = await engine.resume_running()
    # THEN exactly the two killed ones were resumed, each step once more at most
    assert sorted(resumed) == ["cand_a", "cand_b"]
    assert steps.runs == Counter({"one": 3, "two": 5, "three": 3})
    for candidate in ("cand_a", "cand_b", "cand_done"):
        instance = await engine.describe("verification", candidate)
        assert instance is not None
        assert instance.status is WorkflowStatus.succeeded
    assert await engine.resume_running() == []
    engine.close()


# --------------------------------------------------------------------------- concurrency


async def test_concurrent_starts_and_a_resume_of_one_id_run_each_step_once(
    engine: InProcessEngine, steps: Steps
) -> None:
    # GIVEN a start held inside step one (the instance is running, no step finished yet)
    steps.gate = asyncio.Event()
    first = asyncio.create_task(engine.start("verification", CANDIDATE, {"candidate": CANDIDATE}))
    await steps.entered.wait()
    # WHEN a second start and a resume of the same ID arrive before it goes on
    others = asyncio.gather(
        engine.start("verification", CANDIDATE, {"candidate": CANDIDATE}),
        engine.resume(CANDIDATE),
    )
    steps.gate.set()
    started, (again, resumed) = await first, await others
    # THEN one start ran the steps, once each; the other was a repeat; the resume found it done
    assert started.started is True
    assert again.started is False
    assert resumed is not None
    assert resumed.status is WorkflowStatus.succeeded
    assert steps.runs == Counter({"one": 1, "two": 1, "three": 1})


def test_the_package_declares_exactly_its_public_names() -> None:
    # GIVEN the workflows package / WHEN its names are read
    import rhumbatron.workflows as package

    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, type(package))
        and name != "annotations"
    }
    # THEN every declared name exists and every public name is declared
    assert all(hasattr(package, name) for name in package.__all__)
    assert public == set(package.__all__)


@pytest.mark.parametrize("missing", ["changeId", "candidate_id", "app_name"])
async def test_a_release_step_whose_input_lacks_a_subject_fails_naming_it_never_writing_none(
    missing: str,
) -> None:
    # GIVEN the release's first step, and an input whose subject is null (as from a
    #   release.start that named no Change, Candidate or app)
    from rhumbatron.lifecycle.workflows import LifecycleWorkflows

    start = dict(LifecycleWorkflows(None, None, None).definitions()["release"].steps)["start"]  # type: ignore[arg-type]
    given: dict[str, Any] = {
        "projectId": PROJECT,
        "changeId": "chg-1",
        "release_id": RELEASE,
        "generation": 3,
        "candidate_id": CANDIDATE,
        "app_name": "storefront",
    }
    given[missing] = None
    # WHEN it runs THEN it fails, naming the missing key, before it writes anything (the
    #   world it would write through is not even there)
    with pytest.raises(DomainError, match=f"the workflow input has no '{missing}'"):
        await start(given, {})


# --------------------------------------------------------------------------- operations


async def test_a_failed_instance_shows_each_step_and_is_redriven_from_the_failed_one(
    engine: InProcessEngine, steps: Steps, clock: ManualClock
) -> None:
    # GIVEN an instance whose step two failed, twice (a redrive that failed again)
    steps.fail_in = "two"
    await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    clock.advance(seconds=60)
    first_redrive = await engine.redrive("verification", CANDIDATE)
    # WHEN its history is read
    history = await engine.history("verification", CANDIDATE)
    # THEN it lists every step: one finished once, two failed twice with its error, three
    # not started; nothing is pending, and this engine retries nothing by itself
    assert first_redrive is not None and first_redrive.done
    assert history is not None
    assert history.instance.status is WorkflowStatus.failed
    assert [(s.name, s.status, s.attempts) for s in history.steps] == [
        ("one", "succeeded", 1),
        ("two", "failed", 2),
        ("three", "not_started", 0),
    ]
    assert history.steps[1].error == f"step 'two': ValueError: two broke on {CANDIDATE}"
    assert history.steps[1].at == clock.now().isoformat()
    assert (history.pending_step, history.next_retry_at) == (None, None)

    # WHEN the step is mended and the instance redriven
    steps.fail_in = None
    redriven = await engine.redrive("verification", CANDIDATE)
    # THEN it ran on from step two (step one not again) and succeeded
    assert redriven is not None
    assert (redriven.done, redriven.status) == (True, WorkflowStatus.succeeded)
    assert steps.runs == Counter({"one": 1, "two": 3, "three": 1})
    # AND a redrive of a succeeded instance changes nothing and says why
    again = await engine.redrive("verification", CANDIDATE)
    assert again is not None and not again.done
    assert again.detail == "only a failed instance is redriven; this one is succeeded"
    assert await engine.redrive("verification", "cand_unknown") is None


async def test_a_cancelled_instance_runs_no_further_step_and_is_never_redriven(
    engine: InProcessEngine, steps: Steps
) -> None:
    # GIVEN an instance held inside step one
    steps.gate = asyncio.Event()
    run = asyncio.create_task(engine.start("verification", CANDIDATE, {"candidate": CANDIDATE}))
    await steps.entered.wait()
    pending = await engine.history("verification", CANDIDATE)
    # WHEN an operator cancels it, and the step in flight then finishes
    cancelled = await engine.cancel("verification", CANDIDATE, "wrong candidate")
    steps.gate.set()
    await run
    # THEN the step in flight was the pending one; its result stands, no later step ran,
    # and the instance is cancelled with the operator's reason
    assert pending is not None and pending.pending_step == "one"
    assert cancelled is not None and cancelled.done
    assert steps.runs == Counter({"one": 1})
    instance = await engine.describe("verification", CANDIDATE)
    assert instance is not None
    assert (instance.status, instance.error) == (
        WorkflowStatus.cancelled,
        "cancelled by an operator: wrong candidate",
    )
    # AND cancelling again, terminating or redriving it changes nothing
    for control in (
        await engine.cancel("verification", CANDIDATE, "again"),
        await engine.terminate("verification", CANDIDATE, "again"),
        await engine.redrive("verification", CANDIDATE),
    ):
        assert control is not None and not control.done
    assert steps.runs == Counter({"one": 1})


async def test_a_terminated_instance_is_a_failure_a_redrive_runs_on_from_where_it_stopped(
    engine: InProcessEngine, steps: Steps, store: Path, offline_settings: Settings
) -> None:
    # GIVEN an instance cut short inside step two (still running, as after a crash)
    steps.kill_in = "two"
    with pytest.raises(Killed):
        await engine.start("verification", CANDIDATE, {"candidate": CANDIDATE})
    # WHEN an operator terminates it
    terminated = await engine.terminate("verification", CANDIDATE, "stuck")
    # THEN it failed with the reason, and the sweep's resume leaves it alone
    assert terminated is not None
    assert (terminated.done, terminated.status) == (True, WorkflowStatus.failed)
    assert await engine.resume_running() == []
    # WHEN it is redriven THEN step two and three run, and it succeeds
    redriven = await engine.redrive("verification", CANDIDATE)
    assert redriven is not None and redriven.status is WorkflowStatus.succeeded
    assert steps.runs == Counter({"one": 1, "two": 2, "three": 1})


async def test_instances_are_listed_newest_first_and_by_status(
    engine: InProcessEngine, steps: Steps, clock: ManualClock
) -> None:
    steps.fail_in = "three"
    a = {"candidate": "cand_a", "projectId": PROJECT, "changeId": "chg-1"}
    await engine.start("verification", "cand_a", a)
    clock.advance(seconds=1)
    steps.fail_in = None
    await engine.start("verification", "cand_b", {**a, "candidate": "cand_b", "changeId": "chg-2"})
    listed = await engine.list_instances("verification")
    assert [(i.instance_id, i.status) for i in listed] == [
        ("cand_b", WorkflowStatus.succeeded),
        ("cand_a", WorkflowStatus.failed),
    ]
    failed = await engine.list_instances("verification", status=WorkflowStatus.failed)
    assert [i.instance_id for i in failed] == ["cand_a"]
    assert [i.instance_id for i in await engine.list_instances("verification", limit=1)] == [
        "cand_b"
    ]
    # ... in ledger terms too: each names its project and Change, and a Change's are found
    assert [(i.project_id, i.change_id) for i in listed] == [(PROJECT, "chg-2"), (PROJECT, "chg-1")]
    of_change = await engine.list_instances("verification", change_id="chg-1")
    assert [i.instance_id for i in of_change] == ["cand_a"]
    with pytest.raises(DomainError, match="unknown workflow 'deploy'"):
        await engine.list_instances("deploy")
