"""Faults of the event router, against a real nats-server, real SQLite files and moto S3
(RELIABILITY F10, F12, F15, F22).

A crashing router is a separate process (``worker.py route …``) that kills itself at a named
point (``RHUMBATRON_CRASH_AT``); the router that recovers runs in this process. The ack wait
is 2 s in both, so the crashed run's unacknowledged records come back within a bounded poll;
a lease lasts the ack wait too. Events are published as the outbox publisher sends them: the
Event's wire JSON on ``events.NN`` with ``Nats-Msg-Id`` = its ID.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from project_roots import ensure_project_roots
from rhumbatron.archive import ArchiveReader
from rhumbatron.causal.rules import acts_on
from rhumbatron.core.clock import Clock, ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.errors import DeadLetterClosedError
from rhumbatron.messaging.connection import connect_nats
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.product.dead_letters import (
    DeadLetterKind,
    DeadLetterStatus,
    dismiss_dead_letter,
    list_dead_letters,
    poison_dead_letter_id,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import (
    event_stream_name,
    event_stream_subject,
    new_event_id,
    stream_index,
)
from rhumbatron.router.event_router import EventRouter
from rhumbatron.router.handlers import AuditArchiver
from rhumbatron.router.ticks import tick_kind
from rhumbatron.router.view_store import view_store_path
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

from .worker import (
    RoutedLog,
    release_gated,
    run_worker,
    start_worker,
    wait_until,
    worker_env,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

#: The ack wait of every router here, crashed or recovering; a lease lasts as long.
ACK_WAIT_S = 2.0
#: How long a test waits for records JetStream redelivers after the ack wait.
REDELIVERY_BOUND_S = 20.0

PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR
CAUSAL = Subscription.CAUSAL_ROUTER
ARCHIVER = Subscription.AUDIT_ARCHIVER
ANALYTICS = Subscription.ANALYTICS_PROJECTOR


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Stack:
    """What a router test runs on: the servers, and the settings both routers share."""

    nats: NatsServerProcess
    s3: S3ServerProcess
    settings: Settings

    def env(self, **extra: str) -> dict[str, str]:
        """The worker's environment: these settings, plus ``extra`` (``crash_at=…``)."""
        s = self.settings
        return worker_env(
            s,
            router_ack_wait_s=str(s.router_ack_wait_s),
            router_fetch_timeout_s=str(s.router_fetch_timeout_s),
            router_fetch_max_records=str(s.router_fetch_max_records),
            router_nak_delay_s=str(s.router_nak_delay_s),
            s3_endpoint_url=str(s.s3_endpoint_url),
            evidence_bucket=s.evidence_bucket,
            **extra,
        )

    def app(self, clock: Clock | None = None, routed: RoutedLog | None = None) -> Rhumbatron:
        return bootstrap(self.settings, clock=clock, causal_routing=routed)


def make_stack(
    tmp_path: Path, nats: NatsServerProcess, s3: S3ServerProcess, **overrides: Any
) -> Stack:
    bucket = f"evidence-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    values: dict[str, Any] = {
        "state_dir": tmp_path / "state",
        "nats_url": nats.url,
        "router_ack_wait_s": ACK_WAIT_S,
        "router_fetch_timeout_s": 0.5,
        "s3_endpoint_url": s3.endpoint_url,
        "evidence_bucket": bucket,
        **overrides,
    }
    return Stack(nats, s3, load_settings(**values))


# --------------------------------------------------------------------------- events


def projects_on_one_stream(count: int, prefix: str) -> list[str]:
    """``count`` project IDs that all live on the same event stream."""
    by_stream: dict[int, list[str]] = {}
    n = 0
    while True:
        candidate = f"{prefix}-{n}"
        group = by_stream.setdefault(stream_index(candidate), [])
        group.append(candidate)
        if len(group) == count:
            return group
        n += 1


def make_events(projects: list[str], count: int, *, start: int = 0) -> list[Event]:
    """``count`` agent.woke Events, round-robin over ``projects``, 1 ms apart."""
    base = datetime.now(UTC)
    return [
        Event.create(
            event_id=new_event_id(),
            event_type="agent.woke",
            event_version=1,
            tenant_id="tenant-faults",
            project_id=projects[i % len(projects)],
            change_id="c1",
            actor="system:fault-test",
            correlation_id="corr-router-faults",
            timestamp=base + timedelta(milliseconds=i),
            payload={"agentId": f"agent-{i}"},
        )
        for i in range(start, start + count)
    ]


async def publish(app: Rhumbatron, events: list[Event], *, nc: Any = None) -> None:
    """Publish ``events`` as the outbox publisher does (on ``nc``, else the app's connection),
    their projects created first; every one must be new to the stream."""
    ensure_project_roots(app, events)
    js = (nc or await app.nats()).jetstream()
    for event in events:
        ack = await js.publish(
            event_stream_subject(stream_index(event.project_id)),
            event.to_json(),
            headers={"Nats-Msg-Id": event.event_id},
        )
        assert not ack.duplicate, event.event_id


async def publish_raw(nc: Any, index: int, body: bytes, message_id: str | None) -> int:
    """Publish a raw record on stream ``index``; return its stream sequence."""
    headers = {"Nats-Msg-Id": message_id} if message_id else None
    ack = await nc.jetstream().publish(event_stream_subject(index), body, headers=headers)
    return int(ack.seq)


# --------------------------------------------------------------------------- reading state


def _read(path: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` in the file at ``path``; none when a crash left the file without its
    schema (created, schema never committed: the next open creates it)."""
    if not path.exists():
        return []
    with closing(sqlite3.connect(path)) as db:
        if db.execute("PRAGMA user_version").fetchone()[0] == 0:
            return []
        return [tuple(row) for row in db.execute(sql, params)]


def view_path(settings: Settings, project_id: str) -> Path:
    """The view store of the project's stream (one file per stream)."""
    return view_store_path(settings, stream_index(project_id))


def stream_state_path(settings: Settings, index: int) -> Path:
    return settings.state_dir / "router" / f"stream-{index:02d}.sqlite"


def claim_file(settings: Settings, subscription: Subscription, index: int) -> Path:
    """Where ``subscription`` keeps its claims (for the projector: see :func:`claims`)."""
    if subscription in (ANALYTICS, Subscription.REACTIONS):
        return settings.state_dir / "product.sqlite"
    return stream_state_path(settings, index)


def claims(
    settings: Settings, subscription: Subscription, index: int, projects: list[str]
) -> list[tuple[str, str]]:
    """``(event_id, status)`` of every claim of ``subscription`` on stream ``index``."""
    sql = "SELECT event_id, status FROM processed_events WHERE consumer = ?"
    if subscription is PROJECTOR:
        # The view store's claims are its feed rows (a dead letter's is a mark).
        feed = "SELECT event_id, 'done' FROM project_events WHERE project_id = ?"
        rows = [r for p in projects for r in _read(view_path(settings, p), feed, p)]
    else:
        rows = _read(claim_file(settings, subscription, index), sql, subscription.value)
    return [(str(r[0]), str(r[1])) for r in rows]


def view_feed(settings: Settings, project_id: str) -> list[str]:
    """The Event IDs in a project's view feed (``project_events``), in stream order."""
    rows = _read(
        view_path(settings, project_id),
        "SELECT event_id FROM project_events WHERE project_id = ? ORDER BY stream_seq",
        project_id,
    )
    return [str(r[0]) for r in rows]


def events_applied(settings: Settings, project_id: str) -> int:
    rows = _read(
        view_path(settings, project_id),
        "SELECT events_applied FROM view_project WHERE project_id = ?",
        project_id,
    )
    return int(rows[0][0]) if rows else 0


def assert_views_exact(settings: Settings, events: list[Event]) -> None:
    """Every Event is in its project's view once, and the view counted each once."""
    by_project: dict[str, list[str]] = {}
    for event in events:
        by_project.setdefault(event.project_id, []).append(event.event_id)
    for project_id, ids in by_project.items():
        feed = view_feed(settings, project_id)
        assert sorted(feed) == sorted(ids), project_id
        assert events_applied(settings, project_id) == len(ids), project_id


def assert_claimed_once_each(
    settings: Settings,
    events: list[Event],
    subscriptions: tuple[Subscription, ...],
    *,
    causal_acts_on: Callable[[Event], bool] = acts_on,
) -> None:
    """``processed_events`` holds each Event once per consumer, and every claim is done; the
    causal router claims only the Events its rules act on (``causal_acts_on``)."""
    index = stream_index(events[0].project_id)
    projects = sorted({e.project_id for e in events})
    for subscription in subscriptions:
        claimed = [e for e in events if subscription is not CAUSAL or causal_acts_on(e)]
        ids = sorted(e.event_id for e in claimed)
        rows = claims(settings, subscription, index, projects)
        assert sorted(event_id for event_id, _ in rows) == ids, subscription
        assert {status for _, status in rows} <= {"done"}, subscription


def archived_objects(stack: Stack, index: int) -> dict[str, list[str]]:
    """Every archive object of stream ``index``: its key and the Event IDs in it."""
    reader = ArchiveReader(stack.s3.client(), stack.settings.evidence_bucket)
    return {
        parsed.key: [e.event_id for e in reader.read_object(parsed.key)]
        for parsed in reader.list_objects(index)
    }


def archived_once(stack: Stack, index: int) -> list[str]:
    """The Event IDs the archive reader yields for stream ``index`` (it dedupes)."""
    reader = ArchiveReader(stack.s3.client(), stack.settings.evidence_bucket)
    return [e.event_id for e in reader.iter_events(index)]


async def lags_of(router: EventRouter, index: int) -> dict[str, tuple[int, int]]:
    """``consumer -> (num_pending, num_ack_pending)`` of the four consumers on ``index``."""
    stream = event_stream_name(index)
    return {
        lag.consumer: (lag.num_pending, lag.num_ack_pending)
        for lag in await router.consumer_lags()
        if lag.stream == stream
    }


async def drain_until_settled(
    router: EventRouter, index: int, *, timeout_s: float = REDELIVERY_BOUND_S
) -> list[dict[str, Any]]:
    """Drain the router until the four consumers on ``index`` have nothing pending and
    nothing unacknowledged. Records a crashed run left unacknowledged come back only after
    the ack wait (a real server timer), so this polls, with a deadline."""
    rounds: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        rounds.append(await router.drain())
        if set((await lags_of(router, index)).values()) == {(0, 0)}:
            return rounds
        if time.monotonic() > deadline:
            raise AssertionError(
                f"stream {index} not drained after {timeout_s}s: {await lags_of(router, index)}"
            )
        await asyncio.sleep(0.05)  # waiting on JetStream's ack-wait timer, with a deadline


def sweep_minute(settings: Settings, index: int) -> datetime:
    """A UTC minute whose sweep tick visits stream ``index`` and runs all four subscriptions
    (neither the maintenance tick nor a release-sweep tick)."""
    minute = datetime(2026, 1, 1, tzinfo=UTC)
    while True:
        stream, maintenance, release = tick_kind(settings, minute)
        if stream == index and not maintenance and not release:
            return minute
        minute += timedelta(minutes=1)


# --------------------------------------------------------------------------- F10

CRASHES = [
    pytest.param(PROJECTOR, "after_apply", id="projector-after_apply"),
    pytest.param(PROJECTOR, "before_ack", id="projector-before_ack"),
    pytest.param(CAUSAL, "after_claim", id="causal-after_claim"),
    pytest.param(CAUSAL, "after_apply", id="causal-after_apply"),
    pytest.param(CAUSAL, "before_ack", id="causal-before_ack"),
    pytest.param(ARCHIVER, "after_claim", id="archiver-after_claim"),
    pytest.param(ARCHIVER, "after_apply", id="archiver-after_apply"),
    pytest.param(ARCHIVER, "before_ack", id="archiver-before_ack"),
]


@pytest.mark.parametrize(("subscription", "crash_at"), CRASHES)
async def test_router_killed_mid_batch_loses_and_doubles_no_effect(
    tmp_path: Path,
    nats_server: NatsServerProcess,
    s3_server: S3ServerProcess,
    subscription: Subscription,
    crash_at: str,
) -> None:
    # GIVEN 30 Events of two projects on one stream, fetched 10 at a time
    stack = make_stack(tmp_path, nats_server, s3_server, router_fetch_max_records=10)
    projects = projects_on_one_stream(2, prefix="f10")
    index = stream_index(projects[0])
    events = make_events(projects, 30)
    ids = sorted(e.event_id for e in events)
    routed = RoutedLog(tmp_path / "routed.log")
    app = stack.app(routed=routed)
    try:
        await app.ensure_streams()
        await publish(app, events)

        # WHEN a router process consumes the subscription and is killed at the crash point
        crashed = run_worker(
            ["route", "consume", str(index), subscription.value, f"--routed-log={routed.path}"],
            stack.env(crash_at=crash_at),
        )

        # THEN it died there, with the first batch of 10 fetched and none of it acknowledged
        #   (the projector asks for the next 10 before it applies the first, and that request
        #   leaves while the commit's fsync runs: a crash before the ack finds them delivered,
        #   unacknowledged, too; the commit itself runs on the event loop, so a crash right
        #   after it comes before the request leaves)
        assert crashed.returncode == 137, crashed.stderr
        router = app.router()
        lags = await lags_of(router, index)
        prefetched = subscription is PROJECTOR and crash_at == "before_ack"
        assert lags[subscription.value] == ((10, 20) if prefetched else (20, 10))
        first_batch = sorted(e.event_id for e in events[:10])
        left = claims(stack.settings, subscription, index, projects)
        if subscription is PROJECTOR:
            # the claims commit with the view rows, the whole fetch in one COMMIT: both crash
            # points are after it
            assert len(left) == 10
            assert {status for _, status in left} == {"done"}
        elif crash_at == "before_ack":
            assert sorted(e for e, _ in left) == first_batch
            assert {status for _, status in left} == {"done"}
        else:
            # a lease: claimed, its effect (maybe) done, never completed
            assert sorted(e for e, _ in left) == first_batch
            assert {status for _, status in left} == {"claimed"}
        objects_after_crash = archived_objects(stack, index)
        put_before_crash = subscription is ARCHIVER and crash_at != "after_claim"
        if put_before_crash:
            assert [sorted(v) for v in objects_after_crash.values()] == [first_batch]
        else:
            assert objects_after_crash == {}
        routed_before_crash = subscription is CAUSAL and crash_at != "after_claim"
        assert sorted(routed.routed()) == (first_batch if routed_before_crash else [])

        # WHEN a router in this process drains the stream, its clock reading past the ack
        # wait (the leases expired: JetStream redelivers only after it anyway)
        clock = ManualClock(datetime.now(UTC) + timedelta(seconds=ACK_WAIT_S))
        await app.close()
        app = stack.app(clock=clock, routed=routed)
        router = app.router()
        await drain_until_settled(router, index)

        # THEN every Event is in its project's view exactly once
        assert_views_exact(stack.settings, events)
        # ... every consumer holds one done claim per Event, and nothing is dead-lettered
        assert_claimed_once_each(
            stack.settings, events, tuple(Subscription), causal_acts_on=routed.acts_on
        )
        assert list_dead_letters(app.product().connection, status=None) == []

        # ... the causal rules routed every Event; only a crash after routing and before the
        # lease completed routes the crashed batch a second time (CausalRouting.route must be
        # idempotent per Event: its commands carry stable IDs the duplicate window drops)
        times_routed = Counter(routed.routed())
        assert sorted(times_routed) == ids
        twice = sorted(e for e, n in times_routed.items() if n == 2)
        assert max(times_routed.values()) <= 2
        if subscription is CAUSAL and crash_at == "after_apply":
            assert twice == first_batch
        else:
            assert twice == []

        # ... the archive reads back every Event exactly once (the reader dedupes), and every
        # Event sits in at least one object
        assert sorted(archived_once(stack, index)) == ids
        objects = archived_objects(stack, index)
        in_objects = Counter(e for batch in objects.values() for e in batch)
        assert sorted(in_objects) == ids
        archiver = router.handler(index, ARCHIVER)
        assert isinstance(archiver, AuditArchiver)
        rewritten = {e for key, _ in archiver.objects_written for e in objects[key]}
        if subscription is ARCHIVER and crash_at == "after_apply":
            # the PUT happened, the lease never completed: the recovery took the leases over
            # and PUT the crashed batch again. The same Event IDs make the same key, so it
            # overwrote its own object; a batch recomposed on redelivery would make a second
            # object holding some of the same Events (the reader's dedupe covers that)
            assert set(first_batch) <= rewritten
        else:
            # no PUT before the crash, or its lease completed (redelivery = duplicate)
            assert set(in_objects.values()) == {1}, "an Event was archived in two objects"
            assert rewritten == set(ids) - (set(first_batch) if put_before_crash else set())
    finally:
        await app.close()


@pytest.mark.parametrize("subscription", [CAUSAL, ARCHIVER], ids=["causal", "archiver"])
async def test_redelivery_seen_before_the_dead_runs_lease_expires_is_not_acked_as_duplicate(
    tmp_path: Path,
    nats_server: NatsServerProcess,
    s3_server: S3ServerProcess,
    subscription: Subscription,
) -> None:
    # GIVEN a router process killed after claiming a batch of 10 of 30 Events (leases taken
    # with its run's clock reading, for the ack wait)
    stack = make_stack(
        tmp_path, nats_server, s3_server, router_fetch_max_records=10, router_nak_delay_s=0.2
    )
    projects = projects_on_one_stream(2, prefix="lease")
    index = stream_index(projects[0])
    events = make_events(projects, 30)
    ids = sorted(e.event_id for e in events)
    routed = RoutedLog(tmp_path / "routed.log")
    app = stack.app(routed=routed)
    try:
        await app.ensure_streams()
        await publish(app, events)
        crashed = run_worker(
            ["route", "consume", str(index), subscription.value, f"--routed-log={routed.path}"],
            stack.env(crash_at="after_claim"),
        )
        assert crashed.returncode == 137, crashed.stderr
        leases = _read(
            stream_state_path(stack.settings, index),
            "SELECT lease_until_s FROM processed_events WHERE consumer = ?",
            subscription.value,
        )
        assert len(leases) == 10
        lease_until = max(float(r[0]) for r in leases)

        # WHEN JetStream redelivers the batch after the ack wait to a router whose run reads
        # the clock half a second before the dead run's leases expire: a sweep whose clock
        # reading was taken before its earlier subscriptions' work, or a host whose clock is
        # behind (the lease and the redelivery both last the ack wait, so they race)
        await app.close()
        clock = ManualClock(datetime.fromtimestamp(lease_until - 0.5, UTC))
        app = stack.app(clock=clock, routed=routed)
        router = app.router()
        held = await retried_when_redelivered(router, index, subscription, expect=10)

        # THEN the held records are retried (nacked with the delay), not acked as duplicates
        assert held == 10
        leased = _read(
            stream_state_path(stack.settings, index),
            "SELECT COUNT(*) FROM processed_events WHERE consumer = ? AND status = 'claimed'",
            subscription.value,
        )
        assert leased[0][0] == 10

        # WHEN, later, every lease has long expired and the router runs again
        clock.advance(seconds=10 * ACK_WAIT_S)
        await drain_until_settled(router, index)

        # THEN no effect was lost: every Event was routed and archived, every claim is done
        assert set(ids) - set(routed.routed()) == set(), "Events never routed"
        assert set(ids) - set(archived_once(stack, index)) == set(), "Events never archived"
        assert_claimed_once_each(
            stack.settings, events, (CAUSAL, ARCHIVER), causal_acts_on=routed.acts_on
        )
    finally:
        await app.close()


async def retried_when_redelivered(
    router: EventRouter, index: int, subscription: Subscription, *, expect: int
) -> int:
    """Consume ``subscription`` until ``expect`` records came back and were retried; the
    redelivery comes after the ack wait (a real server timer), so this polls, with a
    deadline."""
    retried = 0
    deadline = time.monotonic() + REDELIVERY_BOUND_S
    while retried < expect:
        report = await router.consume(
            router.run_context(index), subscription, consumes=1, batch=expect
        )
        retried += report.retried
        if time.monotonic() > deadline:
            raise AssertionError(f"only {retried} of {expect} records retried")
    return retried


# --------------------------------------------------------------------------- F12


def failure_counts(settings: Settings, index: int, key: str) -> dict[str, int]:
    """``consumer -> failures`` counted for the record ``key`` on stream ``index``."""
    rows = _read(
        stream_state_path(settings, index),
        "SELECT consumer, failures FROM k2_batch_failures WHERE batch_key = ?",
        key,
    )
    return {str(consumer): int(failures) for consumer, failures in rows}


async def test_poison_records_are_dead_lettered_on_the_fifth_failure_and_the_stream_flows(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess
) -> None:
    # GIVEN a stream holding 5 good Events, a record that is not JSON (sent without a
    # Nats-Msg-Id), an Event of an unknown type (with one), then 5 more good Events; and a
    # nack that redelivers at once
    stack = make_stack(tmp_path, nats_server, s3_server, router_nak_delay_s=0.0)
    (project,) = projects_on_one_stream(1, prefix="poison")
    index = stream_index(project)
    good = make_events([project], 10)
    not_json = b'{"eventId": "evt_'
    unknown_id = new_event_id()
    unknown = json.dumps(
        {**good[0].to_wire(), "eventId": unknown_id, "eventType": "agent.exploded"}
    ).encode()
    app = stack.app()
    try:
        await app.ensure_streams()
        nc = await app.nats()
        await publish(app, good[:5])
        not_json_seq = await publish_raw(nc, index, not_json, message_id=None)
        await publish_raw(nc, index, unknown, message_id=unknown_id)
        await publish(app, good[5:])
        poison = {f"seq:{not_json_seq}": not_json, unknown_id: unknown}
        router = app.router()
        minute = sweep_minute(stack.settings, index)
        consumers = {s.value for s in Subscription}

        # WHEN the sweep tick visits the stream once
        first = await router.sweep(now=minute)

        # THEN all four subscriptions applied every good Event, those after the poison too
        for name in consumers:
            report = first.run.subscriptions[name]
            assert (report.applied, report.failed, report.dead_lettered) == (10, 2, 0), name
        assert_views_exact(stack.settings, good)
        assert_claimed_once_each(stack.settings, good, tuple(Subscription))
        assert sorted(archived_once(stack, index)) == sorted(e.event_id for e in good)
        # ... and each poison record failed once per subscription, with no dead letter yet
        for key in poison:
            assert failure_counts(stack.settings, index, key) == dict.fromkeys(consumers, 1)
        product = app.product().connection
        assert list_dead_letters(product, status=None) == []

        # WHEN the tick runs three more times THEN the failures count up, still no letter
        for failures in (2, 3, 4):
            again = await router.sweep(now=minute)
            assert again.run.total("failed") == 2 * len(consumers)
            for key in poison:
                assert failure_counts(stack.settings, index, key) == dict.fromkeys(
                    consumers, failures
                )
            assert list_dead_letters(product, status=None) == []

        # WHEN the tick runs a fifth time
        fifth = await router.sweep(now=minute)

        # THEN the 5th failure makes one poison_event letter per subscription and record
        assert fifth.run.total("dead_lettered") == 2 * len(consumers)
        letters = list_dead_letters(product, status=None)
        assert sorted((dl.consumer, dl.event_id) for dl in letters) == sorted(
            (consumer, key) for consumer in consumers for key in poison
        )
        rows = product.execute(
            "SELECT consumer, event_id, COUNT(*) FROM dead_letters GROUP BY consumer, event_id"
        ).fetchall()
        assert {row[2] for row in rows} == {1}
        for letter in letters:
            assert letter.kind is DeadLetterKind.POISON_EVENT
            assert letter.status is DeadLetterStatus.OPEN
            assert letter.stream == event_stream_name(index)
            assert letter.body.encode() == poison[str(letter.event_id)]
            assert "undecodable record" in letter.reason
            if letter.event_id == unknown_id:
                assert "unknown event type" in letter.reason
            else:
                assert "not JSON" in letter.reason
        for key in poison:
            assert failure_counts(stack.settings, index, key) == dict.fromkeys(consumers, 5)
        # ... the poison records were acknowledged: nothing pending, nothing unacknowledged
        assert set((await lags_of(router, index)).values()) == {(0, 0)}

        # WHEN the tick runs again THEN nothing comes back: no new letter, no new failure
        sixth = await router.sweep(now=minute)
        assert sixth.run.total("fetched") == 0
        assert len(list_dead_letters(product, status=None)) == len(letters)
        for key in poison:
            assert failure_counts(stack.settings, index, key) == dict.fromkeys(consumers, 5)

        # WHEN an operator dismisses one letter THEN it closes, the others stay open
        letter_id = poison_dead_letter_id(PROJECTOR.value, unknown_id)
        with app.product().transaction() as db:
            closed = dismiss_dead_letter(db, letter_id, now_s=minute.timestamp())
        assert (closed.status, closed.resolution) == (DeadLetterStatus.CLOSED, "dismissed")
        assert len(list_dead_letters(product)) == len(letters) - 1
        # ... and a second dismiss is refused as already closed
        with (
            pytest.raises(DeadLetterClosedError, match="already closed"),
            app.product().transaction() as db,
        ):
            dismiss_dead_letter(db, letter_id, now_s=minute.timestamp())
    finally:
        await app.close()


# --------------------------------------------------------------------------- F15


@pytest.mark.parametrize("how", ["kill", "stop"], ids=["sigkill", "sigterm"])
async def test_router_resumes_consuming_by_itself_after_nats_server_restarts_under_it(
    tmp_path: Path, durable_nats: NatsServerProcess, s3_server: S3ServerProcess, how: str
) -> None:
    # GIVEN a router connected to nats-server that has applied 10 Events
    stack = make_stack(tmp_path, durable_nats, s3_server)
    (project,) = projects_on_one_stream(1, prefix="restart")
    index = stream_index(project)
    before, after = make_events([project], 10), make_events([project], 10, start=10)
    app = stack.app()
    try:
        await app.ensure_streams()
        nc = await app.nats()
        await publish(app, before)
        router = app.router()
        first = await router.nudge(index)
        assert first.subscriptions[PROJECTOR.value].applied == 10
        log_client = await router.event_log()

        # WHEN nats-server dies under it (SIGKILL or SIGTERM)
        getattr(durable_nats, how)()
        assert not durable_nats.running
        # ... a nudge arrives while it is down: it ends, bounded, having applied nothing
        # (it raises once the client has seen the connection drop; before that, its pull
        # times out and comes back empty)
        started = time.monotonic()
        try:
            down = await asyncio.wait_for(router.nudge(index), timeout=10)
        except Exception as exc:  # which error depends on when the client sees the drop
            outage_outcome = f"the nudge while down raised {type(exc).__name__}: {exc}"
        else:
            assert down.total("applied") == 0
            outage_outcome = "the nudge while down came back empty"
        assert time.monotonic() - started < 10, outage_outcome

        # ... it starts again on the same port and store, and a publisher elsewhere (its own
        # connection) sends 10 more Events
        durable_nats.start()
        other = await connect_nats(stack.settings, name="fault-test-publisher")
        try:
            await publish(app, after, nc=other)
        finally:
            await other.close()
        # ... and the router's client reconnects by itself (nats-py, bounded here)
        await wait_until(
            lambda: nc.stats["reconnects"] >= 1 and nc.is_connected,
            timeout_s=15,
            what="the router's NATS client to reconnect",
        )

        # THEN the same router, on the same connection and event-log client, applies the new
        # Events at its next nudge
        second = await router.nudge(index)
        assert second.subscriptions[PROJECTOR.value].applied == 10, outage_outcome
        # (the causal router holds no claim for an Event no rule acts on, agent.woke here:
        # one whose ack a SIGKILL lost comes back and is applied again, harmlessly)
        causal = second.subscriptions[CAUSAL.value].applied
        assert causal == 10 or (how == "kill" and 10 <= causal <= 20), (outage_outcome, causal)
        assert await app.nats() is nc
        assert await router.event_log() is log_client
        assert nc.stats["reconnects"] == 1

        # ... and once every subscription has drained, each Event was applied exactly once.
        # A SIGKILL can lose acks the server had not yet written down (even with
        # sync_interval: always, nats-server 2.15.1): those Events come back after the ack
        # wait and the claims turn them into duplicates
        await drain_until_settled(router, index)
        assert_views_exact(stack.settings, before + after)
        assert_claimed_once_each(stack.settings, before + after, tuple(Subscription))
        assert sorted(archived_once(stack, index)) == sorted(e.event_id for e in before + after)
    finally:
        await app.close()


# --------------------------------------------------------------------------- F22


def applied_by(reports: list[dict[str, Any]], subscription: Subscription) -> int:
    """Records ``subscription`` applied over nudge reports (as ``asdict(RunReport)``)."""
    return sum(int(r["subscriptions"][subscription.value]["applied"]) for r in reports)


@pytest.mark.parametrize("where", ["two-bootstraps", "two-processes"])
async def test_the_same_nudge_delivered_twice_at_once_applies_each_event_once(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess, where: str
) -> None:
    # GIVEN 300 Events of three projects on one stream, and a short nack delay (a view file
    # busy with the other run is a retry)
    stack = make_stack(tmp_path, nats_server, s3_server, router_nak_delay_s=0.2)
    projects = projects_on_one_stream(3, prefix="f22")
    index = stream_index(projects[0])
    events = make_events(projects, 300)
    ids = sorted(e.event_id for e in events)
    routed = RoutedLog(tmp_path / "routed.log")
    app = stack.app(routed=routed)
    try:
        await app.ensure_streams()
        await publish(app, events)

        # WHEN the router-nudge for that stream is delivered twice, and both run at once:
        # two composition roots with their own connections, or two processes
        reports: list[dict[str, Any]] = []
        if where == "two-bootstraps":
            twins = [stack.app(routed=routed) for _ in range(2)]
            try:
                runs = await asyncio.gather(*(t.router().nudge(index) for t in twins))
            finally:
                for twin in twins:
                    await twin.close()
            reports = [asdict(run) for run in runs]
        else:
            args = ["route", "nudge", str(index), f"--routed-log={routed.path}", "--gate"]
            workers = [start_worker(args, stack.env(), stdin=True) for _ in range(2)]
            release_gated(workers)  # both connected, then both nudged at once
            outputs = [w.communicate(timeout=45) for w in workers]
            assert [w.returncode for w in workers] == [0, 0], [err for _, err in outputs]
            reports = [json.loads(out.splitlines()[-1])["report"] for out, _ in outputs]

        # (a nudge takes at most 2 x 100 records per subscription: both runs had work)
        assert all(applied_by([r], PROJECTOR) > 0 for r in reports)
        assert all(applied_by([r], CAUSAL) > 0 for r in reports)

        # ... and a router then drains what the two nudges left
        router = app.router()
        rounds = await drain_until_settled(router, index)

        # THEN no Event was applied twice: the applies of both nudges and the drain add up to
        # the Events, each is in its view once, claimed once, and routed once
        drained = sum(r.get("applied", 0) for r in rounds)
        nudged = applied_by(reports, PROJECTOR) + applied_by(reports, CAUSAL)
        assert nudged + drained == len(Subscription) * len(events)
        assert_views_exact(stack.settings, events)
        assert_claimed_once_each(
            stack.settings, events, tuple(Subscription), causal_acts_on=routed.acts_on
        )
        assert sorted(routed.routed()) == ids
        assert sorted(archived_once(stack, index)) == ids
    finally:
        await app.close()
