"""Events that are not their project's (issue #21, ../shared/RELIABILITY.md B11).

A probe with publish rights on NATS put an event of tenant B's project carrying
``tenantId: tenant-a`` on the stream, and tenant A's subscription scheduled a delivery; an
event of project A put on project B's stream was applied to A's view. The router is the last
line: it checks every record against its project's root actor and its project's stream, and
refuses what does not fit like a record that does not decode — the 5th failure makes it a
``poison_event`` dead letter filed under no tenant, and no subscription ever sees it. An event
of a project that has no root here is refused too (fail closed).

The same check guards the replays (a rewind of the stream, and the archive, which may hold
events archived before the check), and a root that cannot be read now (a busy file) retries
its records instead of failing them or the batch.

Real nats-server, real SQLite files, moto's S3 server, the reactions world of
``integration/test_reactions``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio

from integration.test_reactions import (
    OTHER_PROJECT,
    PROJECT,
    START,
    STREAM,
    TENANT,
    Receiver,
    World,
    make_world,
    receiver,
    task_completed,
    webhook,
)
from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.archive import ArchiveReader, ArchiveWriter
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_name, event_stream_subject, stream_index
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.records import ProjectOwners, checked_record
from rhumbatron.router.replay import replay_archive, rewind
from rhumbatron.router.reports import SubscriptionReport
from rhumbatron_dev.local.s3_server import S3ServerProcess

__all__ = ["receiver"]  # the webhook receiver fixture, used by name

pytestmark = pytest.mark.integration

OWNER = "globex"  # tenant B: it owns OTHER_PROJECT; TENANT ("acme") is tenant A
ENOUGH = 5  # the spec's 5th failure makes the dead letter
#: A project this deployment never created, on the same stream.
NOWHERE = next(p for p in (f"proj-nowhere-{n}" for n in range(100)) if stream_index(p) == STREAM)


async def _build(
    tmp_path: Path, settings: Settings, clock: ManualClock, s3: S3ServerProcess, **overrides: Any
) -> World:
    """The reactions world with its own bucket, and both projects created, as the API
    creates them: acme's, and globex's on the same stream."""
    clock.set(START)
    bucket = f"evidence-{uuid.uuid4().hex[:20]}"
    built = make_world(
        tmp_path,
        settings,
        clock,
        s3_endpoint_url=s3.endpoint_url,
        evidence_bucket=bucket,
        **overrides,
    )
    built.app.s3().create_bucket(Bucket=bucket)
    await built.app.ensure_streams()
    built.app.project_root(PROJECT).create_project(
        Caller(TENANT, "user:ann", "corr-acme"), name="Acme web"
    )
    built.app.project_root(OTHER_PROJECT).create_project(
        Caller(OWNER, "user:gina", "corr-globex"), name="Globex web"
    )
    return built


@pytest_asyncio.fixture
async def world(
    tmp_path: Path, settings: Settings, clock: ManualClock, s3_server: S3ServerProcess
) -> AsyncIterator[World]:
    built = await _build(tmp_path, settings, clock, s3_server)
    yield built
    await built.app.close()


async def _put(world: World, stream: int, *events: Event) -> None:
    """Events put on ``stream`` by hand, as anyone with publish rights on NATS could."""
    js = (await world.app.nats()).jetstream()
    for event in events:
        await js.publish(
            event_stream_subject(stream), event.to_json(), headers={"Nats-Msg-Id": event.event_id}
        )


async def _consume(world: World, subscription: Subscription, stream: int) -> SubscriptionReport:
    """One consume of ``subscription`` on ``stream`` that fetched something. A record nacked a
    moment ago can trail the consumer by a moment: this bounds that wait instead of sleeping."""
    router = world.app.router()
    report = SubscriptionReport()
    for _ in range(200):
        run = RunContext(stream, world.clock.now().timestamp(), apply_calls_left=15)
        report = await router.consume(run, subscription, consumes=1, batch=100)
        if report.fetched:
            break
    return report


async def _consume_until_dead(
    world: World, subscription: Subscription, stream: int
) -> list[SubscriptionReport]:
    return [await _consume(world, subscription, stream) for _ in range(ENOUGH)]


def _letters(world: World) -> list[sqlite3.Row]:
    connection = world.app.product().connection
    return list(
        connection.execute(
            "SELECT consumer, event_id, tenant_id, project_id, stream, reason FROM dead_letters "
            "WHERE kind = 'poison_event' ORDER BY consumer"
        )
    )


def _view_events(world: World, project: str) -> list[str]:
    view = world.app.router().projector.view(project)
    rows = view.connection.execute(
        "SELECT event_id FROM project_events WHERE project_id = ?", (project,)
    )
    return [row[0] for row in rows]


def _forged(world: World, task: str) -> Event:
    """An event of globex's project that says tenantId "acme"."""
    return task_completed(
        world.clock, task, caller=Caller(TENANT, "system:x", "c"), project=OTHER_PROJECT
    )


def _mismatch(event: Event) -> str:
    return (
        f"event {event.event_id} of project {OTHER_PROJECT} claims tenant {TENANT!r}, "
        f"but {OTHER_PROJECT} belongs to tenant {OWNER!r}"
    )


async def test_an_event_claiming_another_tenant_reaches_no_subscription_of_that_tenant(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's webhook subscription to task.completed, and globex's project on the stream
    world.subscribe("hook", webhook(receiver.url))
    # WHEN an event of globex's project that says tenantId "acme" is put on its stream
    forged = _forged(world, "t1")
    await _put(world, STREAM, forged)
    reactions = await _consume_until_dead(world, Subscription.REACTIONS, STREAM)
    projector = await _consume_until_dead(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
    # THEN no reaction was taken for acme: nothing matched, nothing was delivered
    assert receiver.received == []
    assert [(r.applied, r.failed) for r in reactions] == [(0, 1)] * ENOUGH
    assert [r.dead_lettered for r in reactions] == [0, 0, 0, 0, 1]
    # AND globex's view did not change
    assert [p.applied for p in projector] == [0] * ENOUGH
    assert _view_events(world, OTHER_PROJECT) == []
    # AND each subscription filed exactly one poison letter naming the mismatch, under no
    # tenant (least of all the forged one) and no project
    letters = _letters(world)
    assert [(row["consumer"], row["event_id"]) for row in letters] == [
        ("project-view-projector", forged.event_id),
        ("reactions", forged.event_id),
    ]
    for row in letters:
        assert row["tenant_id"] is None and row["project_id"] is None
        assert row["reason"] == _mismatch(forged)


async def test_an_event_on_another_projects_stream_is_not_applied(world: World) -> None:
    # GIVEN an event of acme's project, put on a stream that is not the project's
    event = task_completed(world.clock, "t1")
    elsewhere = (STREAM + 1) % 8
    await _put(world, elsewhere, event)
    # WHEN the projector reads that stream until the 5th failure
    reports = await _consume_until_dead(world, Subscription.PROJECT_VIEW_PROJECTOR, elsewhere)
    # THEN it was never applied to the project's view
    assert [(r.applied, r.failed) for r in reports] == [(0, 1)] * ENOUGH
    assert reports[-1].dead_lettered == 1
    assert _view_events(world, PROJECT) == []
    # AND its one poison letter, filed under the stream read, names both streams
    (letter,) = _letters(world)
    assert letter["stream"] == event_stream_name(elsewhere)
    assert letter["tenant_id"] is None
    assert (
        f"sits on {event_stream_name(elsewhere)}, but project {PROJECT}'s stream is "
        f"{event_stream_name(STREAM)}"
    ) in letter["reason"]


async def test_an_event_of_a_project_without_a_root_is_refused_with_its_reason(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and an event of a project this deployment never created,
    # on the stream that project would have
    world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1", project=NOWHERE)
    await _put(world, STREAM, event)
    # WHEN the reactions and the projector read it until the 5th failure
    reactions = await _consume_until_dead(world, Subscription.REACTIONS, STREAM)
    projector = await _consume_until_dead(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
    # THEN nothing was delivered and nothing applied
    assert receiver.received == []
    assert [r.applied for r in reactions + projector] == [0] * 2 * ENOUGH
    assert _view_events(world, NOWHERE) == []
    # AND each letter says why, under no tenant
    letters = _letters(world)
    assert [row["consumer"] for row in letters] == ["project-view-projector", "reactions"]
    for row in letters:
        assert row["tenant_id"] is None
        assert row["reason"] == (
            f"event {event.event_id} claims tenant {TENANT!r}, but project {NOWHERE} has no "
            "project root here, so nothing vouches for its tenant"
        )


async def test_a_genuine_event_of_the_same_project_still_reacts_and_applies(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and in one batch a genuine event of acme's project beside a
    # forged one of the same project that claims globex
    world.subscribe("hook", webhook(receiver.url))
    genuine = task_completed(world.clock, "t1")
    forged = task_completed(world.clock, "t2", caller=Caller(OWNER, "system:x", "c"))
    await _put(world, STREAM, genuine, forged)
    # WHEN the reactions and the projector read the batch
    reacted = await _consume(world, Subscription.REACTIONS, STREAM)
    applied = await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
    # THEN the genuine event was delivered and applied, and only the forged one failed
    assert (reacted.fetched, reacted.applied, reacted.failed) == (2, 1, 1)
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1"]
    assert (applied.fetched, applied.applied, applied.failed) == (2, 1, 1)
    assert _view_events(world, PROJECT) == [genuine.event_id]
    assert _letters(world) == []  # one failure is not a dead letter


async def test_a_forged_event_reaches_neither_the_causal_router_nor_the_archive(
    world: World,
) -> None:
    # GIVEN an event of globex's project that says tenantId "acme": a failed task, which the
    # causal router would answer with a change.settle command
    ctx = FactContext(Caller(TENANT, "system:x", "c"), OTHER_PROJECT, world.clock.now())
    forged = ctx.fact(
        "task.failed", {"reason": "boom"}, change_id=f"{OTHER_PROJECT}-chg-1", task_id="t1"
    )
    await _put(world, STREAM, forged)
    # WHEN the causal router and the audit-archiver read it until the 5th failure
    causal = await _consume_until_dead(world, Subscription.CAUSAL_ROUTER, STREAM)
    archiver = await _consume_until_dead(world, Subscription.AUDIT_ARCHIVER, STREAM)
    # THEN no command was sent and nothing was archived
    assert [(r.applied, r.failed) for r in causal + archiver] == [(0, 1)] * 2 * ENOUGH
    js = (await world.app.nats()).jetstream()
    assert (await js.stream_info(COMMAND_STREAM)).state.messages == 0
    reader = ArchiveReader(world.app.s3(), world.app.settings.evidence_bucket)
    assert list(reader.list_objects()) == []
    # AND each filed its poison letter naming the mismatch, under no tenant
    letters = _letters(world)
    assert [row["consumer"] for row in letters] == ["audit-archiver", "causal-router"]
    assert {(row["tenant_id"], row["reason"]) for row in letters} == {(None, _mismatch(forged))}


async def test_a_rewind_refuses_a_forged_event_and_files_no_dead_letter(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and a genuine event of acme's project and a forged one of
    # globex's that claims acme on their stream, never read by the live cursor
    world.subscribe("hook", webhook(receiver.url))
    genuine, forged = task_completed(world.clock, "t1"), _forged(world, "t2")
    await _put(world, STREAM, genuine, forged)
    # WHEN an operator rewinds the reactions to the stream's start
    report = await rewind(
        world.app,
        stream_index=STREAM,
        subscription=Subscription.REACTIONS,
        to_seq=1,
        dry_run=False,
    )
    # THEN only the genuine event was delivered; the forged one is reported with its reason
    assert (report.scanned, report.applied, report.failed) == (2, 1, 1)
    assert report.errors == [f"{forged.event_id}: {_mismatch(forged)}"]
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1"]
    # AND a replay leaves the dead letters to the live cursor
    assert _letters(world) == []


async def test_an_archive_replay_refuses_a_forged_event_archived_before_the_check(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and in the archive of the projects' stream a genuine event
    # beside a forged one (as an archiver wrote every event it read before this check, or
    # as anyone with write rights on the bucket could)
    world.subscribe("hook", webhook(receiver.url))
    genuine, forged = task_completed(world.clock, "t1"), _forged(world, "t2")
    writer = ArchiveWriter(world.app.s3(), world.app.settings.evidence_bucket)
    writer.write_batch(STREAM, [genuine, forged])
    # WHEN the archive range is replayed into the reactions
    report = await replay_archive(
        world.app,
        stream_index=STREAM,
        subscription=Subscription.REACTIONS,
        start=START - timedelta(hours=1),
        end=START + timedelta(hours=1),
        dry_run=False,
    )
    # THEN only the genuine event was delivered; the forged one is reported with its reason
    assert (report.scanned, report.applied, report.failed) == (2, 1, 1)
    assert report.errors == [f"{forged.event_id}: {_mismatch(forged)}"]
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1"]


async def test_a_root_that_cannot_be_read_now_retries_its_record_and_fails_nothing(
    tmp_path: Path,
    settings: Settings,
    clock: ManualClock,
    s3_server: S3ServerProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN the deployed journal mode (EFS: DELETE, where a writer blocks readers), and
    # globex's root held by a writer past the busy timeout
    world = await _build(
        tmp_path, settings, clock, s3_server, journal_mode="DELETE", sqlite_busy_timeout_ms=50
    )
    try:
        root = ProjectRoot.ref_for(OTHER_PROJECT).path(world.app.settings.state_dir)
        holder = sqlite3.connect(root, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        # AND a genuine event of each project on their stream
        acme = task_completed(world.clock, "t1")
        globex = task_completed(
            world.clock, "t2", caller=Caller(OWNER, "system:x", "c"), project=OTHER_PROJECT
        )
        await _put(world, STREAM, acme, globex)
        # WHEN the projector reads the stream more often than the failures allowed
        reports = [
            await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
            for _ in range(ENOUGH + 1)
        ]
        # THEN acme's event applied at once; globex's was retried each time, never failed
        assert [(r.applied, r.retried, r.failed) for r in reports] == [(1, 1, 0)] + [
            (0, 1, 0)
        ] * ENOUGH
        state = world.app.router().stream_state(STREAM).connection
        assert state.execute("SELECT COUNT(*) FROM k2_batch_failures").fetchone()[0] == 0
        assert _letters(world) == []
        # AND each retry says why: the root that could not be read, for which event
        why = (
            f"{Subscription.PROJECT_VIEW_PROJECTOR} retries {globex.event_id}: cannot read the "
            f"root of project {OTHER_PROJECT} to check the tenant of event {globex.event_id}: "
        )
        said = [r.getMessage() for r in caplog.records if " retries " in r.getMessage()]
        assert len(said) == ENOUGH + 1
        assert all(line.startswith(why) for line in said), said[0]
        # AND once the root is free, globex's event applies
        holder.execute("ROLLBACK")
        holder.close()
        freed = await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
        assert (freed.applied, freed.failed) == (1, 0)
        assert _view_events(world, OTHER_PROJECT) == [globex.event_id]
    finally:
        await world.app.close()


def test_a_projects_owner_is_read_from_its_root_once() -> None:
    # GIVEN the port to the project roots, which counts its reads
    reads: list[str] = []
    roots = {PROJECT: TENANT}

    def project_tenant(project_id: str) -> str | None:
        reads.append(project_id)
        return roots.get(project_id)

    owners = ProjectOwners(project_tenant)
    # WHEN a project's records are checked again and again, and one of an unknown project
    for _ in range(3):
        assert owners.home(PROJECT) == (TENANT, STREAM)
        assert owners.home(NOWHERE) is None
    # THEN the known project's root was read once; the unknown one is asked each time (its
    # root may be created later), and a fresh read goes to the root
    assert reads == [PROJECT, NOWHERE, NOWHERE, NOWHERE]
    assert owners.home(PROJECT, fresh=True) == (TENANT, STREAM)
    assert reads.count(PROJECT) == 2
    # AND the known project's events, read from its stream, are taken without reading its
    #   root again: one lookup of the kept owner each
    ctx = FactContext(Caller(TENANT, "system:test", "corr-hot"), PROJECT, START)
    for n in range(3):
        event = ctx.fact("agent.woke", {"agentId": f"a-{n}"}, change_id="c1", key=str(n))
        taken = checked_record(cast(Any, None), n, event, read_from=STREAM, owners=owners)
        assert (taken.event, taken.error) == (event, None)
    assert reads.count(PROJECT) == 2
