"""Events that are not their project's (issue #21, ../shared/RELIABILITY.md B11).

A probe with publish rights on NATS put an event of tenant B's project carrying
``tenantId: tenant-a`` on the stream, and tenant A's subscription scheduled a delivery; an
event of project A put on project B's stream was applied to A's view. The router is the last
line: it checks every record against its project's root actor and its project's stream, and
refuses what does not fit like a record that does not decode — the 5th failure makes it a
``poison_event`` dead letter filed under no tenant, and no subscription ever sees it.

Real nats-server, real SQLite files, the reactions world of ``integration/test_reactions``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

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
from rhumbatron.domain.facts import Caller
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import event_stream_name, event_stream_subject
from rhumbatron.router.event_router import SubscriptionReport
from rhumbatron.router.handlers import RunContext
from rhumbatron.runtime.clock import ManualClock
from rhumbatron.runtime.settings import Settings

__all__ = ["receiver"]  # the webhook receiver fixture, used by name

pytestmark = pytest.mark.integration

OWNER = "globex"  # the tenant that owns OTHER_PROJECT
ENOUGH = 5  # the spec's 5th failure makes the dead letter


@pytest_asyncio.fixture
async def world(tmp_path: Path, settings: Settings, clock: ManualClock) -> AsyncIterator[World]:
    clock.set(START)
    built = make_world(tmp_path, settings, clock)
    await built.app.ensure_streams()
    # Tenant globex's project, on the same stream as acme's.
    owner = Caller(OWNER, "user:gina", "corr-globex")
    built.app.project_root(OTHER_PROJECT).create_project(owner, name="Globex web")
    yield built
    await built.app.close()


async def _consume(world: World, subscription: Subscription, stream: int) -> SubscriptionReport:
    """One consume of ``subscription`` on ``stream`` that fetched something (bounded)."""
    router = world.app.router()
    report = SubscriptionReport()
    for _ in range(200):
        run = RunContext(stream, world.clock.now().timestamp(), apply_calls_left=15)
        report = await router.consume(run, subscription, consumes=1, batch=100)
        if report.fetched:
            break
    return report


def _letters(world: World) -> list[sqlite3.Row]:
    connection = world.app.product().connection
    return list(
        connection.execute(
            "SELECT kind, consumer, tenant_id, project_id, reason FROM dead_letters "
            "WHERE kind = 'poison_event' ORDER BY consumer"
        )
    )


def _view_events(world: World, project: str) -> int:
    view = world.app.router().projector.view(project)
    return int(view.connection.execute("SELECT COUNT(*) FROM project_events").fetchone()[0])


async def test_an_event_claiming_another_tenant_reaches_no_subscription_of_that_tenant(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's webhook subscription to task.completed, and globex's project
    world.subscribe("hook", webhook(receiver.url))
    # WHEN an event of globex's project that says tenantId "acme" is put on the stream
    forged = task_completed(
        world.clock, "t1", caller=Caller(TENANT, "system:x", "c"), project=OTHER_PROJECT
    )
    await world.publish(forged)
    reports = [await _consume(world, Subscription.REACTIONS, STREAM) for _ in range(ENOUGH)]
    projector = [
        await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM) for _ in range(ENOUGH)
    ]
    # THEN no reaction was taken for acme: the receiver saw nothing
    assert receiver.received == []
    assert [r.failed for r in reports] == [1] * ENOUGH
    assert reports[-1].dead_lettered == 1
    # AND globex's view did not change
    assert [p.applied for p in projector] == [0] * ENOUGH
    assert _view_events(world, OTHER_PROJECT) == 0
    # AND each subscription filed one poison letter, naming the mismatch, under no tenant
    letters = _letters(world)
    assert [row["consumer"] for row in letters] == ["project-view-projector", "reactions"]
    for row in letters:
        assert row["tenant_id"] is None and row["project_id"] is None
        assert f"claims tenant {TENANT!r}" in row["reason"]
        assert f"belongs to tenant {OWNER!r}" in row["reason"]


async def test_an_event_on_another_projects_stream_is_not_applied(world: World) -> None:
    # GIVEN acme's project, and an event of it put on a stream that is not its own
    event = task_completed(world.clock, "t1")
    world.app.project_root(PROJECT).create_project(
        Caller(TENANT, "user:ann", "c"), name="Acme web"
    )
    elsewhere = (STREAM + 1) % 8
    js = (await world.app.nats()).jetstream()
    await js.publish(
        event_stream_subject(elsewhere), event.to_json(), headers={"Nats-Msg-Id": event.event_id}
    )
    # WHEN the projector reads that stream until the 5th failure
    reports = [
        await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, elsewhere)
        for _ in range(ENOUGH)
    ]
    # THEN it was never applied to the project's view
    assert [r.applied for r in reports] == [0] * ENOUGH
    assert _view_events(world, PROJECT) == 0
    # AND its poison letter names both streams
    (letter,) = _letters(world)
    assert event_stream_name(elsewhere) in letter["reason"]
    assert f"the project's stream is {event_stream_name(STREAM)}" in letter["reason"]


async def test_a_reaction_to_a_project_without_a_root_is_refused_with_its_reason(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and an event of a project this deployment never created,
    # put on the stream by hand (World.publish would create its root)
    world.subscribe("hook", webhook(receiver.url))
    nowhere = next(
        p for p in (f"proj-nowhere-{n}" for n in range(100)) if _stream_of(p) == STREAM
    )
    event = task_completed(world.clock, "t1", project=nowhere)
    js = (await world.app.nats()).jetstream()
    await js.publish(
        event_stream_subject(STREAM), event.to_json(), headers={"Nats-Msg-Id": event.event_id}
    )
    # WHEN the reactions read it until the 5th failure
    for _ in range(ENOUGH):
        await _consume(world, Subscription.REACTIONS, STREAM)
    # THEN nothing was delivered, and the letter says why
    assert receiver.received == []
    (letter,) = _letters(world)
    assert f"{nowhere!r}, which has no project root here" in letter["reason"]


async def test_a_genuine_event_of_the_same_projects_still_reacts_and_applies(
    world: World, receiver: Receiver
) -> None:
    # GIVEN acme's subscription, and an event of acme's own project
    world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    await world.publish(event)  # creates acme's project root for it
    # WHEN the reactions and the projector read it
    reacted = await _consume(world, Subscription.REACTIONS, STREAM)
    applied = await _consume(world, Subscription.PROJECT_VIEW_PROJECTOR, STREAM)
    # THEN it was delivered and applied, and no letter was written
    assert (reacted.applied, reacted.failed) == (1, 0)
    assert [body["subject"]["id"] for _, body in receiver.received] == ["t1"]
    assert (applied.applied, applied.failed) == (1, 0)
    assert _letters(world) == []


def _stream_of(project: str) -> int:
    from rhumbatron.protocol.ids import stream_index

    return stream_index(project)
