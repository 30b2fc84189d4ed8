"""The spec's "Sweep housekeeping" table, end to end over the real actors (spec "Sweep
housekeeping", "Change lifecycle").

Each test builds its world through the lifecycle's own calls (requests, agent callbacks, shard
and root transitions), puts a :class:`ManualClock` at the minute it needs, and runs one tick
through the sweep entrypoint's code path (``sweep._handle``: the router's sweep, the
dead-letter consumer, then the lifecycle's housekeeping). The commands the tick queues are then
handled by the real queue handlers — the integration module, the release workflow on the
in-process engine, the indexer, the wake consumer — polled from a real nats-server. Nothing
of the project is patched; moto's S3 server holds the archive the router's sweep writes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import (
    AdmitAgent,
    AppendChangeEvents,
    BlockTaskForDeadLetter,
    CompleteTask,
    ComposeCandidate,
    DecideCandidate,
    FailTask,
    MoveChange,
    ProposeChangeset,
    ProvisionApp,
    SetProjectStatus,
    StartTask,
)
from rhumbatron.causal.store import StoredDecision
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.candidates import CandidateState, CandidateStatus
from rhumbatron.domain.changes import ChangeStatus, TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.domain.project import project_admin_key
from rhumbatron.domain.releases import ReleaseStatus, release_id_for
from rhumbatron.domain.tasks import TaskStatus
from rhumbatron.entrypoints import sweep
from rhumbatron.indexing import IndexState
from rhumbatron.lifecycle.commands import (
    lifecycle_command,
    ready_wake,
    ready_wake_id,
    rebase_command_id,
)
from rhumbatron.lifecycle.requests import qualified_task_id
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.messaging.queue_consumer import Delivery, PollReport, Retry
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.product.dead_letters import list_dead_letters, record_command_dead_letter
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.queues.wake_consumer import WakeOutcome
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.lifecycle_assembly import Lifecycle
from rhumbatron.workflows.engine import WorkflowStatus
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

pytestmark = pytest.mark.integration

FAST = {
    "queue_retry_delay_s": dict.fromkeys(
        ("agent-wakeups", "integration", "verification", "release", "indexing"), 0.05
    ),
    "integration_more_work_delay_s": 0.05,
    "conflict_review_delay_s": 0.05,
}
TENANT = "acme"
AGENT = "builder-a"
OPS = Caller(TENANT, "user:ops", "housekeeping-test")
#: A script that starts its Task and then waits for the next wake: an admitted Agent at work.
SCRIPTS = {"hold": [{"do": "wait"}]}
DAY = datetime(2026, 3, 2, tzinfo=UTC)


def at(hour: int, minute: int, *, days: int = 0) -> datetime:
    """A UTC minute of ``DAY`` (or a later day)."""
    return DAY + timedelta(days=days, hours=hour, minutes=minute)


def minute_key(moment: datetime) -> str:
    """The tick key a release-sweep command ID ends with."""
    return moment.strftime("%Y%m%d%H%M")


# -- fixtures --------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def app(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess, clock: ManualClock
) -> AsyncIterator[Rhumbatron]:
    """The embedded default on a manual clock: nats-server, moto S3, SQLite actor files, the
    in-process workflow engine, fast queue retries."""
    bucket = f"evidence-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=bucket)
    settings = load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        s3_endpoint_url=s3_server.endpoint_url,
        evidence_bucket=bucket,
        **FAST,
    )
    # The sweep entrypoint remembers per process that the streams are ensured: start cold.
    process.reset_for_tests()
    runtime = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    await runtime.ensure_streams()
    runtime.lifecycle().scripts = ScriptLibrary.from_mapping(SCRIPTS)
    yield runtime
    await runtime.close()
    process.reset_for_tests()


# -- driving the roles -----------------------------------------------------------------------


async def tick(app: Rhumbatron, at: datetime | None = None) -> dict[str, Any]:
    """One sweep invocation, through the entrypoint's code path (for the clock's minute)."""
    return await sweep._handle(app, None, at=at)


def housekeeping_sent(summary: Mapping[str, Any]) -> dict[str, int]:
    sent: dict[str, int] = summary["housekeeping"]["sent"]
    return sent


async def run_queue(app: Rhumbatron, queue: str) -> PollReport:
    """Poll ``queue`` with its lifecycle handler until it is empty."""
    runtime = await app.queue_runtime()
    report = await runtime.poll(queue, app.lifecycle().handler(queue), max_fetches=10)
    assert report.failed == report.dead_lettered == 0, report
    return report


def handled(lifecycle: Lifecycle, command_type: str) -> list[str]:
    """The command IDs of ``command_type`` the integration module has handled, in order."""
    return [h.command_id for h in lifecycle.integration.handled if h.command_type == command_type]


# -- building the world through the lifecycle's calls -----------------------------------------


def new_project(app: Rhumbatron, project_id: str, *, live_app: str | None = None) -> None:
    app.project_root(project_id).create_project(OPS, name=project_id)
    if live_app is not None:
        app.lifecycle().world.admin_shard(project_id).apply(OPS, ProvisionApp(app_name=live_app))


def change_shard(app: Rhumbatron, project_id: str, change_id: str) -> ResourceShard:
    return app.lifecycle().world.change_shard(project_id, change_id)


def open_change(
    app: Rhumbatron, project_id: str, request: str, *, script: str | None = "hold"
) -> tuple[str, str]:
    """A Change of one ready Task (requested through the API's call); ``(change, task)``."""
    created = app.lifecycle().requests.create_change(
        Caller(TENANT, "user:dana", request),
        project_id=project_id,
        client_request_id=request,
        title=request,
        tasks=[TaskPlan(task_id="work", title="Do the work", agent_id=AGENT, script=script)],
    )
    return created.change_id, qualified_task_id(created.change_id, "work")


def take_task(app: Rhumbatron, project_id: str, change_id: str, task_id: str) -> None:
    """The dispatcher's wake admitted the Agent and it started (as the wake consumer does)."""
    change_shard(app, project_id, change_id).apply(
        Caller(TENANT, "system:wake", task_id),
        AdmitAgent(change_id=change_id, task_id=task_id, agent_id=AGENT),
    )
    app.lifecycle().callbacks.report(
        TENANT,
        project_id=project_id,
        change_id=change_id,
        command=StartTask(task_id=task_id, agent_id=AGENT),
    )


def fail_task(app: Rhumbatron, project_id: str, change_id: str, task_id: str) -> None:
    take_task(app, project_id, change_id, task_id)
    app.lifecycle().callbacks.report(
        TENANT,
        project_id=project_id,
        change_id=change_id,
        command=FailTask(task_id=task_id, agent_id=AGENT, reason="the build does not compile"),
    )


def verifying_change(
    app: Rhumbatron, project_id: str, request: str, files: Mapping[str, str]
) -> str:
    """A Change whose one Task proposed ``files`` and completed: ``verifying``."""
    change_id, task_id = open_change(app, project_id, request)
    take_task(app, project_id, change_id, task_id)
    callbacks = app.lifecycle().callbacks
    changeset_id = f"cs-{request}"
    callbacks.report(
        TENANT,
        project_id=project_id,
        change_id=change_id,
        command=ProposeChangeset(
            changeset_id=changeset_id,
            task_id=task_id,
            agent_id=AGENT,
            files=files,
            base_generation=app.lifecycle().world.canonical_generation(project_id),
        ),
    )
    callbacks.report(
        TENANT,
        project_id=project_id,
        change_id=change_id,
        command=CompleteTask(
            change_id=change_id, task_id=task_id, agent_id=AGENT, changeset_id=changeset_id
        ),
    )
    assert status_of(app, project_id, change_id) == "verifying"
    return change_id


def compose(
    app: Rhumbatron, project_id: str, change_id: str, *, fork: bool = True
) -> CandidateState:
    """Compose the Change's Candidate on the canonical base, with its fork file."""
    lifecycle = app.lifecycle()
    shard = change_shard(app, project_id, change_id)
    candidate = shard.apply(
        OPS,
        ComposeCandidate(
            change_id=change_id, base_generation=lifecycle.world.canonical_generation(project_id)
        ),
    )
    if fork:
        files = {
            p: c for cs in shard.changesets_of_candidate(candidate) for p, c in cs.files.items()
        }
        lifecycle.forks.write(project_id, candidate.candidate_id, files)
    return candidate


def verify(app: Rhumbatron, project_id: str, candidate: CandidateState) -> None:
    change_shard(app, project_id, candidate.change_id).apply(
        OPS,
        DecideCandidate(
            candidate_id=candidate.candidate_id,
            to=CandidateStatus.VERIFIED,
            reason="every check passed",
            change_to=ChangeStatus.AWAITING_APPROVAL,
        ),
    )


def promoted_change(
    app: Rhumbatron, project_id: str, request: str, *, fork: bool = True
) -> tuple[str, CandidateState]:
    """A Change whose verified Candidate an operator approved: canonical advanced, the Change
    ``releasing`` (its release not started: the router has not seen canonical.advanced)."""
    change_id = verifying_change(app, project_id, request, {f"src/{request}.py": "VALUE = 1\n"})
    candidate = compose(app, project_id, change_id, fork=fork)
    verify(app, project_id, candidate)
    app.lifecycle().requests.approve(OPS, project_id=project_id, change_id=change_id)
    return change_id, candidate


def cheaply_releasing_change(app: Rhumbatron, project_id: str, request: str) -> str:
    """A Change moved straight to ``releasing`` through its state machine (no Candidate)."""
    change_id, _ = open_change(app, project_id, request)
    shard = change_shard(app, project_id, change_id)
    for status in (ChangeStatus.VERIFYING, ChangeStatus.AWAITING_APPROVAL, ChangeStatus.RELEASING):
        shard.apply(OPS, MoveChange(change_id=change_id, to=status, reason="test setup"))
    return change_id


async def build_index(app: Rhumbatron, project_id: str) -> None:
    """``index.build`` through the indexing queue, as ``artifact.promoted`` queues it."""
    lifecycle = app.lifecycle()
    await lifecycle.sender.send(
        lifecycle_command(
            "index.build",
            f"cmd_index_build_{project_id}_setup",
            project_id=project_id,
            now=app.clock.now(),
            payload={"generation": None, "reason": "promotion"},
        )
    )
    await run_queue(app, "indexing")
    assert lifecycle.indexer.ready_generation(project_id) == 1


def status_of(app: Rhumbatron, project_id: str, change_id: str) -> str:
    change = app.lifecycle().requests.change(project_id, change_id)
    return change.status if change is not None else "missing"


def outbox_types(shard: ResourceShard) -> list[str]:
    return [str(r[0]) for r in shard.connection.execute("SELECT event_type FROM outbox")]


# -- tests -----------------------------------------------------------------------------------


async def test_a_quiet_open_change_is_settled_at_the_next_release_sweep_tick(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change requested at 03:14 and never touched again (7 hours old at 10:14)
    lifecycle = app.lifecycle()
    project = "acme-web"
    clock.set(at(3, 14))
    new_project(app, project)
    too_old, _ = open_change(app, project, "req-old")
    # AND at 10:04 one Change whose ready Task's wake was lost (the dispatcher never ran) and
    # one whose only Task failed (the router's change.settle for it was lost)
    clock.set(at(10, 4))
    lost_wake, lost_task = open_change(app, project, "req-lost-wake")
    failed, failed_task = open_change(app, project, "req-failed")
    fail_task(app, project, failed, failed_task)
    # AND, in another project, a Change whose Task an Agent holds and one whose Candidate is
    # being verified: both quiet since 10:04, and both can move on their own
    other = "acme-api"
    new_project(app, other)
    held, held_task = open_change(app, other, "req-held")
    take_task(app, other, held, held_task)
    verifying = verifying_change(app, other, "req-verifying", {"src/v.py": "V = 1\n"})
    compose(app, other, verifying)

    # WHEN the 10:12 tick runs (not a release-sweep minute)
    clock.set(at(10, 12))
    quiet_minute = await tick(app)

    # THEN it queues nothing
    assert quiet_minute["release_sweep"] is False
    assert housekeeping_sent(quiet_minute) == {}

    # GIVEN a Change requested at 10:13 (1 minute old at the tick)
    clock.set(at(10, 13))
    too_fresh, _ = open_change(app, project, "req-fresh")

    # WHEN the 10:14 release-sweep tick runs
    clock.set(at(10, 14))
    summary = await tick(app)

    # THEN change.settle went out for the two quiet Changes that cannot move on their own only
    assert summary["release_sweep"] is True
    assert housekeeping_sent(summary) == {"change.settle": 2}

    # WHEN the integration queue runs
    await run_queue(app, "integration")

    # THEN both settles were handled, and neither the too fresh nor the too old Change had one
    assert sorted(handled(lifecycle, "change.settle")) == sorted(
        f"cmd_settle_{change}_{minute_key(at(10, 14))}" for change in (lost_wake, failed)
    )
    # AND the Change whose Task failed is failed, with the Task's reason
    assert status_of(app, project, failed) == "failed"
    failed_change = lifecycle.requests.change(project, failed)
    assert failed_change is not None and "the build does not compile" in failed_change.reason
    # AND the others are still open
    assert [status_of(app, project, c) for c in (lost_wake, too_fresh, too_old)] == ["open"] * 3
    assert [status_of(app, other, c) for c in (held, verifying)] == ["open", "verifying"]

    # WHEN the agent-wakeups queue runs
    await run_queue(app, "agent-wakeups")

    # THEN the settle dispatched the lost wake and its Agent was admitted and started
    assert (ready_wake_id(lost_task), WakeOutcome.DELIVERED) in lifecycle.wake_consumer.outcomes
    task = change_shard(app, project, lost_wake).task_state(lost_task)
    assert task is not None and (task.status, task.agent_id) == (TaskStatus.RUNNING, AGENT)


async def test_a_change_quiet_exactly_three_minutes_at_a_release_sweep_tick_is_settled(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change requested at 10:11 whose ready Task's wake was lost, and one at 10:12
    project = "acme-web"
    clock.set(at(10, 0))
    new_project(app, project)
    clock.set(at(10, 11))
    quiet, _ = open_change(app, project, "req-three")
    clock.set(at(10, 12))
    open_change(app, project, "req-two")

    # WHEN the 10:14 release-sweep tick runs (quiet for exactly 3 minutes, and for 2)
    clock.set(at(10, 14))
    summary = await tick(app)

    # THEN the Change quiet for 3 minutes is settled; the one quiet for 2 is not yet
    assert summary["release_sweep"] is True
    assert housekeeping_sent(summary) == {"change.settle": 1}
    await run_queue(app, "integration")
    assert handled(app.lifecycle(), "change.settle") == [
        f"cmd_settle_{quiet}_{minute_key(at(10, 14))}"
    ]


async def test_a_change_quiet_exactly_six_hours_at_a_release_sweep_tick_is_settled(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change requested at 04:09 whose ready Task's wake was lost, and one at 04:08
    project = "acme-web"
    clock.set(at(4, 0))
    new_project(app, project)
    clock.set(at(4, 8))
    open_change(app, project, "req-older")
    clock.set(at(4, 9))
    six_hours, _ = open_change(app, project, "req-six")

    # WHEN the 10:09 release-sweep tick runs (quiet for exactly 6 hours, and for 6 h 1 min)
    clock.set(at(10, 9))
    summary = await tick(app)

    # THEN the window's end is inclusive too: the Change quiet for 6 hours is settled, the
    #   one quiet for longer is left to its operator (S0-113: 3 minutes to 6 hours)
    assert summary["release_sweep"] is True
    assert housekeeping_sent(summary) == {"change.settle": 1}
    await run_queue(app, "integration")
    assert handled(app.lifecycle(), "change.settle") == [
        f"cmd_settle_{six_hours}_{minute_key(at(10, 9))}"
    ]


async def test_the_release_sweep_closes_every_shard_file_it_opened_to_read(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN three projects with an open Change each, in a fresh process (nothing open)
    clock.set(at(10, 4))
    for number in range(3):
        new_project(app, f"acme-{number}")
        open_change(app, f"acme-{number}", f"req-{number}")
    await app.close()
    # WHEN the 10:14 release-sweep tick reads every shard of every project
    clock.set(at(10, 14))
    assert (await tick(app))["release_sweep"] is True
    # THEN it left none of them open: a warm sweep holds no file per shard it read (the
    #   clock project's, which the tick writes to, aside)
    shards = [ref for ref in app.actor_refs() if ref.shard is not None and "acme" in ref.key]
    assert len(shards) >= 3
    assert [ref.key for ref in shards if app.actors.is_open(ref)] == []


async def test_a_change_open_for_hours_is_quiet_from_its_last_task_move(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change requested at 03:00 whose Agent worked on its Task for hours and failed it
    # at 10:04 (the router's change.settle for the failure was lost)
    project = "acme-web"
    clock.set(at(3, 0))
    new_project(app, project)
    long_running, task_id = open_change(app, project, "req-long")
    take_task(app, project, long_running, task_id)
    clock.set(at(10, 4))
    app.lifecycle().callbacks.report(
        TENANT,
        project_id=project,
        change_id=long_running,
        command=FailTask(task_id=task_id, agent_id=AGENT, reason="gave up after hours"),
    )

    # WHEN the 10:14 release-sweep tick runs (the Change is 7 hours old, quiet for 10 minutes)
    clock.set(at(10, 14))
    summary = await tick(app)
    await run_queue(app, "integration")

    # THEN it was settled, and failed
    assert housekeeping_sent(summary) == {"change.settle": 1}
    assert status_of(app, project, long_running) == "failed"


def given_letter(app: Rhumbatron, project_id: str, change_id: str, command: Command) -> None:
    """The open dead letter of ``command`` (what the dead-letter consumer writes)."""
    with app.product().transaction() as db:
        record_command_dead_letter(
            db,
            command_id=command.command_id,
            command_type=command.command_type,
            queue="agent-wakeups",
            attempt=command.attempt,
            reason="boom",
            body=command.to_json().decode(),
            now_s=app.clock.now().timestamp(),
            tenant_id=TENANT,
            project_id=project_id,
            change_id=change_id,
            task_id=command.task_id,
        )


def blocked_by_dead_wake(app: Rhumbatron, project_id: str, change_id: str, task_id: str) -> None:
    """Task ``task_id`` blocked by the dead letter of its ready wake, the letter open (it
    waits for an operator's Retry)."""
    wake = ready_wake(
        project_id=project_id,
        change_id=change_id,
        task_id=task_id,
        agent_id=AGENT,
        now=app.clock.now(),
    )
    change_shard(app, project_id, change_id).apply(
        OPS, BlockTaskForDeadLetter(command=wake, reason="boom")
    )
    given_letter(app, project_id, change_id, wake)


def letter_states(app: Rhumbatron) -> dict[str | None, tuple[str, str | None]]:
    """``(status, resolution)`` of each Change's one letter."""
    return {
        letter.change_id: (letter.status, letter.resolution)
        for letter in list_dead_letters(app.product().connection, status=None)
    }


async def test_a_settle_supersedes_its_changes_letters_unless_a_task_waits_for_a_retry(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN at 10:04 a Change whose Task failed and a letter of one of its commands, and a
    # Change whose ready Task's wake was dead-lettered (the Task waits for an operator's Retry)
    project = "acme-web"
    clock.set(at(10, 4))
    new_project(app, project)
    failed, failed_task = open_change(app, project, "req-failed")
    fail_task(app, project, failed, failed_task)
    stale = lifecycle_command(
        "agent.wake",
        "cmd_failed_wake_again",
        project_id=project,
        change_id=failed,
        task_id=failed_task,
        now=clock.now(),
        payload={"agentId": AGENT, "reason": "task_ready"},
    )
    given_letter(app, project, failed, stale)
    blocked, blocked_task = open_change(app, project, "req-blocked")
    blocked_by_dead_wake(app, project, blocked, blocked_task)

    # WHEN the 10:14 release-sweep tick settles both and the integration queue runs
    clock.set(at(10, 14))
    summary = await tick(app)
    await run_queue(app, "integration")

    # THEN the settle of the failed Change superseded its letter
    assert housekeeping_sent(summary) == {"change.settle": 2}
    assert status_of(app, project, failed) == "failed"
    states = letter_states(app)
    assert states[failed] == ("closed", "superseded")
    # AND the letter whose Task waits for a Retry stays open, its Task still blocked
    assert states[blocked] == ("open", None)
    task = change_shard(app, project, blocked).task_state(blocked_task)
    assert task is not None and task.status is TaskStatus.BLOCKED


async def test_a_settle_that_fails_the_change_supersedes_the_letter_a_blocked_task_waited_on(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN at 10:04 a Change of two Tasks: one failed, the other blocked by the dead letter
    #   of its wake (it waited for an operator's Retry)
    project = "acme-web"
    clock.set(at(10, 4))
    new_project(app, project)
    created = app.lifecycle().requests.create_change(
        Caller(TENANT, "user:dana", "req-both"),
        project_id=project,
        client_request_id="req-both",
        title="req-both",
        tasks=[
            TaskPlan(task_id="fails", title="Fails", agent_id=AGENT, script="hold"),
            TaskPlan(task_id="waits", title="Waits", agent_id=AGENT, script="hold"),
        ],
    )
    change = created.change_id
    fail_task(app, project, change, qualified_task_id(change, "fails"))
    blocked_by_dead_wake(app, project, change, qualified_task_id(change, "waits"))

    # WHEN the 10:14 release-sweep tick settles it and the integration queue runs
    clock.set(at(10, 14))
    summary = await tick(app)
    await run_queue(app, "integration")

    # THEN the settle failed the Change: no Retry can move it now, so its letter is
    #   superseded, not left open for an operator
    assert housekeeping_sent(summary) == {"change.settle": 1}
    assert status_of(app, project, change) == "failed"
    assert letter_states(app)[change] == ("closed", "superseded")


async def test_the_release_sweep_tick_closes_the_letters_of_ended_changes_and_others_do_not(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN at 10:12 a completed Change with an open letter of one of its commands
    project = "acme-web"
    clock.set(at(10, 12))
    new_project(app, project)
    done = "chg-done"
    change_shard(app, project, done).apply(
        OPS, AppendChangeEvents(change_id=done, status="completed", facts=())
    )
    late = lifecycle_command(
        "change.settle",
        "cmd_settle_done",
        project_id=project,
        change_id=done,
        now=clock.now(),
        payload={"reason": "quiet"},
    )
    given_letter(app, project, done, late)

    # WHEN the 10:13 tick runs (not a release-sweep minute)
    clock.set(at(10, 13))
    quiet_minute = await tick(app)
    # THEN the letter stays open
    assert quiet_minute["release_sweep"] is False
    assert quiet_minute["letters_closed_as_ended"] == 0
    assert letter_states(app)[done] == ("open", None)

    # WHEN the 10:14 release-sweep tick runs
    clock.set(at(10, 14))
    summary = await tick(app)
    # THEN it closed the letter as ended
    assert summary["release_sweep"] is True
    assert summary["letters_closed_as_ended"] == 1
    assert letter_states(app)[done] == ("closed", "ended")


async def test_changes_still_releasing_45_minutes_after_promotion_are_recovered_ten_a_tick(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a project with a live app and, promoted at 11:00, two Changes: X (generation 1)
    # whose release never started, and Y (generation 2) whose release workflow failed — its
    # fork is missing — leaving the Change releasing
    lifecycle = app.lifecycle()
    project = "acme-shop"
    clock.set(at(11, 0))
    new_project(app, project, live_app="storefront")
    x, x_candidate = promoted_change(app, project, "req-x")
    y, _ = promoted_change(app, project, "req-y", fork=False)
    await lifecycle.integration.start_release(project, y, OPS)
    await run_queue(app, "release")
    y_release = release_id_for(project, 2)
    y_instance = await lifecycle.engine.describe("release", y_release)
    assert y_instance is not None and y_instance.status is WorkflowStatus.failed
    assert status_of(app, project, y) == "releasing"
    # AND, promoted at 11:01, twelve more Changes releasing without any release
    clock.set(at(11, 1))
    cheap = [cheaply_releasing_change(app, project, f"req-c{i:02d}") for i in range(12)]

    # WHEN the 11:44 tick runs (44 minutes after the first promotion)
    clock.set(at(11, 44))
    early = await tick(app)

    # THEN it recovers nothing yet
    assert early["release_sweep"] is True
    assert housekeeping_sent(early) == {}

    # WHEN the 11:49 tick runs and the integration and release queues run
    clock.set(at(11, 49))
    first = await tick(app)
    await run_queue(app, "integration")
    await run_queue(app, "release")

    # THEN ten release.recover went out, oldest promotion first: X, Y and eight of the twelve
    assert housekeeping_sent(first) == {"release.recover": 10}
    # AND X's release was started again, ran, and completed the Change on its own generation
    assert status_of(app, project, x) == "completed"
    x_release = change_shard(app, project, x).release(release_id_for(project, 1))
    assert x_release is not None and x_release.status is ReleaseStatus.COMPLETED
    assert x_release.candidate_id == x_candidate.candidate_id
    live = app.settings.state_dir / "apps" / project / "storefront" / "live.txt"
    assert live.read_text() == "1\n"
    # AND Y's failed workflow failed its release and its Change
    assert status_of(app, project, y) == "failed"
    y_row = change_shard(app, project, y).release(y_release)
    assert y_row is not None and y_row.status is ReleaseStatus.FAILED
    # AND eight of the twelve without a release completed (nothing of theirs to release)
    statuses = sorted(status_of(app, project, c) for c in cheap)
    assert statuses == ["completed"] * 8 + ["releasing"] * 4

    # WHEN the next release-sweep tick runs
    clock.set(at(11, 54))
    second = await tick(app)
    await run_queue(app, "integration")

    # THEN the four left were recovered
    assert housekeeping_sent(second) == {"release.recover": 4}
    assert [status_of(app, project, c) for c in cheap] == ["completed"] * 12


async def test_a_change_promoted_exactly_45_minutes_before_a_tick_is_recovered_at_it(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change that went releasing at 11:04
    project = "acme-shop"
    clock.set(at(11, 0))
    new_project(app, project)
    clock.set(at(11, 4))
    change = cheaply_releasing_change(app, project, "req-edge")

    # WHEN the 11:44 tick runs, 40 minutes after its promotion
    clock.set(at(11, 44))
    early = await tick(app)

    # THEN it is not recovered yet
    assert early["release_sweep"] is True
    assert housekeeping_sent(early) == {}

    # WHEN the 11:49 tick runs, exactly 45 minutes after its promotion
    clock.set(at(11, 49))
    edge = await tick(app)

    # THEN its release.recover goes out: it is still releasing 45 minutes after promotion
    #   (S0-111; the window's bound is included, as S0-113's are)
    assert housekeeping_sent(edge) == {"release.recover": 1}
    assert status_of(app, project, change) == "releasing"


async def test_after_canonical_advanced_only_candidates_on_an_earlier_base_go_stale(
    app: Rhumbatron,
) -> None:
    # GIVEN C awaiting approval with a verified Candidate on generation 0; then X approved
    #   (canonical advances to generation 1); then B awaiting approval with a verified
    #   Candidate already on generation 1
    project = "acme-web"
    new_project(app, project)
    earlier = verifying_change(app, project, "req-c", {"src/c.py": "C = 1\n"})
    earlier_candidate = compose(app, project, earlier)
    verify(app, project, earlier_candidate)
    promoted, promoted_candidate = promoted_change(app, project, "req-x")
    current = verifying_change(app, project, "req-b", {"src/b.py": "B = 1\n"})
    current_candidate = compose(app, project, current)
    assert (earlier_candidate.base_generation, current_candidate.base_generation) == (0, 1)
    verify(app, project, current_candidate)
    (advanced,) = [
        Event.parse(bytes(row[0]))
        for row in app.project_root(project).connection.execute(
            "SELECT envelope FROM outbox WHERE event_type = 'canonical.advanced'"
        )
    ]

    # WHEN the router routes canonical.advanced
    await app.lifecycle().routing.route([advanced])

    # THEN X's Candidate is promoted; C's went stale and C back to verifying; B's Candidate,
    #   on the new base, is still verified and B still awaits approval
    def candidate_of(change_id: str, candidate: CandidateState) -> str:
        state = change_shard(app, project, change_id).candidate(candidate.candidate_id)
        assert state is not None
        return state.status.value

    assert candidate_of(promoted, promoted_candidate) == "promoted"
    assert (candidate_of(earlier, earlier_candidate), status_of(app, project, earlier)) == (
        "stale",
        "verifying",
    )
    assert (candidate_of(current, current_candidate), status_of(app, project, current)) == (
        "verified",
        "awaiting_approval",
    )


async def queued_command_ids(app: Rhumbatron, queue: str) -> list[str]:
    """The IDs of the commands waiting on ``queue``, in queue order."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM)
    first, last = info.state.first_seq or 1, info.state.last_seq or 0
    ids = []
    for seq in range(first, last + 1):
        message = await js.get_msg(COMMAND_STREAM, seq)
        if message.subject == command_subject(queue):
            ids.append(Command.parse(message.data or b"").command_id)
    return ids


async def test_candidates_recompose_composes_each_stale_candidate_again_ten_a_delivery(
    app: Rhumbatron,
) -> None:
    # GIVEN eleven verifying Changes with a Candidate on generation 0, gone stale when X's
    #   promotion advanced canonical to generation 1
    project = "acme-web"
    new_project(app, project)
    stale: dict[str, CandidateState] = {}
    for n in range(11):
        change_id = verifying_change(app, project, f"req-s{n:02d}", {f"src/s{n}.py": "S = 1\n"})
        stale[change_id] = compose(app, project, change_id)
    promoted_change(app, project, "req-x")
    (advanced,) = [
        Event.parse(bytes(row[0]))
        for row in app.project_root(project).connection.execute(
            "SELECT envelope FROM outbox WHERE event_type = 'canonical.advanced'"
        )
    ]
    await app.lifecycle().routing.route([advanced])
    assert all(
        change_shard(app, project, c).candidate(s.candidate_id).status is CandidateStatus.STALE
        for c, s in stale.items()
    )
    recompose = lifecycle_command(
        "candidates.recompose",
        "cmd_recompose_test",
        project_id=project,
        now=app.clock.now(),
        payload={"generation": 1},
    )
    integration = app.lifecycle().integration

    # WHEN it is delivered a first time
    first = await integration.recompose_candidates(recompose, Delivery("integration", 1, 1, 4, {}))

    # THEN ten of the eleven are composed again on generation 1, and it asks for more
    assert isinstance(first, Retry)
    sent = await queued_command_ids(app, "verification")
    expected = {rebase_command_id(s.candidate_id, 1): c for c, s in stale.items()}
    assert len(sent) == len(set(sent)) == 10
    assert set(sent) <= set(expected)

    # WHEN verification composed those ten, and the command is delivered again
    for command_id in sent:
        compose(app, project, expected[command_id])
    second = await integration.recompose_candidates(recompose, Delivery("integration", 1, 2, 4, {}))

    # THEN the eleventh is composed again too, and it is done
    assert second is None
    assert sorted(await queued_command_ids(app, "verification")) == sorted(expected)


async def test_the_daily_tick_sweeps_forks_cleans_archived_projects_and_backfills_indexes(
    app: Rhumbatron, clock: ManualClock
) -> None:
    lifecycle = app.lifecycle()
    forks = lifecycle.forks
    clock.set(at(3, 0))
    # GIVEN an archived project with a live app, a promoted generation, its fork and an index
    archived = "acme-old"
    new_project(app, archived, live_app="storefront")
    promoted_change(app, archived, "req-archived")
    await build_index(app, archived)
    lifecycle.world.admin_shard(archived).apply(OPS, SetProjectStatus(to="archived", reason="done"))
    archived_index = lifecycle.indexer.project_index(archived).path
    assert archived_index.exists() and forks.forks(archived)
    # AND an active project with a promoted generation but no index, and forks of a promoted,
    # a rejected, a stale and a verified Candidate, and one whose Candidate is unknown
    active = "acme-web"
    new_project(app, active)
    stale_change = verifying_change(app, active, "req-stale", {"src/stale.py": "S = 1\n"})
    stale = compose(app, active, stale_change)  # on generation 0
    _, promoted = promoted_change(app, active, "req-promoted")
    change_shard(app, active, stale_change).apply(
        OPS,
        DecideCandidate(
            candidate_id=stale.candidate_id, to=CandidateStatus.STALE, reason="generation 1"
        ),
    )
    rejected_change = verifying_change(app, active, "req-rejected", {"src/bad.py": "def (\n"})
    rejected = compose(app, active, rejected_change)
    change_shard(app, active, rejected_change).apply(
        OPS,
        DecideCandidate(
            candidate_id=rejected.candidate_id,
            to=CandidateStatus.REJECTED,
            reason="src/bad.py:1: invalid syntax",
            change_to=ChangeStatus.FAILED,
        ),
    )
    verified_change = verifying_change(app, active, "req-verified", {"src/ok.py": "OK = 1\n"})
    verified = compose(app, active, verified_change)
    verify(app, active, verified)
    forks.write(active, "cand_unknown", {"src/lost.py": "LOST = 1\n"})
    assert lifecycle.indexer.ready_generation(active) is None

    # WHEN the 04:16 tick runs
    clock.set(at(4, 16))
    before = await tick(app)

    # THEN it queues nothing
    assert (before["maintenance"], housekeeping_sent(before)) == (False, {})

    # WHEN the 04:17 UTC tick runs, then the integration and indexing queues
    clock.set(at(4, 17))
    summary = await tick(app)
    await run_queue(app, "integration")
    await run_queue(app, "indexing")

    # THEN one forks.sweep, a cleanup and a purge for the archived project, and a backfill
    assert summary["maintenance"] is True
    assert housekeeping_sent(summary) == {
        "forks.sweep": 1,
        "project.cleanup": 1,
        "index.purge": 1,
        "index.build": 1,
    }
    # AND the forks of the rejected, stale and unknown Candidates are gone; the promoted and
    # the verified ones stay
    assert forks.forks(active) == sorted((active, c.candidate_id) for c in (promoted, verified))
    # AND the archived project's app was removed (app.removed), its forks and index are gone
    admin = lifecycle.world.admin_shard(archived)
    assert admin.live_apps() == []
    assert "app.removed" in outbox_types(admin)
    assert forks.forks(archived) == []
    assert not archived_index.exists()
    purged = lifecycle.indexer.status(archived)
    assert purged is not None and purged.status is IndexState.PURGED
    # AND the active project's index was backfilled
    assert lifecycle.indexer.ready_generation(active) == 1

    # WHEN the next day's 04:17 tick runs
    clock.set(at(4, 17, days=1))
    next_day = await tick(app)

    # THEN only the forks.sweep goes out: the archived project is clean, the index is ready
    assert housekeeping_sent(next_day) == {"forks.sweep": 1}


async def test_a_release_sweep_tick_purges_the_index_of_a_deleted_project(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a deleted project that still has its index, and a deleted one that never had one
    lifecycle = app.lifecycle()
    clock.set(at(9, 0))
    deleted = "acme-gone"
    new_project(app, deleted)
    promoted_change(app, deleted, "req-gone")
    await build_index(app, deleted)
    lifecycle.world.admin_shard(deleted).apply(OPS, SetProjectStatus(to="deleted", reason="closed"))
    never_indexed = "acme-never"
    new_project(app, never_indexed)
    lifecycle.world.admin_shard(never_indexed).apply(OPS, SetProjectStatus(to="deleted"))
    index_file = lifecycle.indexer.project_index(deleted).path
    assert index_file.exists()

    # WHEN the 09:04 release-sweep tick runs, then the indexing queue
    clock.set(at(9, 4))
    summary = await tick(app)
    await run_queue(app, "indexing")

    # THEN one index.purge went out and the index is gone
    assert housekeeping_sent(summary) == {"index.purge": 1}
    status = lifecycle.indexer.status(deleted)
    assert status is not None and status.status is IndexState.PURGED
    assert not index_file.exists()
    assert lifecycle.indexer.status(never_indexed) is None

    # WHEN the next release-sweep tick runs
    clock.set(at(9, 9))
    later = await tick(app)

    # THEN nothing is left to purge
    assert housekeeping_sent(later) == {}


async def test_a_retried_tick_sends_nothing_twice_and_the_summary_counts_it(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a Change releasing since 13:00 and a Change whose Task failed at 13:45
    lifecycle = app.lifecycle()
    project = "acme-web"
    clock.set(at(13, 0))
    new_project(app, project)
    releasing = cheaply_releasing_change(app, project, "req-releasing")
    clock.set(at(13, 45))
    failed, failed_task = open_change(app, project, "req-failed")
    fail_task(app, project, failed, failed_task)
    # AND the schedule's 13:49 invocation, as EventBridge Scheduler sends it
    scheduled = sweep.parse_invocation(
        {"source": "schedule", "job": "sweep", "scheduledTime": "2026-03-02T13:49:00Z"}
    ).scheduled_time
    assert scheduled == at(13, 49)

    # WHEN the tick runs, and Lambda retries it in the next minute
    clock.set(at(13, 49) + timedelta(seconds=5))
    first = await tick(app, at=scheduled)
    clock.advance(seconds=70)
    retried = await tick(app, at=scheduled)

    # THEN the first run sent one recover and one settle, the retry only duplicates
    sent = {"release.recover": 1, "change.settle": 1}
    assert first["housekeeping"] == {"sent": sent, "duplicates": {}, "failed": {}}
    assert retried["housekeeping"] == {"sent": {}, "duplicates": sent, "failed": {}}
    assert first["release_sweep"] is retried["release_sweep"] is True

    # WHEN the integration queue runs
    report = await run_queue(app, "integration")

    # THEN each command was there once, and did its work once
    assert report.done == 2
    assert handled(lifecycle, "change.settle") == [f"cmd_settle_{failed}_202603021349"]
    assert len(handled(lifecycle, "release.recover")) == 1
    assert status_of(app, project, releasing) == "completed"
    assert status_of(app, project, failed) == "failed"


async def test_the_daily_tick_prunes_the_causal_routers_bookkeeping_past_14_days(
    app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN the causal router's bookkeeping of a day 15 days before a daily tick, and of
    #   the day before it
    store = app.lifecycle().causal_store
    for days_before in (15, 1):
        moment = at(12, 0, days=-days_before)
        store.record_decision(
            StoredDecision(
                f"evt-{days_before}",
                "agent-1",
                "skip",
                0.1,
                "r",
                "model",
                "haiku",
                None,
                moment.timestamp(),
            )
        )
        assert store.admit_command(utc_day(moment), "chg-1", 1_000, command_id=f"cmd-{days_before}")
    # WHEN an ordinary tick runs, THEN it prunes nothing (the default sizing)
    clock.set(at(10, 12))
    assert (await tick(app))["causal_rows_pruned"] == 0
    # WHEN the 04:17 tick runs
    clock.set(at(4, 17, days=1))
    daily = await tick(app)
    # THEN the old day's decision, counter and admission are gone, the fresh day's kept
    assert daily["causal_rows_pruned"] == 3
    assert [d.event_id for d in store.decisions()] == ["evt-1"]


# -- the door, behind it (issue #19) ----------------------------------------------------------


async def test_a_command_whose_subject_is_missing_fails_on_its_queue_and_is_never_done(
    app: Rhumbatron,
) -> None:
    # GIVEN, sent by a producer inside the system (past POST /commands' check), app.provision
    #   for a project never provisioned and verification.start of a Candidate of a Change
    #   that do not exist
    lifecycle = app.lifecycle()
    new_project(app, "proj-door")
    now = app.clock.now()
    ghost_app = lifecycle_command(
        "app.provision",
        "cmd_app_ghost",
        project_id="proj-ghost",
        now=now,
        payload={"appName": "storefront"},
    )
    ghost_verify = lifecycle_command(
        "verification.start",
        "cmd_verify_ghost",
        project_id="proj-door",
        change_id="chg-none",
        now=now,
        payload={"candidateId": "cand-none"},
    )
    bus = await app.command_bus()
    for command in (ghost_app, ghost_verify):
        await bus.send("integration", command)

    # WHEN the integration queue runs until both are given up (4 deliveries each)
    queues = await app.queue_runtime()
    handler = lifecycle.handler("integration")
    done = dead_lettered = 0
    for _ in range(2_000):
        report = await queues.poll("integration", handler, max_fetches=1)
        done += report.done
        dead_lettered += report.dead_lettered
        if dead_lettered == 2:
            break
    # THEN both failed to the dead-letter queue and neither was done
    assert (dead_lettered, done) == (2, 0)
    # AND no app of the never-provisioned project, nor a verification workflow, was made
    world = lifecycle.world
    assert not world.project_exists("proj-ghost")
    ghost_admin = ResourceShard.ref_for(
        "proj-ghost", project_admin_key("proj-ghost"), app.settings.resource_shard_count
    )
    assert not ghost_admin.path(app.settings.state_dir).exists()
    assert handled(lifecycle, "app.provision") == handled(lifecycle, "verification.start") == []
