"""The two actor classes (spec "Transactional outbox to the event log"; doc 002 §1): a
transition returns (patch, facts) and the actor writes both in one SQLite transaction."""

from __future__ import annotations

import fcntl
import re
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rhumbatron.actors.actor import ActorKind, ActorRef
from rhumbatron.actors.alarms import RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.actors.shard_commands import (
    AcquireClaim,
    AppendChangeEvents,
    DeclareIntent,
    ExpireClaims,
    ReleaseClaim,
)
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact, TaskPlan
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.domain.project import create_project
from rhumbatron.domain.transition import Insert, Transition, Update
from rhumbatron.errors import ActorBusyError, ActorError, DomainError, EnvelopeError, OutboxError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.event_types import EVENT_TYPES, CanonicalAdvanced
from rhumbatron.protocol.ids import stable_event_id
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap

CALLER = Caller("acme", "system:test", correlation_id="corr-actors")
AGENT = Caller("acme", "agent:builder-1", correlation_id="corr-actors")
PROJECT = "acme-web"
EVENT_ID = re.compile(r"^evt_[0-9a-f]{32}$")


@pytest.fixture
def offline_app(tmp_path: Path, clock: ManualClock) -> Rhumbatron:
    """The composition root without NATS: actors only."""
    settings = load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1")
    return bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())


def outbox(connection: sqlite3.Connection) -> list[sqlite3.Row]:
    return list(connection.execute("SELECT * FROM outbox ORDER BY seq"))


def count(connection: sqlite3.Connection, table: str) -> int:
    return int(connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def project_row(root: ProjectRoot, name: str = "Acme") -> dict[str, object]:
    return {
        "project_id": root.ref.project_id,
        "tenant_id": "acme",
        "name": name,
        "status": "active",
        "canonical_generation": 0,
        "canonical_candidate_id": None,
        "created_at": "2026-01-01T00:00:00+00:00",
    }


def foreign_fact(root: ProjectRoot, event_type: str, **fields: object) -> Event:
    ctx = FactContext(CALLER, root.ref.project_id, root.clock.now())
    return ctx.fact(event_type, dict(fields.pop("payload", {})), **fields)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- one transaction


def test_a_transition_returns_its_patch_and_its_facts(clock: ManualClock) -> None:
    # GIVEN no project yet
    ctx = FactContext(CALLER, PROJECT, clock.now())
    # WHEN the create transition decides
    transition = create_project(None, ctx, name="Acme")
    # THEN it returns the row to write and the fact it produced, nothing written yet (S2-015)
    assert [type(m) for m in transition.patch] == [Insert]
    assert [f.event_type for f in transition.facts] == ["project.created"]


def test_a_transition_writes_state_and_outbox_in_one_transaction(
    offline_app: Rhumbatron, clock: ManualClock
) -> None:
    root = offline_app.project_root(PROJECT)
    result = root.create_project(CALLER, name="Acme")
    # THEN the project row, the outbox row and the alarm are all there
    state = root.state()
    assert state is not None and state.name == "Acme"
    assert [r["event_id"] for r in outbox(root.connection)] == [result.transition.facts[0].event_id]
    assert alarm_due_at(root.connection) == clock.now().timestamp()
    assert root.path == offline_app.settings.state_dir / "projects" / PROJECT / "root.sqlite"


def test_a_decision_that_raises_leaves_neither_state_nor_outbox_row(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN a decision that writes state and then fails
    root = offline_app.project_root(PROJECT)

    def decide(db: sqlite3.Connection) -> Transition:
        db.execute(
            "INSERT INTO project VALUES (?, 'acme', 'Acme', 'active', 0, NULL, 'now')", (PROJECT,)
        )
        raise DomainError("the decision changed its mind")

    # WHEN the actor runs it
    with pytest.raises(DomainError, match="changed its mind"):
        root.transact(decide)
    # THEN nothing was written: a rolled-back change publishes nothing (S2-021)
    assert count(root.connection, "project") == 0
    assert outbox(root.connection) == []
    assert alarm_due_at(root.connection) is None
    assert offline_app.alarms.announced == []


def test_a_patch_that_fails_to_apply_rolls_back_the_facts(offline_app: Rhumbatron) -> None:
    # GIVEN a transition whose fact is valid but whose Update matches no row
    root = offline_app.project_root(PROJECT)
    fact = foreign_fact(root, "project.created", payload={"name": "Acme"})
    bad = Update("project", key={"project_id": "nobody"}, values={"name": "x"})
    # WHEN the actor applies it
    with pytest.raises(ActorError, match="matched 0 rows"):
        root.transact(lambda db: Transition(patch=(bad,), facts=(fact,)))
    # THEN the fact did not reach the outbox
    assert outbox(root.connection) == []


def test_a_malformed_event_never_reaches_the_outbox(offline_app: Rhumbatron) -> None:
    root = offline_app.project_root(PROJECT)
    # WHEN a transition builds an Event with a bad payload
    with pytest.raises(EnvelopeError, match="name"):
        root.transact(
            lambda db: Transition(facts=(foreign_fact(root, "project.created", payload={}),))
        )
    # THEN construction failed inside the transaction: no row
    assert outbox(root.connection) == []


def test_an_event_over_the_size_limit_rolls_the_transaction_back(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a 1 KiB event limit and a change.created whose title alone is 1,000 UTF-8 bytes
    settings: Settings = load_settings(state_dir=tmp_path / "s", max_event_bytes=1024)
    ref = ResourceShard.ref_for(PROJECT, change_resource_key("chg-1"), 16)
    shard = ResourceShard(ref, settings, clock=clock)
    big = ChangeFact(
        "change.created", {"title": "é" * 500, "clientRequestId": "r", "requestedBy": "u"}
    )
    # WHEN it is appended
    # THEN the outbox refuses it by size, and the Change's status row is rolled back too
    with pytest.raises(OutboxError, match="RHUMBATRON_MAX_EVENT_BYTES=1024"):
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="created", facts=(big,)))
    assert shard.change_state("chg-1") is None
    assert outbox(shard.connection) == []
    shard.close()


def test_an_event_of_exactly_the_size_limit_is_written_and_one_byte_over_is_refused(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a change.created Event (over the least limit allowed, 1 KiB) and its size
    fact = ChangeFact(
        "change.created", {"title": "é" * 400, "clientRequestId": "r", "requestedBy": "u"}
    )

    def shard_limited_to(limit: int | None, name: str) -> ResourceShard:
        settings = load_settings(state_dir=tmp_path / name, max_event_bytes=limit or 65_536)
        ref = ResourceShard.ref_for(PROJECT, change_resource_key("chg-1"), 16)
        return ResourceShard(ref, settings, clock=clock)

    measured = shard_limited_to(None, "measured")
    measured.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="created", facts=(fact,)))
    [row] = outbox(measured.connection)
    size = len(row["envelope"])
    measured.close()
    # WHEN it is written where the limit is exactly its size, THEN it is written
    exact = shard_limited_to(size, "exact")
    exact.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="created", facts=(fact,)))
    assert len(outbox(exact.connection)) == 1
    exact.close()
    # WHEN the limit is one byte less, THEN the error names the Event, its size and what to do
    over = shard_limited_to(size - 1, "over")
    with pytest.raises(OutboxError) as refused:
        over.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="created", facts=(fact,)))
    assert str(refused.value) == (
        f"event {row['event_id']} (change.created) is {size} bytes, over "
        f"RHUMBATRON_MAX_EVENT_BYTES={size - 1}; put large content in S3 and reference it "
        "from the payload"
    )
    assert outbox(over.connection) == []
    over.close()


def test_a_patch_cannot_touch_the_outbox_table(offline_app: Rhumbatron) -> None:
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    sneaky = Update("outbox", key={"seq": 1}, values={"state": "published"})
    with pytest.raises(ActorError, match="no table 'outbox'"):
        root.transact(lambda db: Transition(patch=(sneaky,)))
    assert outbox(root.connection)[0]["state"] == "pending"


# --------------------------------------------------------------------------- who writes what


def test_project_root_refuses_a_shard_fact_and_rolls_back(offline_app: Rhumbatron) -> None:
    # GIVEN a ProjectRoot transition carrying a project row and a claim.acquired fact
    root = offline_app.project_root(PROJECT)
    claim = foreign_fact(
        root,
        "claim.acquired",
        resource="src/app.py",
        payload={"claimId": "c", "agentId": "a", "expiresAt": root.clock.now()},
    )
    # WHEN it is written
    with pytest.raises(DomainError, match=r"claim\.acquired is written by the resource_shard"):
        root.transact(
            lambda db: Transition(patch=(Insert("project", project_row(root)),), facts=(claim,))
        )
    # THEN neither the row nor the fact was written (S0-022)
    assert count(root.connection, "project") == 0
    assert outbox(root.connection) == []


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("project.created", {"name": "Acme"}),
        ("canonical.advanced", {"generation": 1, "previousGeneration": 0, "candidateId": "c"}),
        ("artifact.promoted", {"artifactId": "a", "candidateId": "c", "generation": 1}),
    ],
)
def test_a_resource_shard_refuses_the_project_roots_facts(
    offline_app: Rhumbatron, event_type: str, payload: dict[str, object]
) -> None:
    shard = offline_app.resource_shard(PROJECT, "src/app.py")
    ctx = FactContext(CALLER, PROJECT, shard.clock.now())
    fact = ctx.fact(event_type, payload)
    with pytest.raises(DomainError, match="project_root"):
        shard.transact(lambda db: Transition(facts=(fact,)))
    assert outbox(shard.connection) == []


def test_a_fact_of_another_project_is_refused(offline_app: Rhumbatron) -> None:
    # GIVEN acme-web's root and a project.created fact for acme-billing
    root = offline_app.project_root(PROJECT)
    other = FactContext(CALLER, "acme-billing", root.clock.now()).fact(
        "project.created", {"name": "Billing"}
    )
    # THEN the actor refuses it and writes nothing
    with pytest.raises(DomainError, match="acme-billing"):
        root.transact(
            lambda db: Transition(patch=(Insert("project", project_row(root)),), facts=(other,))
        )
    assert count(root.connection, "project") == 0
    assert outbox(root.connection) == []


def test_exactly_two_actor_classes_own_an_outbox() -> None:
    # spec S0-021: ProjectRootDO and ResourceShardDO, and no third kind of actor
    assert {kind.value for kind in ActorKind} == {"project_root", "resource_shard"}
    assert {ProjectRoot.KIND, ResourceShard.KIND} == set(ActorKind)


def test_an_actor_class_cannot_open_the_other_kind(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path)
    with pytest.raises(ActorError) as refused:
        ProjectRoot(ActorRef(ActorKind.RESOURCE_SHARD, PROJECT, 3), settings)
    assert str(refused.value) == (
        f"ProjectRoot cannot open a resource_shard actor (resource_shard:{PROJECT}:03)"
    )


def test_an_invalid_project_id_is_refused_before_any_file_is_made(tmp_path: Path) -> None:
    with pytest.raises(ActorError, match="not valid"):
        ActorRef(ActorKind.PROJECT_ROOT, "../escape")
    assert not (tmp_path / "projects").exists()


def test_actor_refs_round_trip_through_their_keys() -> None:
    root = ActorRef(ActorKind.PROJECT_ROOT, PROJECT)
    shard = ActorRef(ActorKind.RESOURCE_SHARD, PROJECT, 9)
    assert (root.key, shard.key) == ("project_root:acme-web", "resource_shard:acme-web:09")
    assert ActorRef.parse(root.key) == root
    assert ActorRef.parse(shard.key) == shard
    with pytest.raises(ActorError, match="not 'project_root"):
        ActorRef.parse("mailbox:acme-web")


# --------------------------------------------------------------------------- change events


def test_change_events_land_in_the_shard_that_owns_change_id(offline_app: Rhumbatron) -> None:
    # GIVEN 16 shards; fnv1a32("change:chg-1") = 0x23a34c99 -> shard 9 (computed with bash)
    assert ResourceShard.ref_for(PROJECT, "change:chg-1", 16).shard == 9
    assert ResourceShard.ref_for(PROJECT, change_resource_key("chg-2"), 16).shard == 0
    # WHEN chg-1's facts are appended through the composition root
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    facts = (
        ChangeFact("change.created", {"title": "t", "clientRequestId": "r", "requestedBy": "u"}),
        ChangeFact("task.completed", {"agentId": "builder-1"}, task_id="tsk-1"),
    )
    result = shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=facts)
    )
    # THEN they sit in shard-09's file, with the Change's status row, and stable IDs
    assert shard.path.name == "shard-09.sqlite"
    assert result.events_added == 2
    assert [r["event_id"] for r in outbox(shard.connection)] == [
        "evt_2d2562607bcb3e01099f680c0b4c6b2a",  # sha256sum chg-1␟change.created␟␟
        "evt_b842dd8af0a9b557c516a6417d20c1ba",  # sha256sum chg-1␟task.completed␟tsk-1␟
    ]
    state = shard.change_state("chg-1")
    assert state is not None and state.status == "running"


def test_changes_requested_through_the_lifecycle_land_in_the_shard_of_change_colon_id(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN a project of a deployment with 7 shards. (With a power of two up to 64, as the
    # default 16, fnv1a32 mod N is the same with or without the "change:" prefix: hashing it
    # leaves the low six bits of the FNV state as they were. Seven shards tell the keys apart.)
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", resource_shard_count=7
    )
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    app.project_root(PROJECT).create_project(CALLER, name="Acme")
    # WHEN 16 Changes are requested the way the API asks for them (random Change IDs: 16, so
    # that a wrong key cannot land every Change in the right shard by chance)
    change_ids = [
        app.lifecycle()
        .requests.create_change(
            Caller("acme", "user:dana", f"req-{n}"),
            project_id=PROJECT,
            client_request_id=f"req-{n}",
            title="Add a page",
            tasks=[TaskPlan(task_id="work", title="Do the work", agent_id="builder-1")],
        )
        .change_id
        for n in range(16)
    ]
    # THEN each Change's Events sit in the shard that owns "change:<id>", and in no other
    found: dict[str | None, set[str]] = {change_id: set() for change_id in change_ids}
    any_shard = ResourceShard.ref_for(PROJECT, "any", 7).path(settings.state_dir)
    for path in any_shard.parent.glob("shard-*.sqlite"):
        connection = sqlite3.connect(path)
        for (envelope,) in connection.execute("SELECT envelope FROM outbox"):
            event = Event.parse(bytes(envelope))
            if event.change_id in found:
                found[event.change_id].add(path.name)
        connection.close()
    owners = {c: ResourceShard.ref_for(PROJECT, f"change:{c}", 7).shard for c in change_ids}
    assert found == {c: {f"shard-{shard:02d}.sqlite"} for c, shard in owners.items()}


# The spec's Change Events (the lifecycle of a Change, its Tasks, Candidates, promotion and
# release), named here rather than read from the registry's id_kind, which is what is tested.
CHANGE_EVENT_TYPES = (
    *(
        f"change.{verb}"
        for verb in (
            "created",
            "planned",
            "status_changed",
            "settled",
            "completed",
            "failed",
            "cancelled",
            "not_selected",
            "declined",
        )
    ),
    *(
        f"task.{verb}"
        for verb in ("ready", "assigned", "started", "completed", "failed", "blocked")
    ),
    "agent.woke",
    "model.routed",
    "verification.started",
    *(f"candidate.{verb}" for verb in ("created", "verified", "rejected", "stale", "promoted")),
    *(f"promotion.{verb}" for verb in ("requested", "completed", "rejected")),
    *(f"release.{verb}" for verb in ("started", "completed", "failed")),
)


@pytest.mark.parametrize("event_type", CHANGE_EVENT_TYPES)
def test_every_change_event_type_gets_the_stable_id_so_a_retry_repeats_it(
    clock: ManualClock, event_type: str
) -> None:
    # GIVEN a Change Event of this type, written by a workflow step and by its retry (another
    # moment, another causing event)
    task_id = "tsk-1" if event_type.startswith("task.") else None
    payload: Any = EVENT_TYPES[event_type].payload.model_construct()  # IDs read no payload
    first = FactContext(CALLER, PROJECT, clock.now()).fact(
        event_type, payload, change_id="chg-1", task_id=task_id
    )
    clock.advance(minutes=5)
    retry_caller = Caller("acme", "system:test", "corr-retry", caused_by="evt_" + "1" * 32)
    again = FactContext(retry_caller, PROJECT, clock.now()).fact(
        event_type, payload, change_id="chg-1", task_id=task_id
    )
    # THEN both carry stableEventId(change, type, task): the retry repeats the ID (S0-016)
    assert first.event_id == again.event_id == stable_event_id("chg-1", event_type, task_id)
    # AND another Change's fact of the same type gets another ID
    other = FactContext(CALLER, PROJECT, clock.now()).fact(
        event_type, payload, change_id="chg-2", task_id=task_id
    )
    assert other.event_id != first.event_id


def test_a_retried_change_append_is_a_no_op(offline_app: Rhumbatron, clock: ManualClock) -> None:
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    facts = (
        ChangeFact("task.ready", {}, task_id="tsk-1"),
        ChangeFact("task.ready", {}, task_id="tsk-2"),
    )
    first = shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=facts)
    )
    clock.advance(minutes=5)
    retried = shard.apply(
        CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=facts)
    )
    # THEN the retry computes the same IDs and the outbox ignores them
    assert [f.event_id for f in retried.transition.facts] == [
        f.event_id for f in first.transition.facts
    ]
    assert (first.events_added, retried.events_added) == (2, 0)
    assert len(outbox(shard.connection)) == 2


def test_the_optional_key_tells_apart_repeats_of_one_task_event(offline_app: Rhumbatron) -> None:
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    fail = {"reason": "tests failed"}
    for key in ("attempt-1", "attempt-2"):
        fact = ChangeFact("task.failed", fail, task_id="tsk-1", key=key)
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,)))
    assert [r["event_id"] for r in outbox(shard.connection)] == [
        stable_event_id("chg-1", "task.failed", "tsk-1", "attempt-1"),
        stable_event_id("chg-1", "task.failed", "tsk-1", "attempt-2"),
    ]


def test_a_non_change_event_cannot_be_appended_as_a_change_event(offline_app: Rhumbatron) -> None:
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    fact = ChangeFact("claim.released", {"claimId": "c", "agentId": "a"})
    with pytest.raises(DomainError, match="not a Change Event"):
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=(fact,)))
    assert outbox(shard.connection) == []
    assert shard.change_state("chg-1") is None


def test_a_terminal_change_cannot_move_again(offline_app: Rhumbatron) -> None:
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    done = ChangeFact("change.completed", {})
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="completed", facts=(done,)))
    with pytest.raises(DomainError, match="terminal"):
        shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="running", facts=()))
    assert len(outbox(shard.connection)) == 1


# --------------------------------------------------------------------------- actor-minted IDs


def test_claim_events_get_fresh_actor_minted_ids_each_transaction(
    offline_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN one resource, acquired, released and acquired again by the same agent
    resource = "src/app.py"
    shard = offline_app.resource_shard(PROJECT, resource)
    ttl = timedelta(minutes=30)
    first = shard.apply(AGENT, AcquireClaim(resource=resource, agent_id="builder-1", ttl=ttl))
    shard.apply(AGENT, ReleaseClaim(resource=resource, agent_id="builder-1"))
    again = shard.apply(AGENT, AcquireClaim(resource=resource, agent_id="builder-1", ttl=ttl))
    # THEN each transaction minted its own evt_ + 32 hex ID (S0-019), all different
    ids = [r["event_id"] for r in outbox(shard.connection)]
    assert [r["event_type"] for r in outbox(shard.connection)] == [
        "claim.acquired",
        "claim.released",
        "claim.acquired",
    ]
    assert all(EVENT_ID.match(i) for i in ids)
    assert len(set(ids)) == 3
    assert first.transition.facts[0].event_id != again.transition.facts[0].event_id
    # AND the stored ID is the one a later publish re-sends (S0-020)
    assert Event.parse(bytes(outbox(shard.connection)[0]["envelope"])).event_id == ids[0]


def test_intent_events_get_actor_minted_ids_and_carry_their_resource(
    offline_app: Rhumbatron,
) -> None:
    shard = offline_app.resource_shard(PROJECT, "src/a.py")
    declared = shard.apply(
        AGENT,
        DeclareIntent(
            intent_id="int-1", agent_id="builder-1", paths=("src/a.py",), change_id="chg-1"
        ),
    )
    changed = shard.apply(
        AGENT,
        DeclareIntent(intent_id="int-1", agent_id="builder-1", paths=("src/a.py", "src/b.py")),
    )
    same = shard.apply(
        AGENT,
        DeclareIntent(intent_id="int-1", agent_id="builder-1", paths=("src/a.py", "src/b.py")),
    )
    d, c = declared.transition.facts[0], changed.transition.facts[0]
    assert (d.event_type, c.event_type) == ("intent.declared", "intent.changed")
    assert (d.resource, c.resource) == ("src/a.py", "src/")
    assert d.event_id != c.event_id
    assert d.event_id != stable_event_id("chg-1", "intent.declared")
    assert same.events_added == 0


def test_a_claim_held_by_another_agent_is_refused_without_a_fact(offline_app: Rhumbatron) -> None:
    resource = "src/app.py"
    shard = offline_app.resource_shard(PROJECT, resource)
    ttl = timedelta(minutes=30)
    shard.apply(AGENT, AcquireClaim(resource=resource, agent_id="builder-1", ttl=ttl))
    with pytest.raises(DomainError, match="claimed by agent 'builder-1'"):
        shard.apply(AGENT, AcquireClaim(resource=resource, agent_id="builder-2", ttl=ttl))
    assert len(outbox(shard.connection)) == 1


def test_expired_claims_are_removed_with_claim_expired(
    offline_app: Rhumbatron, clock: ManualClock
) -> None:
    resource = "src/app.py"
    shard = offline_app.resource_shard(PROJECT, resource)
    shard.apply(
        AGENT, AcquireClaim(resource=resource, agent_id="builder-1", ttl=timedelta(minutes=1))
    )
    assert shard.apply(CALLER, ExpireClaims()).events_added == 0
    clock.advance(minutes=1)
    result = shard.apply(CALLER, ExpireClaims())
    assert [f.event_type for f in result.transition.facts] == ["claim.expired"]
    assert result.transition.facts[0].resource == resource
    assert shard.claims() == []


# --------------------------------------------------------------------------- promotion


def test_promoting_advances_the_canonical_generation_with_two_facts(
    offline_app: Rhumbatron,
) -> None:
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    result = root.promote(
        CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0, change_ids=("c",)
    )
    assert [f.event_type for f in result.transition.facts] == [
        "artifact.promoted",
        "canonical.advanced",
    ]
    assert all(f.canonical_generation == 1 for f in result.transition.facts)
    state = root.state()
    assert state is not None
    assert (state.canonical_generation, state.canonical_candidate_id) == (1, "cand-1")


def test_promoting_the_same_candidate_twice_is_already_promoted(offline_app: Rhumbatron) -> None:
    # GIVEN a candidate promoted from generation 0
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # WHEN the same promotion is asked again (candidate + expected generation)
    again = root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # THEN it is already_promoted: no patch, no new facts, generation unchanged
    assert again.transition == Transition()
    assert again.events_added == 0
    assert len(outbox(root.connection)) == 3
    state = root.state()
    assert state is not None and state.canonical_generation == 1


def test_promoting_from_a_stale_generation_is_refused(offline_app: Rhumbatron) -> None:
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    with pytest.raises(DomainError, match=r"expects canonical generation 0.*is at 1"):
        root.promote(CALLER, candidate_id="cand-2", artifact_id="art-2", expected_generation=0)
    state = root.state()
    assert state is not None and state.canonical_candidate_id == "cand-1"
    assert len(outbox(root.connection)) == 3


def test_the_promoted_candidate_expecting_another_generation_is_no_repeat_and_is_refused(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN cand-1 promoted from generation 0: canonical is cand-1 at 1
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    # WHEN cand-1 is promoted again, expecting generation 2 (the key is candidate + expected
    # generation: only cand-1 from 0 is the promotion that happened)
    # THEN it is no repeat: it is refused, and nothing is written
    with pytest.raises(DomainError, match=r"expects canonical generation 2.*is at 1"):
        root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=2)
    state = root.state()
    assert state is not None and state.canonical_generation == 1
    assert len(outbox(root.connection)) == 3


def test_promoting_before_the_project_exists_is_refused(offline_app: Rhumbatron) -> None:
    root = offline_app.project_root(PROJECT)
    with pytest.raises(DomainError, match="does not exist"):
        root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    assert outbox(root.connection) == []


def test_creating_a_project_again_with_the_same_name_changes_nothing(
    offline_app: Rhumbatron,
) -> None:
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    assert root.create_project(CALLER, name="Acme").events_added == 0
    with pytest.raises(DomainError, match="already exists"):
        root.create_project(CALLER, name="Other")
    assert len(outbox(root.connection)) == 1


def test_actor_refs_lists_every_actor_file(offline_app: Rhumbatron) -> None:
    offline_app.project_root(PROJECT).create_project(CALLER, name="Acme")
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=()))
    assert list(offline_app.actor_refs()) == [
        ActorRef(ActorKind.PROJECT_ROOT, PROJECT),
        ActorRef(ActorKind.RESOURCE_SHARD, PROJECT, 9),
    ]


def test_actor_refs_passes_over_files_no_actor_has_and_lists_the_actors_after_them(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN two actor files, and files no actor has sorted before each: a project folder whose
    #   name is no project ID, and a shard file with no number
    offline_app.project_root(PROJECT).create_project(CALLER, name="Acme")
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=()))
    projects = offline_app.settings.state_dir / "projects"
    (projects / "Not A Project").mkdir()
    (projects / "Not A Project" / "root.sqlite").touch()
    (projects / PROJECT / "shard-.sqlite").touch()
    # WHEN the actors are listed, THEN every actor is, and nothing else
    assert list(offline_app.actor_refs()) == [
        ActorRef(ActorKind.PROJECT_ROOT, PROJECT),
        ActorRef(ActorKind.RESOURCE_SHARD, PROJECT, 9),
    ]


def test_a_flock_on_the_lock_file_beside_the_actor_file_keeps_its_publishers_out(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN an actor, and another program holding an exclusive flock on root.publish.lock
    #   beside its file (an older publisher, or an operator's tool)
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    with (root.path.parent / "root.publish.lock").open("a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # WHEN a publisher tries to take the actor, THEN it is kept out
        with root.publish_lock() as acquired:
            assert not acquired
    # AND once the other program let go, it gets in, and again after the actor was closed
    with root.publish_lock() as acquired:
        assert acquired
    root.close()
    with root.publish_lock() as acquired:
        assert acquired


def test_reusing_an_artifact_id_is_a_domain_error_and_changes_nothing(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN a project whose generation 1 was promoted with artifact art-1
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    root.promote(CALLER, candidate_id="cand-1", artifact_id="art-1", expected_generation=0)
    before = outbox(root.connection)
    # WHEN another candidate is promoted with the same artifact ID
    # THEN a DomainError names the table, and neither state nor outbox moved
    with pytest.raises(
        DomainError,
        match=f"^ProjectRoot project_root:{PROJECT}: the change to artifacts breaks a constraint",
    ):
        root.promote(CALLER, candidate_id="cand-2", artifact_id="art-1", expected_generation=1)
    assert outbox(root.connection) == before
    assert root.state() is not None and root.state().canonical_generation == 1  # type: ignore[union-attr]


def test_opening_an_actor_file_another_writer_holds_is_an_actor_busy_error(
    tmp_path: Path, clock: ManualClock
) -> None:
    # GIVEN an actor file without our schema yet, write-locked by another connection
    settings = load_settings(state_dir=tmp_path / "state", sqlite_busy_timeout_ms=100)
    ref = ProjectRoot.ref_for(PROJECT)
    ref.path(settings.state_dir).parent.mkdir(parents=True)
    holder = sqlite3.connect(ref.path(settings.state_dir), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        # WHEN the actor opens it
        # THEN the error says busy, names the file and the setting
        with pytest.raises(ActorBusyError, match="RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS"):
            _ = ProjectRoot(ref, settings, clock=clock).connection
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # AND once released, it opens normally
    root = ProjectRoot(ref, settings, clock=clock)
    root.create_project(CALLER, name="Acme")
    root.close()


def test_the_publish_lock_admits_one_publisher_per_actor_through_any_handle(
    offline_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN an actor, and a second handle on the same file (another process's view of it)
    shard = offline_app.resource_shard(PROJECT, change_resource_key("c1"))
    other = ResourceShard(shard.ref, offline_app.settings, clock=clock)
    try:
        # WHEN one publisher holds the actor's publish lock
        with shard.publish_lock() as held:
            assert held
            # THEN a second publisher is refused at once, through this handle or the other
            with shard.publish_lock() as again, other.publish_lock() as elsewhere:
                assert (again, elsewhere) == (False, False)
        # AND once it lets go, the next publisher gets it, again and again
        for _ in range(3):
            with other.publish_lock() as held_by_other:
                assert held_by_other
        with shard.publish_lock() as held_again:
            assert held_again
    finally:
        other.close()


def test_closing_an_actor_handle_gives_up_a_publish_lock_it_still_held(
    offline_app: Rhumbatron, clock: ManualClock
) -> None:
    # GIVEN a handle whose publisher took the lock and never let go (its caller died)
    shard = offline_app.resource_shard(PROJECT, change_resource_key("c1"))
    holder = ResourceShard(shard.ref, offline_app.settings, clock=clock)
    lock = holder.publish_lock()
    assert lock.__enter__()
    # WHEN that handle is closed
    holder.close()
    # THEN another publisher can take the actor's lock
    with shard.publish_lock() as held:
        assert held
    # AND the dead caller's late exit is harmless
    lock.__exit__(None, None, None)


def test_a_projects_tenant_is_read_from_its_root_and_none_before_it_is_created(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN a project never made, one whose root file exists but holds no project yet, and
    # one created by a tenant
    assert offline_app.project_tenant("never-made") is None
    file_only = offline_app.project_root("file-only")
    assert file_only.state() is None  # its first read creates the file, with no project in it
    assert file_only.path.exists()
    offline_app.project_root("made").create_project(Caller("acme", "user:ann", "c"), name="M")
    # THEN only the created one names its tenant, and no file is made for the one never made
    assert offline_app.project_tenant("file-only") is None
    assert offline_app.project_tenant("made") == "acme"
    assert not ProjectRoot.ref_for("never-made").path(offline_app.settings.state_dir).exists()


def test_a_changes_attention_reason_is_empty_until_given_and_none_for_an_unknown_change(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN a shard that recorded one Change (no dead letter ever blocked it)
    shard = offline_app.resource_shard(PROJECT, change_resource_key("chg-1"))
    fact = ChangeFact("task.ready", {}, task_id="tsk-1")
    shard.apply(CALLER, AppendChangeEvents(change_id="chg-1", status="planned", facts=(fact,)))
    # THEN its reason reads empty, and a Change the shard never saw has none at all
    assert shard.change_reason("chg-1") == ""
    assert shard.change_reason("chg-never") is None


def test_a_promotion_names_the_changes_it_carries_and_the_root_keeps_the_canonical_history(
    offline_app: Rhumbatron,
) -> None:
    # GIVEN a project whose canonical tree is at generation 0
    root = offline_app.project_root(PROJECT)
    root.create_project(CALLER, name="Acme")
    # WHEN two Candidates are promoted, one after the other, each carrying its Changes (their
    #   IDs sort against their generations)
    root.promote(
        CALLER,
        candidate_id="cand-z",
        artifact_id="art-1",
        expected_generation=0,
        change_ids=("chg-1", "chg-2"),
    )
    root.promote(
        CALLER, candidate_id="cand-a", artifact_id="art-2", expected_generation=1, change_ids=()
    )
    # THEN each canonical.advanced names the Changes it carries
    advanced = [
        payload
        for row in outbox(root.connection)
        if isinstance(payload := Event.parse(row["envelope"]).payload, CanonicalAdvanced)
    ]
    assert [(p.candidate_id, list(p.change_ids)) for p in advanced] == [
        ("cand-z", ["chg-1", "chg-2"]),
        ("cand-a", []),
    ]
    # AND the root lists the promoted Candidates oldest generation first
    assert root.promoted_candidate_ids() == ["cand-z", "cand-a"]  # not by ID, nor as stored
