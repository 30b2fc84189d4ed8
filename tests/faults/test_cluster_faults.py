"""F2: a 3-node JetStream cluster on loopback (R3 streams, ``sync_interval: always``).

SIGKILL the stream leader during 1,000 publishes; separately kill 2 of 3 nodes and restart
them. No acknowledged event is lost, the stream still exists, and each actor's events stay in
outbox order. A quorum loss burns no publish attempt; a node that does not sync every write
is refused at start-up; a replica that lost acknowledged events is found and named, event by
event (reconciliation); the router and a command queue draining while a stream's leader dies
lose and double nothing, and carry on by themselves. Every node is the same ``nats-server``
binary, on its own loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from rhumbatron.actors.resource_shard import ResourceShard, change_resource_key
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.settings import ApiTokenGrant, Settings, load_settings
from rhumbatron.errors import NatsUnavailableError, UnsafeStorageError
from rhumbatron.messaging.commands import CommandBus
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.messaging.log_state import read_replica_states, read_stream_ids
from rhumbatron.messaging.streams import COMMAND_STREAM
from rhumbatron.operator.log_repair import move_leader
from rhumbatron.protocol.envelopes import Command
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.protocol.queue_consumers import consumer_name
from rhumbatron.router.event_router import EventRouter
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess, start_cluster
from rhumbatron_dev.local.s3_server import S3ServerProcess

from .test_router_faults import (
    Stack,
    archived_once,
    assert_claimed_once_each,
    assert_views_exact,
    drain_until_settled,
    events_applied,
    make_events,
    make_stack,
    projects_on_one_stream,
    publish,
)
from .worker import (
    CommandEffects,
    outbox_rows,
    read_project_stream,
    wait_until,
    write_change_events,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

PROJECT = "f2-cluster"
CLUSTER = "rhumbatron-f2"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NatsServerProcess]]:
    """Three routed nodes, JetStream fsyncing every write."""
    nodes = start_cluster(tmp_path, cluster_name=CLUSTER)
    yield nodes
    for node in nodes:
        node.stop()


def _cluster_stack(
    tmp_path: Path, cluster: list[NatsServerProcess], s3_server: S3ServerProcess
) -> Stack:
    """The router tests' stack on the cluster's nodes, with R3 streams."""
    return make_stack(
        tmp_path,
        cluster[0],
        s3_server,
        nats_url=",".join(node.url for node in cluster),
        stream_replicas=3,
    )


def _settings(tmp_path: Path, nodes: list[NatsServerProcess]) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=",".join(node.url for node in nodes),
        stream_replicas=3,
        # A leader election stalls writes for seconds: an ack wait must not give up early.
        publish_ack_timeout_s=3,
        # Small batches: publishing 1,000 events takes long enough to kill a node mid-way.
        publish_max_rows_per_project=20,
    )


async def _streams_ready(app: Rhumbatron, *, timeout_s: float = 30) -> None:
    """Create the R3 streams once the cluster has elected its meta leader; a durability
    refusal ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await app.ensure_streams()
            return
        except UnsafeStorageError:
            raise
        except Exception as exc:  # no meta leader elected yet: JetStream answers with errors
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster never accepted the streams: {exc}") from exc
            await asyncio.sleep(0.2)  # polling the cluster coming up, with a deadline


def _shards(app: Rhumbatron, count: int) -> list[ResourceShard]:
    shards = {}
    change = 0
    while len(shards) < count:  # changes spread over distinct shard files
        shard = app.resource_shard(PROJECT, change_resource_key(f"chg-{change}"))
        shards.setdefault(shard.ref, (shard, f"chg-{change}"))
        change += 1
    return [shard for shard, _ in shards.values()]


def _node_named(nodes: list[NatsServerProcess], name: str) -> NatsServerProcess:
    return next(node for node in nodes if node.name == name)


async def _publish_until_done(app: Rhumbatron, total: int, *, timeout_s: float) -> None:
    """The every-minute scan, again and again, until every row is published.

    A leader election takes seconds of real time, so these tests run on the system clock:
    the publisher's real backoffs (1 s, 2 s, 4 s …) have to ride it out, as in production.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await app.fire_due_alarms()
        published = sum(
            1
            for ref in app.actor_refs()
            for row in outbox_rows(app.actor(ref))
            if row["state"] == "published"
        )
        if published == total:
            return
        failed = [
            row["last_error"]
            for ref in app.actor_refs()
            for row in outbox_rows(app.actor(ref))
            if row["state"] == "failed"
        ]
        assert not failed, f"rows gave up during the election: {failed[:1]}"
        await asyncio.sleep(0.1)  # the next scan; backoffs are measured on the real clock
    raise AssertionError(f"not everything was published within {timeout_s}s")


async def test_killing_the_stream_leader_during_publishing_loses_no_acknowledged_event(
    tmp_path: Path, cluster: list[NatsServerProcess]
) -> None:
    # GIVEN R3 streams on the cluster and 1,000 events in four actors of one project
    app = bootstrap(_settings(tmp_path, cluster))
    try:
        await _streams_ready(app)
        shards = _shards(app, 4)
        outbox_order = {
            shard.ref: write_change_events(shard, f"change-{n}", 250)
            for n, shard in enumerate(shards)
        }
        stream = event_stream_name(stream_index(PROJECT))
        watcher = await connect_nats(app.settings, name="f2-watcher")
        js = watcher.jetstream()

        # WHEN publishing runs and, once some events are stored, the stream leader is killed
        publishing = asyncio.create_task(_publish_until_done(app, 1_000, timeout_s=90))
        deadline = time.monotonic() + 30
        while (await js.stream_info(stream)).state.messages < 100:
            assert time.monotonic() < deadline, "publishing never started"
            await asyncio.sleep(0.01)  # polling the stream's progress
        info = await js.stream_info(stream)
        victim = _node_named(cluster, info.cluster.leader or "")  # type: ignore[union-attr]
        victim.kill()
        assert info.state.messages < 1_000, "publishing finished before the kill"
        await publishing
        victim.start()

        # THEN every event is on the stream exactly once, each actor's in outbox order,
        # and every row the publisher marked published (acknowledged) is among them
        on_stream = await read_project_stream(js, PROJECT)
        assert len(on_stream) == 1_000
        assert len(set(on_stream)) == 1_000
        position = {event_id: i for i, event_id in enumerate(on_stream)}
        for ref, ids in outbox_order.items():
            assert [position[i] for i in ids] == sorted(position[i] for i in ids), ref.key
        await watcher.close()
    finally:
        await app.close()


async def test_two_of_three_nodes_killed_and_restarted_keep_the_stream_and_its_events(
    tmp_path: Path, cluster: list[NatsServerProcess]
) -> None:
    # GIVEN 300 acknowledged events on an R3 stream
    app = bootstrap(_settings(tmp_path, cluster))
    try:
        await _streams_ready(app)
        (shard,) = _shards(app, 1)
        written = write_change_events(shard, "change-0", 300)
        await _publish_until_done(app, 300, timeout_s=30)
    finally:
        await app.close()

    # WHEN two of the three nodes are SIGKILLed and started again
    for node in cluster[:2]:
        node.kill()
    for node in cluster[:2]:
        node.start()

    # THEN the stream still exists and holds every acknowledged event, in order
    app = bootstrap(_settings(tmp_path, cluster))
    try:
        nc = await app.nats()
        js = nc.jetstream()
        deadline = time.monotonic() + 30
        while True:
            try:
                on_stream = await read_project_stream(js, PROJECT)
                if len(on_stream) == 300:
                    break
            except Exception:  # the restarted nodes are still electing a leader
                pass
            assert time.monotonic() < deadline, "the stream did not come back"
            await asyncio.sleep(0.2)  # polling the cluster's recovery, with a deadline
        assert on_stream == written
    finally:
        await app.close()


async def test_a_quorum_loss_longer_than_the_backoff_budget_burns_no_attempt(
    tmp_path: Path, cluster: list[NatsServerProcess]
) -> None:
    # GIVEN R3 streams, 200 events in one actor, and a backoff budget of well under a second
    # (10 attempts of 10 ms doubling to at most 50 ms): were a lost quorum counted as
    # refusals, every row would be failed long before the outage ends
    settings = _settings(tmp_path, cluster).model_copy(
        update={
            "outbox_backoff_initial_s": 0.01,
            "outbox_backoff_max_s": 0.05,
            "publish_ack_timeout_s": 0.5,
            "publish_unavailable_wait_s": 1.0,
        }
    )
    app = bootstrap(settings)
    try:
        await _streams_ready(app)
        (shard,) = _shards(app, 1)
        written = write_change_events(shard, "change-0", 200)

        # WHEN two of the three nodes die, and the publisher keeps running for 4 s of outage
        for node in cluster[:2]:
            node.kill()
        outage_ends = time.monotonic() + 4
        runs = 0
        while time.monotonic() < outage_ends:
            await app.fire_due_alarms()
            runs += 1

        # THEN no row counted an attempt or kept an error, and the rows not published are
        # still pending (not retry_wait, not failed)
        rows = outbox_rows(shard)
        assert runs >= 2
        assert {(row["attempts"], row["last_error"]) for row in rows} == {(0, None)}
        assert {row["state"] for row in rows} <= {"pending", "published"}
        assert any(row["state"] == "pending" for row in rows)

        # WHEN the nodes come back
        for node in cluster[:2]:
            node.start()
        await _publish_until_done(app, 200, timeout_s=60)

        # THEN every event is on the stream once, in outbox order
        js = (await app.nats()).jetstream()
        assert await read_project_stream(js, PROJECT) == written
    finally:
        await app.close()


async def test_a_cluster_with_one_node_not_syncing_every_write_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    # GIVEN a cluster whose node1 syncs every 2 minutes (the default) and the others always
    nodes = start_cluster(tmp_path, cluster_name=CLUSTER, sync_intervals=("always", "2m", "always"))
    monitors = [f"http://127.0.0.1:{node.http_port}" for node in nodes]
    try:
        # WHEN a function starts with every node's monitor URL, THEN start-up refuses,
        # naming node1 and its URL, before any stream is made
        every = _settings(tmp_path, nodes).model_copy(
            update={"require_durable_jetstream": True, "nats_monitor_urls": ",".join(monitors)}
        )
        app = bootstrap(every)
        try:
            with pytest.raises(UnsafeStorageError, match=rf"^nats-server node1 \({monitors[1]}\)"):
                await app.ensure_streams()
        finally:
            await app.close()
        # WHEN node1's URL is left out, THEN its replicas give it away: refused, naming it
        listed = every.model_copy(
            update={"nats_monitor_urls": ",".join([monitors[0], monitors[2]])}
        )
        app = bootstrap(listed)
        try:
            with pytest.raises(UnsafeStorageError, match=r"has a replica on node1, whose"):
                await _streams_ready(app)
        finally:
            await app.close()
    finally:
        for node in nodes:
            node.stop()


async def _replica_of(
    app: Rhumbatron, stream: str, node: str, last_seq: int, *, messages: int = 0
) -> None:
    """Wait until ``node``'s own copy of ``stream`` reaches ``last_seq`` and holds at least
    ``messages`` (a follower applies what its leader stored a moment later)."""
    deadline = time.monotonic() + 30
    while True:
        states, _ = read_replica_states(app.settings.monitor_urls, [stream])
        if any(
            s.node == node and s.last_seq >= last_seq and s.messages >= messages for s in states
        ):
            return
        assert time.monotonic() < deadline, f"{node} never reported {stream} again"
        await asyncio.sleep(0.2)  # polling the restarted node, with a deadline


#: Times the graceful-stop-and-cut fault is applied before a run gives up on seeing a loss.
CUT_TRIES = 4


async def _cut_newest_events(
    app: Rhumbatron, stream: str, victim: NatsServerProcess, total: int
) -> int:
    """Stop ``victim`` gracefully, cut its newest block file by about eight events, start it,
    and return how many events its copy lost inside its sequence range.

    The loss shows only when the node's shutdown snapshot of the stream's raft group won its
    race with the raft node closing (nats-server's ``doSnapshot`` on a clean stop is best
    effort): without that snapshot the restarted node replays the cut events from its raft
    log and holds them all again. Such a run applies the fault again, up to
    :data:`CUT_TRIES` times; the node's own ``/jsz`` says which happened.
    """
    for _ in range(CUT_TRIES):
        victim.stop()
        [block] = sorted(victim.store_dir.rglob(f"streams/{stream}/msgs/*.blk"))[-1:]
        size = block.stat().st_size
        os.truncate(block, size - 8 * size // total)
        victim.start()
        await _replica_of(app, stream, victim.name, total)
        states, _ = read_replica_states(app.settings.monitor_urls, [stream])
        [copy] = [state for state in states if state.node == victim.name]
        if copy.holes:
            return copy.holes
    raise AssertionError(
        f"{victim.name} replayed the cut events from its raft log {CUT_TRIES} times in a row: "
        "its shutdown snapshot never won the race, so no loss could be made to find"
    )


async def test_a_replica_that_lost_acknowledged_events_is_found_and_named_by_id(
    tmp_path: Path, cluster: list[NatsServerProcess]
) -> None:
    # GIVEN 300 acknowledged events on an R3 stream, every node's monitor known
    monitors = ",".join(f"http://127.0.0.1:{node.http_port}" for node in cluster)
    settings = _settings(tmp_path, cluster).model_copy(update={"nats_monitor_urls": monitors})
    app = bootstrap(settings)
    try:
        await _streams_ready(app)
        (shard,) = _shards(app, 1)
        written_since = datetime.now(UTC) - timedelta(minutes=1)
        written = write_change_events(shard, "change-0", 300)
        await _publish_until_done(app, 300, timeout_s=30)
        index = stream_index(PROJECT)
        stream = event_stream_name(index)
        # ... and, once every replica has applied them all, reconciliation finds nothing wrong
        for node in cluster:
            await _replica_of(app, stream, node.name, 300, messages=300)
        [clean] = (await app.reconcile([index])).streams
        # (What each replica reported, should it not be clean: a read error under load shows.)
        assert (clean.expected, clean.has_gap) == (300, False), json.dumps(clean.as_json())
        assert sorted(r.node for r in clean.replicas) == ["node0", "node1", "node2"]
        assert all((r.found, r.missing, r.holes) == (300, (), 0) for r in clean.replicas)

        # WHEN a follower is stopped gracefully, its newest block file cut by about eight
        # events, and it is started again (it rebuilds without them, and tells no client)
        leader = (await (await app.nats()).jetstream().stream_info(stream)).cluster.leader  # type: ignore[union-attr]
        victim = next(node for node in cluster if node.name != leader)
        lost = await _cut_newest_events(app, stream, victim, 300)

        # THEN reconciliation names that replica, how many it lost inside its sequence range,
        # and exactly which events: the newest ones. The others hold all; no event is
        # missing everywhere, so none may be published again.
        found = await app.reconcile([index])
        [damaged] = found.streams
        by_node = {r.node: r for r in damaged.replicas}
        hurt = by_node[victim.name]
        assert hurt.holes == lost
        assert hurt.missing == tuple(written[-lost:])
        assert hurt.found == 300 - lost
        assert all(
            (r.found, r.missing, r.holes) == (300, (), 0) for r in damaged.replicas if r is not hurt
        )
        assert damaged.has_gap and damaged.missing_everywhere == ()

        # WHEN an operator asks for the repair of that report (the damaged node does not lead)
        # (Of that report: a scan right after the damaged node's restart has once in several
        # runs also counted a healthy follower short while the restarted one caught up.)
        planned = await app.repair_log(found, dry_run=True)
        steps = await app.repair_log(found, dry_run=False)

        # THEN the lead stays where it is; the damaged copy is left to rebuild on its node, and
        # nothing is re-published (every event is on a healthy replica)
        for listed in (planned, steps):
            assert [(s.action, s.node, s.done) for s in listed] == [
                ("rebuild_replica", victim.name, False)
            ]
        info = await (await app.nats()).jetstream().stream_info(stream)
        assert info.cluster is not None and info.cluster.leader == leader

        # WHEN the damaged replica comes to lead the stream (from here on, a read through the
        # stream misses what it lost), and an operator asks the API for a dry run, then for
        # the repair
        await move_leader(await app.nats(), stream, victim.name, timeout_s=30)
        async with _operator_api(app) as api:
            ask = {"streams": [index], "dryRun": True}
            dry = await api.post("/reconciliation/repair", json=ask, headers=OPERATOR_HEADERS)
            ask["dryRun"] = False
            real = await api.post("/reconciliation/repair", json=ask, headers=OPERATOR_HEADERS)
            audit = (await api.get("/audit", headers=OPERATOR_HEADERS)).json()["items"]

        # THEN the dry run says the lead moves to a replica that holds every event and does
        # nothing; the repair moves it there; both leave the damaged copy to its node, and
        # both are audited
        healthy = sorted(node.name for node in cluster if node is not victim)
        assert dry.status_code == real.status_code == 200, (dry.text, real.text)
        for answer, moved in ((dry.json(), False), (real.json(), True)):
            assert answer["gap"], answer
            actions = [(s["action"], s["node"] in healthy, s["done"]) for s in answer["steps"]]
            assert actions == [("move_leader", True, moved), ("rebuild_replica", False, False)]
        info = await (await app.nats()).jetstream().stream_info(stream)
        assert info.cluster is not None and info.cluster.leader in healthy
        assert [e["operation"] for e in audit] == ["repair_log", "repair_log"]

        # WHEN the operator rebuilds the damaged copy on its node (the runbook's step 2: stop
        # it, delete its copy of the stream, start it)
        victim.stop()
        [copy] = victim.store_dir.rglob(f"streams/{stream}")
        shutil.rmtree(copy)
        victim.start()
        await _replica_of(app, stream, victim.name, 300, messages=300)

        # THEN every replica holds every event exactly once, in the order it was published,
        # and reconciliation over the API finds no gap
        states, _ = read_replica_states(app.settings.monitor_urls, [stream])
        assert sorted((s.node, s.messages, s.last_seq) for s in states) == [
            (node.name, 300, 300) for node in cluster
        ]
        js = (await app.nats()).jetstream()
        for node in cluster:
            ids = await read_stream_ids(js, stream, since=written_since, on_node=node.name)
            in_order = sorted(ids.sequence_of, key=ids.sequence_of.__getitem__)
            assert in_order == written, f"{node.name}'s copy is not the published order"
        async with _operator_api(app) as api:
            proof = await api.get(f"/reconciliation?stream={index}", headers=OPERATOR_HEADERS)
        assert proof.status_code == 200 and proof.json()["gap"] is False, proof.text
    finally:
        await app.close()


OPERATOR_TOKEN = "operator-token-ffffffffffff"
OPERATOR_HEADERS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@contextlib.asynccontextmanager
async def _operator_api(app: Rhumbatron) -> AsyncIterator[httpx.AsyncClient]:
    """The API on ``app``, called as a platform operator through httpx's ASGI transport."""
    scopes = ("consumers:read", "consumers:write", "audit:read")
    tokens = {OPERATOR_TOKEN: ApiTokenGrant(tenant="*", scopes=scopes)}
    asgi = create_api(app, StaticTokenAuth(tokens), manage_runtime=False)
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        yield client


# -- the consuming side (item 5 of issue #18) ----------------------------------------------


async def _send_once_accepted(bus: CommandBus, command: Command) -> None:
    """Send ``command`` to integration, again while the new stream elects its leader."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await bus.send("integration", command)
            return
        except NatsUnavailableError:  # no stream leader yet: no responders
            assert time.monotonic() < deadline, "the COMMANDS stream never took a command"
            await asyncio.sleep(0.2)  # polling the election, with a deadline


async def _connected_node(app: Rhumbatron, cluster: list[NatsServerProcess]) -> NatsServerProcess:
    """The node the runtime's NATS client is connected to now."""
    port = (await app.nats()).connected_url.port  # type: ignore[union-attr]
    return next(node for node in cluster if node.url.endswith(f":{port}"))


async def _drain_through_faults(router: EventRouter, index: int, *, timeout_s: float) -> int:
    """Drain until the stream's consumers are settled, riding out the errors an election
    raises meanwhile (the router is not restarted: it must resume by itself); the drains
    that raised."""
    deadline = time.monotonic() + timeout_s
    raised = 0
    while True:
        try:
            await drain_until_settled(
                router, index, timeout_s=max(1.0, deadline - time.monotonic())
            )
            return raised
        except AssertionError:
            raise
        except Exception:  # between leaders: JetStream does not answer yet
            raised += 1
            assert time.monotonic() < deadline, "the router never drained after the fault"
            await asyncio.sleep(0.2)  # the next try, bounded by the deadline


@pytest.mark.parametrize("whose", ["stream", "projector consumer"])
async def test_the_router_draining_while_a_leader_dies_loses_and_doubles_nothing(
    tmp_path: Path, cluster: list[NatsServerProcess], s3_server: S3ServerProcess, whose: str
) -> None:
    # GIVEN R3 streams (their consumers R3 too) and 300 events of two projects on one stream
    stack = _cluster_stack(tmp_path, cluster, s3_server)
    projects = projects_on_one_stream(2, prefix="cluster-drain")
    index = stream_index(projects[0])
    events = make_events(projects, 150)
    app = stack.app()
    try:
        await _streams_ready(app)
        await publish(app, events)
        router = app.router()

        # WHEN the router drains, and once it has begun, the leader of the stream (or of the
        # projector's R3 durable consumer) is SIGKILLed
        draining = asyncio.create_task(_drain_through_faults(router, index, timeout_s=90))
        await wait_until(
            lambda: events_applied(stack.settings, projects[0]) > 0,
            timeout_s=30,
            what="the projector to apply something",
        )
        js = (await app.nats()).jetstream()
        stream = event_stream_name(index)
        info = (
            await js.consumer_info(stream, Subscription.PROJECT_VIEW_PROJECTOR.value)
            if whose == "projector consumer"
            else await js.stream_info(stream)
        )
        victim = _node_named(cluster, info.cluster.leader or "")  # type: ignore[union-attr]
        victim.kill()
        applied_at_kill = sum(events_applied(stack.settings, p) for p in projects)
        assert applied_at_kill < len(events), "the drain finished before the fault"
        await draining
        victim.start()

        # THEN every event was applied once to its view, claimed once by each consumer, and
        # archived: nothing lost, nothing doubled, and the same router carried on by itself
        assert_views_exact(stack.settings, events)
        assert_claimed_once_each(stack.settings, events, tuple(Subscription))
        assert sorted(archived_once(stack, index)) == sorted(e.event_id for e in events)
    finally:
        await app.close()


@pytest.mark.parametrize("whose", ["stream", "queue consumer"])
async def test_a_queue_draining_while_a_leader_dies_does_each_command_once(
    tmp_path: Path, cluster: list[NatsServerProcess], whose: str
) -> None:
    # GIVEN 60 commands on an R3 COMMANDS stream (its queue consumers R3 too), a 3 s ack
    # wait, and a handler whose effect is keyed on the command ID
    app = bootstrap(_queue_settings(_settings(tmp_path, cluster)))
    effects = CommandEffects(tmp_path)
    try:
        await _streams_ready(app)
        ids = await _send_commands(app, 60)
        runtime = await app.queue_runtime()

        # WHEN the queue is polled, and the stream's leader is SIGKILLed once some are done
        # (The drain holds after 5 effects until the kill: a fast handler cannot finish the
        # queue while the test looks the leader up.)
        killed = asyncio.Event()
        draining = asyncio.create_task(
            _drain_queue(runtime, effects, ids, hold_at=5, resume=killed)
        )
        await wait_until(lambda: len(effects.effects()) >= 5, timeout_s=30, what="some effects")
        js = (await app.nats()).jetstream()
        info = (
            await js.consumer_info(COMMAND_STREAM, consumer_name("integration"))
            if whose == "queue consumer"
            else await js.stream_info(COMMAND_STREAM)
        )
        _node_named(cluster, info.cluster.leader or "").kill()  # type: ignore[union-attr]
        done_at_kill = len(effects.effects())
        killed.set()
        await draining

        # THEN every command's effect happened exactly once, and the same runtime carried on
        assert done_at_kill < len(ids), "the queue drained before the kill"
        assert Counter(effects.effects()) == dict.fromkeys(ids, 1)
    finally:
        await app.close()


def _queue_settings(settings: Settings) -> Settings:
    """A 3 s ack wait and no retry delay on integration: what a dead leader held comes back
    within a bounded drain."""
    return settings.model_copy(
        update={
            "command_ack_wait_s": 3.0,
            "command_in_progress_s": 1.0,
            "queue_retry_delay_s": {"integration": 0.0},
        }
    )


async def _send_commands(app: Rhumbatron, count: int) -> list[str]:
    """``count`` agent.wake commands on integration, each sent once the stream takes it."""
    bus = await app.command_bus()
    ids = [f"cmd_cluster_{n:02d}" for n in range(count)]
    for command_id in ids:
        await _send_once_accepted(
            bus,
            Command.create(
                command_id=command_id,
                command_type="agent.wake",
                project_id=PROJECT,
                created_at=datetime.now(UTC),
                payload={"agentId": "agent-1", "reason": "task.ready"},
            ),
        )
    return ids


async def _drain_queue(
    runtime: Any,
    effects: CommandEffects,
    ids: list[str],
    *,
    hold_at: int | None = None,
    resume: asyncio.Event | None = None,
) -> None:
    """Poll integration until every command's effect is there, riding out an election.

    With ``hold_at``, the drain stops polling once that many effects are there, until
    ``resume`` is set: the fault lands with the queue part-way drained, however fast the
    handler runs."""
    deadline = time.monotonic() + 60
    while len(set(effects.effects())) < len(ids):
        assert time.monotonic() < deadline, f"not drained: {len(effects.effects())}"
        if hold_at is not None and resume is not None and len(effects.effects()) >= hold_at:
            await resume.wait()
        try:
            report = await runtime.poll("integration", effects)
        except Exception:  # between leaders: JetStream does not answer yet
            await asyncio.sleep(0.2)  # the next poll, bounded by the deadline
            continue
        if not report.fetched:
            await asyncio.sleep(0.05)  # a dead leader's deliveries return after the ack wait


async def test_a_node_paused_30_s_under_the_router_and_a_queue_costs_no_effect(
    tmp_path: Path, cluster: list[NatsServerProcess], s3_server: S3ServerProcess
) -> None:
    # GIVEN events on an R3 stream and commands on R3 COMMANDS, both draining from one runtime
    stack = _cluster_stack(tmp_path, cluster, s3_server)
    projects = projects_on_one_stream(2, prefix="cluster-pause")
    index = stream_index(projects[0])
    events = make_events(projects, 300)
    app = bootstrap(_queue_settings(stack.settings))
    effects = CommandEffects(tmp_path)
    try:
        await _streams_ready(app)
        await publish(app, events)
        ids = await _send_commands(app, 60)
        router, runtime = app.router(), await app.queue_runtime()
        routing = asyncio.create_task(_drain_through_faults(router, index, timeout_s=90))
        await wait_until(
            lambda: events_applied(stack.settings, projects[0]) > 0,
            timeout_s=30,
            what="the router's drain to begin",
        )

        # WHEN the node their client talks to (the hardest to lose) stalls for 30 s, the
        # router mid-drain and the queue starting its drain then
        victim = await _connected_node(app, cluster)
        victim.pause()
        paused_at = time.monotonic()
        assert sum(events_applied(stack.settings, p) for p in projects) < len(events)
        await asyncio.gather(routing, _drain_queue(runtime, effects, ids))
        await asyncio.sleep(max(0.0, 30 - (time.monotonic() - paused_at)))  # the stall's length
        victim.resume()

        # THEN both drained without it, by themselves: every event applied, claimed and
        # archived once, every command's effect once
        assert_views_exact(stack.settings, events)
        assert_claimed_once_each(stack.settings, events, tuple(Subscription))
        assert sorted(archived_once(stack, index)) == sorted(e.event_id for e in events)
        assert Counter(effects.effects()) == dict.fromkeys(ids, 1)
    finally:
        await app.close()
