"""The causal router's deterministic rules (spec "Causal routing" flowchart and notes) and the
resource overlap they rest on."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from rhumbatron.causal.overlap import Overlap, classify_overlap
from rhumbatron.causal.rules import RESOURCE_EVENTS, ActiveAgent, RoutingWorld, acts_on, plan_for
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.event_types import EVENT_TYPES
from unit.test_catalogues import ROUTED_BY_A_CAUSAL_RULE
from unit.test_envelopes import RESOURCE_EVENTS as SPEC_RESOURCE_EVENTS

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
SYSTEM = Caller("acme", "system:test", correlation_id="corr-rules")


@dataclass
class World:
    """A world of fixed answers: the rules only read it."""

    agents: list[ActiveAgent] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)
    at_limit: set[str] = field(default_factory=set)

    def active_agents(self, project_id: str) -> list[ActiveAgent]:
        return self.agents

    def has_ready_tasks(self, project_id: str, change_id: str) -> bool:
        return change_id in self.ready

    def waits_at_agent_limit(self, project_id: str, change_id: str) -> bool:
        return change_id in self.at_limit


def fact(
    event_type: str, payload: dict[str, object], *, by: Caller = SYSTEM, **kw: object
) -> Event:
    return FactContext(by, "acme-web", NOW).fact(event_type, payload, **kw)  # type: ignore[arg-type]


def kinds(world: RoutingWorld, event: Event) -> list[tuple[str, str]]:
    plan = plan_for(event, world, now=NOW)
    return [(p.command.command_type, p.command.command_id) for p in plan.commands]


# -- overlap ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "held", "expected"),
    [
        ("src/app.py", ["src/app.py"], Overlap.EXACT),
        ("file:src/app.py", ["./src//app.py"], Overlap.EXACT),
        ("src/", ["src/app.py"], Overlap.PREFIX),
        ("src/auth/login.py", ["src/auth"], Overlap.PREFIX),
        ("src/app", ["src/application.py"], Overlap.NONE),
        ("docs/readme.md", ["src/app.py"], Overlap.NONE),
        ("src/app.py", ["docs/", "src/app.py", "src/"], Overlap.EXACT),
        ("src/app.py", [], Overlap.NONE),
        # a path with no folder is a resource of one segment, not an empty one
        ("README.md", ["README.md"], Overlap.EXACT),
        # only a colon before the first slash starts a scheme
        ("file:src/a:b.py", ["src/a:b.py"], Overlap.EXACT),
        ("src/a:b.py", ["b.py"], Overlap.NONE),
        # a resource with no segment overlaps nothing, not everything
        (".", ["src/app.py"], Overlap.NONE),
        ("src/app.py", ["./"], Overlap.NONE),
    ],
)
def test_overlap_is_exact_by_prefix_at_a_segment_boundary_or_none(
    resource: str, held: list[str], expected: Overlap
) -> None:
    assert classify_overlap(resource, held) is expected


# -- the flowchart ---------------------------------------------------------------------------


def test_task_ready_is_ignored_because_the_dispatcher_already_woke() -> None:
    event = fact("task.ready", {}, change_id="c1", task_id="t1")
    plan = plan_for(event, World(ready={"c1"}), now=NOW)
    assert (plan.commands, plan.questions, plan.effects) == ([], [], [])


def test_an_informational_type_takes_no_action() -> None:
    event = fact(
        "change.created", {"title": "t", "clientRequestId": "r", "requestedBy": "u"}, change_id="c1"
    )
    assert plan_for(event, World(), now=NOW).commands == []


def test_a_planned_change_is_dispatched_so_its_first_ready_tasks_get_their_wakes() -> None:
    # GIVEN the fact that a Change's work graph was planned (its first Tasks are ready)
    event = fact("change.planned", {"taskIds": ["t1", "t2"]}, change_id="c1")
    # THEN the router asks the integration module to dispatch it, once per fact
    assert kinds(World(), event) == [("change.dispatch", f"cmd_{event.event_id}_dispatch")]


def test_task_completed_dispatches_newly_ready_tasks_once() -> None:
    event = fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id="t1")
    assert kinds(World(ready={"c1"}), event) == [
        ("change.dispatch", f"cmd_{event.event_id}_dispatch")
    ]
    assert kinds(World(), event) == []


def test_a_freed_slot_dispatches_again_when_a_ready_task_waits_at_the_limit() -> None:
    completed = fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id="t1")
    failed = fact("task.failed", {"reason": "tests red"}, change_id="c1", task_id="t2")
    world = World(at_limit={"c1"})
    assert [k for k, _ in kinds(world, completed)] == ["change.dispatch"]
    assert [k for k, _ in kinds(world, failed)] == ["change.settle", "change.dispatch"]


def test_task_failed_settles_the_change() -> None:
    event = fact("task.failed", {"reason": "tests red"}, change_id="c1", task_id="t2")
    plan = plan_for(event, World(), now=NOW)
    (settle,) = plan.commands
    assert settle.command.command_type == "change.settle"
    assert settle.queue == "integration"
    assert "tests red" in settle.command.payload.model_dump()["reason"]


def test_a_completed_work_graph_creates_a_candidate() -> None:
    started = fact("verification.started", {"reason": "work_graph_completed"}, change_id="c1")
    manual = fact("verification.started", {"reason": "manual"}, change_id="c1", key="m")
    assert kinds(World(), started) == [("candidate.create", f"cmd_{started.event_id}_candidate")]
    assert kinds(World(), manual) == []


def test_canonical_advanced_wakes_active_agents_recomposes_and_builds_the_index() -> None:
    agents = [ActiveAgent("a1", "c1", "t1"), ActiveAgent("a2", "c2", "t9")]
    event = fact(
        "canonical.advanced",
        {"generation": 4, "previousGeneration": 3, "candidateId": "cand-1", "changeIds": ["c1"]},
    )
    plan = plan_for(event, World(agents=agents), now=NOW)
    assert [(c.command.command_type, c.command.command_id) for c in plan.commands] == [
        ("agent.wake", f"cmd_{event.event_id}_t1"),
        ("agent.wake", f"cmd_{event.event_id}_t9"),
        ("candidates.recompose", f"cmd_{event.event_id}_recompose"),
        ("index.build", "cmd_index_acme-web_4"),
    ]
    # the promoted Candidate, and every other open one on an earlier base, are the
    # lifecycle's to mark; the cap counts the wakes, not the recompose nor the index build
    (effect,) = plan.effects
    assert effect.detail["promoted_candidate_id"] == "cand-1"
    assert [c.capped for c in plan.commands] == [True, True, False, False]


def test_artifact_promoted_and_canonical_advanced_ask_for_one_index_build() -> None:
    promoted = fact(
        "artifact.promoted", {"artifactId": "art-1", "candidateId": "cand-1", "generation": 4}
    )
    advanced = fact(
        "canonical.advanced", {"generation": 4, "previousGeneration": 3, "candidateId": "cand-1"}
    )
    ids = {
        c.command.command_id
        for e in (promoted, advanced)
        for c in plan_for(e, World(), now=NOW).commands
        if c.command.command_type == "index.build"
    }
    assert ids == {"cmd_index_acme-web_4"}  # JetStream drops the second send


def test_a_resource_event_wakes_on_exact_asks_clef_flash_on_prefix_and_ignores_the_rest() -> None:
    agents = [
        ActiveAgent("exact", "c1", "t1", ("src/app.py",)),
        ActiveAgent("prefix", "c1", "t2", ("src/",)),
        ActiveAgent("elsewhere", "c2", "t3", ("docs/",)),
    ]
    author = Caller("acme", "agent:writer", correlation_id="corr-rules")
    event = fact(
        "intent.declared",
        {"intentId": "i1", "agentId": "writer", "paths": ["src/app.py"]},
        by=author,
        resource="src/app.py",
    )
    plan = plan_for(event, World(agents=agents), now=NOW)
    assert [(c.command.command_type, c.command.task_id) for c in plan.commands] == [
        ("agent.wake", "t1")
    ]
    assert [q.agent.agent_id for q in plan.questions] == ["prefix"]


def test_an_exact_overlap_wakes_without_asking_clef_flash_though_a_prefix_is_held_first() -> None:
    # GIVEN an Agent holding a folder (a prefix overlap) before the file itself (exact)
    agents = [ActiveAgent("both", "c1", "t1", ("src/", "src/app.py"))]
    event = fact("claim.released", {"claimId": "k1", "agentId": "other"}, resource="src/app.py")
    # WHEN the rules plan the Event
    plan = plan_for(event, World(agents=agents), now=NOW)
    # THEN the deterministic rule decides: a wake, and no Clef-flash question
    assert [(c.command.command_type, c.command.task_id) for c in plan.commands] == [
        ("agent.wake", "t1")
    ]
    assert plan.questions == []


def test_an_agent_never_wakes_on_its_own_resource_event() -> None:
    me = ActiveAgent("writer", "c1", "t1", ("src/app.py",))
    author = Caller("acme", "agent:writer", correlation_id="corr-rules")
    event = fact(
        "changeset.proposed",
        {"changesetId": "cs1", "agentId": "writer", "paths": ["src/app.py"], "baseGeneration": 1},
        by=author,
        resource="src/app.py",
    )
    plan = plan_for(event, World(agents=[me]), now=NOW)
    assert (plan.commands, plan.questions) == ([], [])


def test_planning_the_same_event_twice_gives_the_same_command_ids() -> None:
    agents = [ActiveAgent("a1", "c1", "t1", ("src/app.py",))]
    event = fact("claim.released", {"claimId": "k1", "agentId": "other"}, resource="src/app.py")
    first = [c.command.command_id for c in plan_for(event, World(agents=agents), now=NOW).commands]
    again = [c.command.command_id for c in plan_for(event, World(agents=agents), now=NOW).commands]
    assert first == again == [f"cmd_{event.event_id}_t1"]


def test_a_wake_names_the_agents_change_and_task_and_why_it_woke() -> None:
    # GIVEN two active agents on two Changes, and a promotion that belongs to no Change
    agents = [ActiveAgent("a1", "c1", "t1"), ActiveAgent("a2", "c2", "t9")]
    event = fact(
        "canonical.advanced", {"generation": 4, "previousGeneration": 3, "candidateId": "cand-1"}
    )
    # WHEN it is planned
    wakes = [c.command for c in plan_for(event, World(agents=agents), now=NOW).commands[:2]]
    # THEN each wake carries its own agent's Change and Task, the reason and the cause
    assert [(w.change_id, w.task_id) for w in wakes] == [("c1", "t1"), ("c2", "t9")]
    assert [w.payload.model_dump(by_alias=True) for w in wakes] == [
        {
            "agentId": "a1",
            "reason": "canonical_advanced",
            "eventId": event.event_id,
            "eventKind": None,
        },
        {
            "agentId": "a2",
            "reason": "canonical_advanced",
            "eventId": event.event_id,
            "eventKind": None,
        },
    ]


def test_an_overlap_wake_is_for_the_agents_change_not_the_writers() -> None:
    # GIVEN a resource fact written for Change cw, overlapping an agent of Change c1
    agent = ActiveAgent("reader", "c1", "t1", ("src/app.py",))
    event = fact(
        "claim.released", {"claimId": "k1", "agentId": "w"}, resource="src/app.py", change_id="cw"
    )
    # WHEN it is planned
    plan = plan_for(event, World(agents=[agent]), now=NOW)
    # THEN the plan is this event's, and the wake is the reader's, saying why
    assert (plan.event_id, plan.rule) == (event.event_id, "claim.released: resource overlap")
    (wake,) = [c.command for c in plan.commands]
    assert (wake.change_id, wake.task_id) == ("c1", "t1")
    assert wake.payload.model_dump(by_alias=True)["reason"] == "exact_resource_overlap"


def test_the_author_is_skipped_and_the_agents_after_it_still_wake() -> None:
    # GIVEN the author of a resource fact listed before another agent on the same file
    agents = [
        ActiveAgent("writer", "c1", "t1", ("src/app.py",)),
        ActiveAgent("reader", "c1", "t2", ("src/app.py",)),
    ]
    author = Caller("acme", "agent:writer", correlation_id="corr-rules")
    event = fact(
        "intent.changed",
        {"intentId": "i1", "agentId": "writer", "paths": ["src/app.py"]},
        by=author,
        resource="src/app.py",
    )
    plan = plan_for(event, World(agents=agents), now=NOW)
    assert [c.command.task_id for c in plan.commands] == ["t2"]


def test_the_index_build_asks_for_the_generation_because_of_a_promotion_and_no_change() -> None:
    # GIVEN a promotion fact that names the Change whose Candidate was promoted
    event = fact(
        "artifact.promoted",
        {"artifactId": "art-1", "candidateId": "cand-1", "generation": 4},
        change_id="c1",
    )
    (build,) = [c.command for c in plan_for(event, World(), now=NOW).commands]
    # THEN the build belongs to the project's generation, not to that Change
    assert build.command_type == "index.build"
    assert build.change_id is None
    assert build.payload.model_dump(by_alias=True) == {"generation": 4, "reason": "promotion"}


def reasons(world: RoutingWorld, event: Event) -> list[tuple[str, object]]:
    plan = plan_for(event, world, now=NOW)
    return [
        (p.command.command_type, p.command.payload.model_dump().get("reason"))
        for p in plan.commands
    ]


def test_each_rule_names_itself_and_says_why_it_sends_each_command() -> None:
    # GIVEN one fact for each rule of the flowchart
    ready = fact("task.ready", {}, change_id="c1", task_id="t1")
    created = fact(
        "change.created", {"title": "t", "clientRequestId": "r", "requestedBy": "u"}, change_id="c1"
    )
    planned = fact("change.planned", {"taskIds": ["t1"]}, change_id="c1")
    completed = fact("task.completed", {"agentId": "a1"}, change_id="c1", task_id="t1")
    verified = fact("verification.started", {"reason": "work_graph_completed"}, change_id="c1")
    # THEN each plan is its event's, under its rule's name
    expected_rules = {
        ready: "task.ready: the dispatcher already sent the wake",
        created: "informational: no action",
        planned: "change.planned",
    }
    for event, rule in expected_rules.items():
        plan = plan_for(event, World(ready={"c1"}), now=NOW)
        assert (plan.event_id, plan.rule) == (event.event_id, rule)
    # AND each command says why it was sent
    assert reasons(World(), planned) == [("change.dispatch", "change_planned")]
    assert reasons(World(ready={"c1"}), completed) == [("change.dispatch", "task_completed")]
    assert reasons(World(at_limit={"c1"}), completed) == [("change.dispatch", "agent_slot_freed")]
    assert reasons(World(), verified) == [("candidate.create", "work_graph_completed")]
    # AND every command a Change's fact causes belongs to that Change
    failed = fact("task.failed", {"reason": "red"}, change_id="c1", task_id="t2")
    for event in (planned, completed, verified, failed):
        commands = plan_for(event, World(ready={"c1"}), now=NOW).commands
        assert commands and {c.command.change_id for c in commands} == {"c1"}


def test_a_promotion_hands_the_lifecycle_the_generation_and_the_changes_it_carried() -> None:
    event = fact(
        "canonical.advanced",
        {"generation": 4, "previousGeneration": 3, "candidateId": "cand-1", "changeIds": ["c1"]},
    )
    (effect,) = plan_for(event, World(), now=NOW).effects
    assert effect.detail == {
        "promoted_candidate_id": "cand-1",
        "generation": 4,
        "change_ids": ["c1"],
    }
    # a promotion that names no Change hands on an empty list, not a missing key
    bare = fact(
        "canonical.advanced",
        {"generation": 5, "previousGeneration": 4, "candidateId": "cand-2"},
        key="bare",
    )
    (bare_effect,) = plan_for(bare, World(), now=NOW).effects
    assert bare_effect.detail["change_ids"] == []


# -- which Events a rule acts on (the causal router leases only those) ---------------------


def any_event(event_type: str, *, resource: str | None = None) -> Event:
    """An Event of ``event_type`` on Change ``c1``, its payload left unvalidated and empty:
    enough for the rules, which read no field of a payload they plan nothing for."""
    template = fact("task.ready", {}, change_id="c1", task_id="t1")
    return template.model_copy(
        update={
            "event_type": event_type,
            "payload": EVENT_TYPES[event_type].payload.model_construct(),
            "resource": resource,
        }
    )


#: A world where every rule that could act would: agents holding the resource exactly and by
#: prefix, ready Tasks, and a Task waiting at the agent limit.
BUSIEST = World(
    agents=[
        ActiveAgent("exact", "c1", "t1", ("src/app.py",)),
        ActiveAgent("prefix", "c2", "t2", ("src/",)),
    ],
    ready={"c1"},
    at_limit={"c1"},
)


#: The lifecycle types a rule acts on (their payloads are read, and none has a resource). The
#: spec's sets are written out by the catalogue tests: the router's own would prove nothing.
LIFECYCLE_RULE_TYPES = ROUTED_BY_A_CAUSAL_RULE - SPEC_RESOURCE_EVENTS


@pytest.mark.parametrize("event_type", sorted(set(EVENT_TYPES) - LIFECYCLE_RULE_TYPES))
def test_exactly_the_six_resource_events_wake_an_agent_holding_their_resource(
    event_type: str,
) -> None:
    # GIVEN an Agent of another Change holding src/app.py
    world = World(agents=[ActiveAgent("holder", "c2", "t2", ("src/app.py",))])
    # WHEN an Event of this type names src/app.py as its resource
    plan = plan_for(any_event(event_type, resource="src/app.py"), world, now=NOW)
    # THEN the holder is woken if and only if the type is one of the spec's resource Events
    woken = [c.command.task_id for c in plan.commands if c.command.command_type == "agent.wake"]
    assert woken == (["t2"] if event_type in SPEC_RESOURCE_EVENTS else []), event_type


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_an_event_no_rule_acts_on_plans_nothing_even_in_the_busiest_world(event_type: str) -> None:
    event = any_event(event_type, resource="src/app.py" if event_type in RESOURCE_EVENTS else None)
    if not acts_on(event):
        plan = plan_for(event, BUSIEST, now=NOW)
        assert (plan.commands, plan.questions, plan.effects) == ([], [], []), event_type


def test_the_rules_act_on_the_resource_events_and_six_lifecycle_types_only() -> None:
    acted_on = {
        name
        for name in EVENT_TYPES
        if acts_on(any_event(name, resource="src/app.py" if name in RESOURCE_EVENTS else None))
    }
    assert acted_on == RESOURCE_EVENTS | LIFECYCLE_RULE_TYPES
    # a resource Event with no resource overlaps nothing; task.ready is the dispatcher's
    assert not acts_on(any_event("intent.declared"))
    assert not acts_on(any_event("task.ready"))
