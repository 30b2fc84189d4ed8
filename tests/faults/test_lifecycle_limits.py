"""The Change lifecycle's limits, against a real nats-server, real SQLite actor files, moto
S3 and the in-process workflow engine (spec "Causal routing" and "Queues").

* the 8-agent limit per Change, and the dispatch again when a slot frees;
* the 1,000-command cap per Change per UTC day (set to 3 here), which counts
  ``change.dispatch``, ``candidate.create``, ``change.settle`` and ``agent.wake`` only;
* the 200-call Clef-flash cap (set to 1 here), past which a prefix overlap wakes unasked;
* the integration consumer's own limits (MAX_DELIVERIES = 4): a candidate.create waiting
  for a conflict review, a bounded command with more work, a throwing command.

The caps are settings whose defaults are the spec's numbers; the tests lower them to reach
them quickly. The fixtures and the round driver are the idempotency tests' (one module of
helpers would be a third file; these two share by import).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from rhumbatron.actors.shard_commands import AdmitAgent, CompleteTask, DeclareIntent, FailTask
from rhumbatron.causal.command_cap import DROPPED_METRIC
from rhumbatron.causal.store import CommandCount
from rhumbatron.core.clock import utc_day
from rhumbatron.domain.agents import Admission
from rhumbatron.domain.candidates import CandidateStatus
from rhumbatron.domain.changes import TaskPlan
from rhumbatron.domain.facts import Caller
from rhumbatron.lifecycle.commands import lifecycle_command, ready_wake_id
from rhumbatron.lifecycle.integration import FORKS_PER_DELIVERY
from rhumbatron.lifecycle.integration_core import BOUNDED_EXHAUSTED_METRIC
from rhumbatron.lifecycle.scripted_agent import ScriptLibrary
from rhumbatron.messaging.queue_consumer import CommandHandler, Delivery, Retry
from rhumbatron.metrics.platform_metrics import metric_counts
from rhumbatron.product.dead_letters import list_dead_letters
from rhumbatron.protocol.envelopes import Command
from rhumbatron.queues.wake_consumer import WakeOutcome
from rhumbatron.runtime.bootstrap import Rhumbatron

from . import test_lifecycle_idempotency as support
from .test_lifecycle_idempotency import (
    TENANT,
    USER,
    AppFactory,
    facts,
    provision,
    request_change,
    run_until,
    shard_of,
    status_of,
    stored_on,
    task_of,
    verified_change,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

# The idempotency module's fixtures, registered here under the same names.
nats_server = support.nats_server
make_app = support.make_app

PROJECT = "acme-shop"


def holding_tasks(count: int) -> list[TaskPlan]:
    """``count`` independent Tasks whose agents hold them once admitted (until they report)."""
    return [
        TaskPlan(f"tsk-{n:02d}", f"Task {n}", f"builder-{n:02d}", script="hold")
        for n in range(count)
    ]


def tasks_by_status(app: Rhumbatron, change_id: str) -> dict[str, list[str]]:
    """The Change's Task IDs (unqualified) by status."""
    found: dict[str, list[str]] = {}
    for task in shard_of(app, PROJECT, change_id).tasks_of_change(change_id):
        found.setdefault(task.status.value, []).append(task.task_id.split(".", 1)[1])
    return found


def active(app: Rhumbatron, change_id: str) -> int:
    tasks = shard_of(app, PROJECT, change_id).tasks_of_change(change_id)
    return sum(t.active for t in tasks)


async def quiet(app: Rhumbatron) -> None:
    """Run rounds until nothing moves (a few quiet rounds in a row)."""
    assert await run_until(app, lambda: False, max_idle_rounds=3) is False


def report_completed(app: Rhumbatron, change_id: str, task: str, agent: str) -> None:
    """The agent holding ``task`` reports it completed (as it does through the API)."""
    app.lifecycle().callbacks.report(
        TENANT,
        project_id=PROJECT,
        change_id=change_id,
        command=CompleteTask(
            change_id=change_id,
            task_id=task_of(change_id, task),
            agent_id=agent,
            changeset_id=None,
        ),
    )


# --------------------------------------------------------------------------- 8 agents


async def test_ten_ready_tasks_admit_eight_agents_and_a_freed_slot_admits_the_ninth(
    make_app: AppFactory,
) -> None:
    # GIVEN a Change of ten independent Tasks, all ready at once
    app = make_app()
    await app.ensure_streams()
    assert app.settings.max_active_agents_per_change == 8  # the spec's default
    provision(app, PROJECT)
    change_id = request_change(app, PROJECT, holding_tasks(10))

    # WHEN the lifecycle runs until nothing moves
    await quiet(app)

    # THEN eight agents hold eight Tasks, and the other two wait, ready
    by_status = tasks_by_status(app, change_id)
    assert active(app, change_id) == 8
    assert by_status["ready"] == ["tsk-08", "tsk-09"]
    outcomes = app.lifecycle().wake_consumer.outcomes
    assert [o for _, o in outcomes] == [WakeOutcome.DELIVERED] * 8

    # WHEN one agent completes its Task (task.completed frees its slot)
    report_completed(app, change_id, "tsk-03", "builder-03")
    await quiet(app)

    # THEN the router dispatched the Change again and the ninth Task was admitted: eight
    # agents again, one Task still waiting
    completed = [r for r in app.lifecycle().routed if r.rule == "task.completed" and r.sent]
    assert len(completed) == 1 and completed[0].sent[0].endswith("_dispatch")
    by_status = tasks_by_status(app, change_id)
    assert active(app, change_id) == 8
    assert by_status["completed"] == ["tsk-03"]
    assert by_status["ready"] == ["tsk-09"]
    assert "tsk-08" in by_status["running"]


@dataclass
class WakeDeliveries:
    """Wraps the wake consumer and records each delivery: the command, the JetStream message
    ID it came under (``Nats-Msg-Id``) and how often that message was delivered."""

    handler: CommandHandler
    seen: list[tuple[str, str, int]] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        message_id = delivery.headers.get("Nats-Msg-Id", "")
        self.seen.append((command.command_id, message_id, delivery.delivered))
        return await self.handler(command, delivery)

    def of(self, command_id: str) -> list[tuple[str, int]]:
        return [(m, n) for c, m, n in self.seen if c == command_id]


async def test_a_wake_turned_away_at_the_agent_limit_is_sent_again_when_a_slot_frees(
    make_app: AppFactory,
) -> None:
    # GIVEN a limit of two agents per Change and a Change of three ready Tasks, whose dispatch
    # sent wakes for the first two (the two free slots), not consumed yet ...
    app = make_app(max_active_agents_per_change=2)
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    provision(app, PROJECT)
    change_id = request_change(app, PROJECT, holding_tasks(3))
    assert await run_until(
        app,
        lambda: any(h.command_type == "change.dispatch" for h in lifecycle.integration.handled),
        skip=("agent-wakeups",),
    )
    assert await stored_on(app, "agent-wakeups") == 2
    # ... and meanwhile the third Task's agent admitted by another process (the race the
    # wake consumer's admission loses: both read a free slot)
    third = task_of(change_id, "tsk-02")
    other = Caller(TENANT, "agent:builder-02", ready_wake_id(third))
    admitted = shard_of(app, PROJECT, change_id).apply(
        other, AdmitAgent(change_id=change_id, task_id=third, agent_id="builder-02", limit=2)
    )
    assert admitted is Admission.ADMITTED
    wakes = WakeDeliveries(lifecycle.handler("agent-wakeups"))

    def wrap(queue: str, handler: CommandHandler) -> CommandHandler:
        return wakes if queue == "agent-wakeups" else handler

    # WHEN the wakes are consumed
    assert await run_until(app, lambda: False, wrap=wrap, max_idle_rounds=3) is False

    # THEN the first Task's agent took the last slot, and the second Task's wake was turned
    # away at the limit: the Task waits, ready
    first, second = (ready_wake_id(task_of(change_id, t)) for t in ("tsk-00", "tsk-01"))
    assert lifecycle.wake_consumer.outcomes == [
        (first, WakeOutcome.DELIVERED),
        (second, WakeOutcome.AT_LIMIT),
    ]
    assert tasks_by_status(app, change_id) == {
        "running": ["tsk-00"],
        "ready": ["tsk-01"],
        "assigned": ["tsk-02"],
    }

    # WHEN the first Task's agent completes it (its slot frees)
    report_completed(app, change_id, "tsk-00", "builder-00")
    assert await run_until(app, lambda: False, wrap=wrap, max_idle_rounds=3) is False

    # THEN the router dispatched again, and the turned-away wake was sent again as a new
    # message (its send round grew with the freed slot, so JetStream did not drop it as a
    # duplicate of the first): its agent was admitted
    assert lifecycle.wake_consumer.outcomes[2:] == [(second, WakeOutcome.DELIVERED)]
    assert wakes.of(second) == [(f"agent-wakeups:{second}", 1), (f"agent-wakeups:{second}:2", 1)]
    assert tasks_by_status(app, change_id) == {
        "completed": ["tsk-00"],
        "running": ["tsk-01"],
        "assigned": ["tsk-02"],
    }
    assert active(app, change_id) == 2
    assert facts(app, PROJECT)["task.assigned"] == 3


# --------------------------------------------------------------------------- command cap


def dropped_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The command cap's ERROR lines, one per dropped command."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rhumbatron.causal.command_cap" and r.levelno == logging.ERROR
    ]


async def test_the_command_cap_drops_counted_commands_past_it_and_never_counts_index_build_or_recompose(  # noqa: E501
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a cap of 3 counted commands per Change per UTC day, and a verified one-Task
    # Change whose change.dispatch, agent.wake and candidate.create were exactly its 3
    app = make_app(change_command_cap_per_day=3)
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    day = utc_day(app.clock.now())
    verified, _ = await verified_change(app, PROJECT)
    assert lifecycle.cap.count(verified, day) == CommandCount(admitted=3, dropped=0)
    assert dropped_lines(caplog) == []

    # WHEN a second Change of three ready Tasks runs until nothing moves
    change_id = request_change(app, PROJECT, holding_tasks(3), request="req-2")
    await quiet(app)

    # THEN its first 3 counted commands went out — the dispatch and two wakes — and the
    # third wake was dropped: logged as an error naming the Change, and counted
    assert lifecycle.cap.count(change_id, day) == CommandCount(admitted=3, dropped=1)
    third = ready_wake_id(task_of(change_id, "tsk-02"))
    assert dropped_lines(caplog) == [
        f"dropped agent.wake command {third} of Change {change_id}: the cap of 3 commands per "
        f"Change per UTC day is reached for {day}; the Change is likely looping, inspect its "
        "events"
    ]
    assert tasks_by_status(app, change_id) == {"running": ["tsk-00", "tsk-01"], "ready": ["tsk-02"]}

    # WHEN the verified Change is approved: canonical advances, which wakes the second
    # Change's two active agents, recomposes stale Candidates and builds the index
    lifecycle.requests.approve(USER, project_id=PROJECT, change_id=verified)
    assert await run_until(
        app,
        lambda: (
            status_of(app, PROJECT, verified) == "completed"
            and lifecycle.indexer.ready_generation(PROJECT) == 1
            and any(h.command_type == "candidates.recompose" for h in lifecycle.integration.handled)
        ),
    )

    # THEN both wakes were dropped (they count against the second Change), while
    # candidates.recompose and index.build went out uncounted and ran
    (advanced,) = [r for r in lifecycle.routed if r.rule == "canonical.advanced"]
    assert advanced.dropped_by_cap == tuple(
        f"cmd_{advanced.event_id}_{task_of(change_id, t)}" for t in ("tsk-00", "tsk-01")
    )
    assert set(advanced.sent + advanced.duplicates) == {
        f"cmd_{advanced.event_id}_recompose",
        f"cmd_index_{PROJECT}_1",
    }
    assert lifecycle.cap.count(change_id, day) == CommandCount(admitted=3, dropped=3)
    assert lifecycle.cap.count(verified, day) == CommandCount(admitted=3, dropped=0)

    # WHEN one of the second Change's agents reports its Task failed
    lifecycle.callbacks.report(
        TENANT,
        project_id=PROJECT,
        change_id=change_id,
        command=FailTask(
            task_id=task_of(change_id, "tsk-00"), agent_id="builder-00", reason="cannot build"
        ),
    )
    await quiet(app)

    # THEN the change.settle it causes is dropped too: the Change stays open
    (failed,) = [r for r in lifecycle.routed if r.rule == "task.failed"]
    assert (failed.sent, failed.dropped_by_cap) == ((), (f"cmd_{failed.event_id}_settle",))
    assert status_of(app, PROJECT, change_id) == "open"
    # ... four drops in all, each an error line and a commands_dropped_by_cap data point
    assert lifecycle.cap.count(change_id, day) == CommandCount(admitted=3, dropped=4)
    assert len(dropped_lines(caplog)) == 4
    assert all(f"of Change {change_id}:" in line for line in dropped_lines(caplog))
    assert metric_counts(app.product().connection)[DROPPED_METRIC] == 4


# --------------------------------------------------------------------------- Clef-flash cap


@dataclass
class SkippingModel:
    """Answers POST /v1/messages like the Messages API: the forced ``decide_wake`` tool call
    saying skip, sure of it. Keeps every request it received."""

    requests: list[httpx2.Request] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        body: dict[str, Any] = {
            "id": f"msg_{len(self.requests):04d}",
            "type": "message",
            "role": "assistant",
            "model": json.loads(request.content)["model"],
            "content": [
                {
                    "type": "tool_use",
                    "id": f"toolu_{len(self.requests):04d}",
                    "name": "decide_wake",
                    "input": {"decision": "skip", "probability": 0.95, "reason": "unrelated"},
                }
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 30},
        }
        return httpx2.Response(200, json=body, headers={"request-id": f"req_{len(self.requests)}"})


async def test_past_the_clef_flash_cap_a_prefix_overlap_wakes_without_asking(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a Clef-flash cap of 1 call a day, a model that says skip, and an agent running a
    # Task with an intent on src/checkout/ (its script waits for a wake, then completes)
    app = make_app(clef_flash_max_calls_per_day=1, clef_flash_api_key="test-key")
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    model = SkippingModel()
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(model))
    lifecycle.clef_flash_http = http
    lifecycle.scripts = ScriptLibrary.from_mapping(
        {
            "checkout": [
                {"do": "declare_intent", "paths": ["src/checkout/"]},
                {"do": "wait"},
                {"do": "complete"},
            ]
        }
    )
    provision(app, PROJECT)
    change_id = request_change(
        app, PROJECT, [TaskPlan("tsk-checkout", "Checkout", "builder-a", script="checkout")]
    )
    task_id = task_of(change_id, "tsk-checkout")
    await quiet(app)
    assert tasks_by_status(app, change_id) == {"running": ["tsk-checkout"]}

    def intent_of_other_agent(number: int, path: str) -> None:
        lifecycle.callbacks.report(
            TENANT,
            project_id=PROJECT,
            change_id=change_id,
            command=DeclareIntent(
                agent_id="builder-b",
                intent_id=f"int-b-{number}",
                paths=(path,),
                change_id=change_id,
            ),
        )

    def asked() -> list[tuple[tuple[str, str], ...]]:
        return [r.clef_flash for r in lifecycle.routed if r.clef_flash]

    # WHEN another agent declares an intent on src/checkout/a.py (a prefix overlap)
    intent_of_other_agent(1, "src/checkout/a.py")
    assert await run_until(app, lambda: len(asked()) == 1)
    await quiet(app)

    # THEN Clef-flash asked the model (its one call of the day), which said skip: no wake
    assert len(model.requests) == 1
    assert asked() == [(("builder-a", "skip"),)]
    assert lifecycle.wake_consumer.outcomes == [(ready_wake_id(task_id), WakeOutcome.DELIVERED)]
    assert tasks_by_status(app, change_id) == {"running": ["tsk-checkout"]}

    # WHEN it declares another on src/checkout/b.py
    intent_of_other_agent(2, "src/checkout/b.py")
    assert await run_until(app, lambda: len(asked()) == 2)
    await quiet(app)

    # THEN the cap is reached: no model call, and the agent was woken without asking — it
    # played the rest of its script and completed its Task
    assert len(model.requests) == 1
    assert asked()[1] == (("builder-a", "wake"),)
    decisions = [(d.source, d.verdict) for d in lifecycle.causal_store.decisions()]
    assert decisions == [("model", "skip"), ("cap_reached", "wake")]
    (woken,) = [r for r in lifecycle.routed if r.clef_flash == (("builder-a", "wake"),)]
    assert lifecycle.wake_consumer.outcomes[1] == (
        f"cmd_{woken.event_id}_{task_id}",
        WakeOutcome.DELIVERED,
    )
    assert tasks_by_status(app, change_id) == {"completed": ["tsk-checkout"]}
    assert "Clef-flash cap of 1 calls per UTC day reached" in caplog.text
    await http.aclose()


# --------------------------------------------------------------------------- integration consumer


@dataclass
class Deliveries:
    """Wraps a queue's real handler and records each delivery's number and outcome, and the
    delay each retry asked for."""

    handler: CommandHandler
    seen: list[tuple[str, int, str]] = field(default_factory=list)
    delays: list[tuple[str, float]] = field(default_factory=list)

    async def __call__(self, command: Command, delivery: Delivery) -> Retry | None:
        try:
            outcome = await self.handler(command, delivery)
        except Exception as exc:
            self.seen.append((command.command_id, delivery.delivered, type(exc).__name__))
            raise
        done = "retry" if outcome is not None else "done"
        self.seen.append((command.command_id, delivery.delivered, done))
        if outcome is not None:
            self.delays.append((command.command_id, outcome.delay_s))
        return outcome

    def of(self, command_id: str) -> list[tuple[int, str]]:
        return [(n, outcome) for c, n, outcome in self.seen if c == command_id]

    def delays_of(self, command_id: str) -> list[float]:
        return [delay for c, delay in self.delays if c == command_id]


def watch(queue: str) -> tuple[support.Wrap, list[Deliveries]]:
    made: list[Deliveries] = []

    def wrap(name: str, handler: CommandHandler) -> CommandHandler:
        if name != queue:
            return handler
        if not made:
            made.append(Deliveries(handler))
        return made[0]

    return wrap, made


async def test_a_candidate_waiting_for_a_conflict_review_asks_again_and_composes_on_its_4th(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN two Changes whose work touches the same file, and verification not running, so
    # the first Candidate stays created (its conflict review never ends); a conflict review
    # delay of its own (the spec's 45 s, lowered; the more-work delay differs)
    app = make_app(integration_more_work_delay_s=0.06, conflict_review_delay_s=0.07)
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    lifecycle.scripts = ScriptLibrary.from_mapping(
        {
            name: [
                {"do": "propose_changeset", "files": {"src/shared.py": f"OWNER = {name!r}\n"}},
                {"do": "complete"},
            ]
            for name in ("first", "second")
        }
    )
    provision(app, PROJECT)
    first = request_change(
        app, PROJECT, [TaskPlan("tsk-1", "One", "builder-a", script="first")], request="r1"
    )
    second = request_change(
        app, PROJECT, [TaskPlan("tsk-2", "Two", "builder-b", script="second")], request="r2"
    )
    wrap, watched = watch("integration")

    def both_composed() -> bool:
        return all(shard_of(app, PROJECT, c).candidates(change_id=c) for c in (first, second))

    # WHEN both are composed
    assert await run_until(app, both_composed, wrap=wrap, skip=("verification",))

    # THEN one candidate.create composed at once; the other found the first's Candidate
    # created on a shared path, asked for another delivery three times, and composed anyway
    # on its 4th and last
    creates = sorted(
        {c for c, _, _ in watched[0].seen if c.endswith("_candidate")},
        key=lambda c: len(watched[0].of(c)),
    )
    assert [watched[0].of(c) for c in creates] == [
        [(1, "done")],
        [(1, "retry"), (2, "retry"), (3, "retry"), (4, "done")],
    ]
    assert watched[0].delays_of(creates[1]) == [0.07] * 3
    assert "composes anyway on its last delivery" in caplog.text
    statuses = [
        [c.status for c in shard_of(app, PROJECT, change).candidates(change_id=change)]
        for change in (first, second)
    ]
    assert statuses == [[CandidateStatus.CREATED], [CandidateStatus.CREATED]]

    # WHEN verification runs
    assert await run_until(
        app,
        lambda: {status_of(app, PROJECT, c) for c in (first, second)} == {"awaiting_approval"},
    )
    # THEN both Candidates were verified once each
    assert facts(app, PROJECT)["candidate.verified"] == 2


async def test_a_bounded_forks_sweep_with_more_work_asks_again_and_is_acked_on_its_4th(
    make_app: AppFactory,
) -> None:
    # GIVEN more abandoned forks (their Candidates are gone) than four deliveries delete, and
    # a more-work delay of its own (the spec's 10 s, lowered; the conflict review's differs)
    app = make_app(integration_more_work_delay_s=0.06, conflict_review_delay_s=0.07)
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    forks = 4 * FORKS_PER_DELIVERY + 1
    for n in range(forks):
        lifecycle.forks.write(PROJECT, f"cand_{n:032x}", {"a.py": "A = 1\n"})
    wrap, watched = watch("integration")

    # WHEN one forks.sweep runs
    sweep = lifecycle_command(
        "forks.sweep", "cmd_sweep_1", project_id=PROJECT, now=app.clock.now(), payload={}
    )
    await lifecycle.sender.send(sweep)
    assert await run_until(
        app, lambda: len(watched[0].of("cmd_sweep_1")) == 4 if watched else False, wrap=wrap
    )
    await quiet(app)

    # THEN each delivery deleted its bound and asked for another after the more-work delay;
    # the 4th was acknowledged with work left, counted as bounded_command_exhausted
    assert watched[0].of("cmd_sweep_1") == [(1, "retry"), (2, "retry"), (3, "retry"), (4, "done")]
    assert watched[0].delays_of("cmd_sweep_1") == [0.06] * 3
    assert len(lifecycle.forks.forks(PROJECT)) == forks - 4 * FORKS_PER_DELIVERY
    assert metric_counts(app.product().connection)[BOUNDED_EXHAUSTED_METRIC] == 1
    assert await stored_on(app, "integration") == 0
    assert list_dead_letters(app.product().connection, status=None) == []


async def test_a_throwing_command_retries_three_times_then_goes_to_the_dead_letter_queue(
    make_app: AppFactory,
) -> None:
    # GIVEN a project whose app cannot be provisioned (the local provisioner fails every
    # attempt below 9)
    app = make_app()
    await app.ensure_streams()
    lifecycle = app.lifecycle()
    lifecycle.failing_apps = {"storefront": 9}
    provision(app, PROJECT, app_name=None)
    wrap, watched = watch("integration")

    # WHEN app.provision is sent
    command = lifecycle_command(
        "app.provision",
        "cmd_app_storefront",
        project_id=PROJECT,
        now=app.clock.now(),
        payload={"appName": "storefront"},
    )
    await lifecycle.sender.send(command)
    letters = app.product().connection
    assert await run_until(app, lambda: list_dead_letters(letters) != [], wrap=wrap)

    # THEN its four deliveries threw (the first and three retries), and after the last it
    # went to the dead-letter queue, whose consumer recorded it
    assert watched[0].of("cmd_app_storefront") == [
        (n, "AppProvisioningError") for n in (1, 2, 3, 4)
    ]
    (letter,) = list_dead_letters(letters)
    assert (letter.command_id, letter.queue, letter.attempt) == (
        "cmd_app_storefront",
        "integration",
        1,
    )
    assert "after 4 deliveries" in letter.reason and "AppProvisioningError" in letter.reason
    assert await stored_on(app, "integration") == 0
    assert lifecycle.world.admin_shard(PROJECT).live_apps() == []
