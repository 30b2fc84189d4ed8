"""Webhook receivers that fail, time out, answer 410, or are disabled and re-enabled, against
a real nats-server, real SQLite files and a real loopback receiver (issue #7 item 3 and its
faults): a failing receiver never holds the stream, the retry schedule ends in a visible dead
letter that an operator can Retry or Dismiss, and a disabled endpoint's deliveries are kept
and replayed once it is enabled again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rhumbatron import operator
from rhumbatron.agents.signing import verify
from rhumbatron.cli import main
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings
from rhumbatron.domain.project import project_admin_key
from rhumbatron.errors import (
    DeadLetterClosedError,
    DeadLetterError,
    RhumbatronError,
    SubscriptionRegistryError,
)
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.product.dead_letters import DeadLetterKind, DeadLetterStatus
from rhumbatron.queues.dead_letter import open_letter_counts
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.gate import admit, release
from rhumbatron.reactions.reaction_facts import ShardFacts, record_disablement
from rhumbatron.reactions.webhook_attempts import unrecorded_disablements
from rhumbatron.reactions.webhook_ledger import (
    DeliveryStatus,
    Disablement,
    WebhookDelivery,
    get_delivery,
)
from rhumbatron.reactions.webhook_retries import (
    RETRIED_METRIC,
    WEBHOOK_DEAD_METRIC,
    WebhookRetrier,
)

from . import test_reactions as reactions_tests
from .test_reactions import (
    PROJECT,
    SECRET,
    START,
    TENANT,
    World,
    make_world,
    task_completed,
    webhook,
)

pytestmark = pytest.mark.integration

world = reactions_tests.world
#: What the receiver answers when its script has run out.
ACCEPT = 204
#: A script entry: hold the request until the test lets go (a receiver that hangs).
HANG = "hang"


@dataclass
class ScriptedReceiver:
    """A loopback receiver that answers from a script and records each request it verified:
    ``(clock time, webhook-id, answer)``."""

    clock: ManualClock
    script: deque[int | str] = field(default_factory=deque)
    requests: list[tuple[float, str, int | str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def answers(self, *answers: int | str) -> None:
        self.script.extend(answers)

    @property
    def ids(self) -> list[str]:
        return [webhook_id for _, webhook_id, _ in self.requests]


@pytest.fixture
def receiver(clock: ManualClock) -> Iterator[ScriptedReceiver]:
    state = ScriptedReceiver(clock)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verify([SECRET], headers, body, now=state.clock.now(), tolerance_s=300)
            with lock:
                answer = state.script.popleft() if state.script else ACCEPT
                state.requests.append(
                    (state.clock.now().timestamp(), headers["webhook-id"], answer)
                )
            if answer == HANG:
                state.release.wait(timeout=30)
                answer = ACCEPT
            assert isinstance(answer, int)
            self.send_response(answer)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def stop_after_one() -> Callable[[], bool]:
    """A pass's ``should_stop`` that lets one delivery through, then asks it to stop."""
    asked = itertools.count()
    return lambda: next(asked) >= 1


#: The delivery another process is sending, holding the tenant's in-flight slot.
HELD_ELSEWHERE = "held-elsewhere"


def hold_the_tenants_slot_elsewhere(world: World, clock: ManualClock) -> None:
    """Take one in-flight slot of ``TENANT`` (a cap of 1: its only one) for a delivery another
    process is sending."""
    with world.app.product().transaction() as db:
        admit(
            db,
            tenant_id=TENANT,
            delivery_key=HELD_ELSEWHERE,
            day=START.date().isoformat(),
            now_s=clock.now().timestamp(),
            daily_budget=1000,
            in_flight_cap=1,
            lease_s=300,
        )


def retrier(world: World, limits: ReactionSettings | None = None) -> WebhookRetrier:
    retries = world.app.webhook_retrier()
    if limits is not None:
        retries.limits = limits
    return retries


def delivery(world: World, subscription_id: str) -> WebhookDelivery:
    (only,) = world.registry.deliveries(TENANT, subscription_id)
    return only


def outbox_kinds(world: World) -> list[str]:
    """The event types the project's admin shard wrote (reactions' own facts land there)."""
    shard = world.app.resource_shard(PROJECT, project_admin_key(PROJECT))
    rows = shard.connection.execute("SELECT event_type FROM outbox ORDER BY rowid").fetchall()
    return [row[0] for row in rows]


async def test_a_failing_receiver_does_not_hold_the_stream_and_the_retry_delivers_it(
    world: World, receiver: ScriptedReceiver
) -> None:
    # GIVEN a receiver that refuses its first request
    sub = world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    receiver.answers(500)
    await world.publish(event)

    # WHEN the reactions consume the event, and the retry pass runs before and at 5 s
    report = await world.react()
    early = await retrier(world).run()
    world.clock.advance(5)
    due = await retrier(world).run()

    # THEN the event was applied at once (the stream moves on), the retry waited its 5 s
    # and delivered it with the same webhook-id, once
    assert (report.applied, report.failed) == (1, 0)
    assert early.sent == 0
    assert (due.sent, due.delivered) == (1, 1)
    key = f"{event.event_id}:{sub}"
    assert receiver.ids == [key, key]
    assert [answer for _, _, answer in receiver.requests] == [500, ACCEPT]
    assert (delivery(world, sub).status, delivery(world, sub).attempts) == (
        DeliveryStatus.DELIVERED,
        2,
    )
    retried = metric_counts(world.app.product().connection, MetricBinding.METRICS)
    assert retried.get(RETRIED_METRIC) == 1


async def test_a_receiver_that_times_out_is_retried_like_a_refusal(
    world: World, receiver: ScriptedReceiver
) -> None:
    # GIVEN a subscription with a 0.3 s timeout, and a receiver that hangs on the first call
    reaction = webhook(receiver.url).model_copy(update={"timeout_s": 0.3})
    sub = world.subscribe("hook", reaction)
    receiver.answers(HANG)
    await world.publish(task_completed(world.clock, "t1"))

    # WHEN the reactions consume the event, and the retry pass runs when it is due
    report = await world.react()
    timed_out = delivery(world, sub)
    receiver.release.set()
    world.clock.advance(5)
    await retrier(world).run()

    # THEN the timeout was a failed attempt with no status, and the retry delivered it
    assert report.applied == 1
    assert timed_out.status is DeliveryStatus.RETRYING
    assert timed_out.last_status_code is None
    assert timed_out.last_error is not None and "no answer within 0.3 s" in timed_out.last_error
    assert delivery(world, sub).status is DeliveryStatus.DELIVERED


async def test_a_webhook_whose_retries_run_out_becomes_a_dead_letter_an_operator_retries(
    world: World, receiver: ScriptedReceiver
) -> None:
    # GIVEN a receiver that fails its first seven requests
    sub = world.subscribe("hook", webhook(receiver.url))
    event = task_completed(world.clock, "t1")
    receiver.answers(*[503] * 7)
    await world.publish(event)
    await world.react()

    # WHEN the retry pass runs as each retry comes due (5 s, 5 min, 30 min, 2 h, 5 h, 10 h)
    for wait in ReactionSettings().reaction_webhook_retry_schedule_s:
        world.clock.advance(wait)
        await retrier(world).run()

    # THEN the delivery is dead after 7 attempts, and one reaction letter is open for it
    assert (delivery(world, sub).status, delivery(world, sub).attempts) == (DeliveryStatus.DEAD, 7)
    page = operator.list_dead_letters(world.app, tenant_id=TENANT, kind=DeadLetterKind.REACTION)
    (letter,) = page.letters
    assert letter.event_id == f"{event.event_id}:{sub}"
    assert "failed 7 times" in letter.reason and "503" in letter.reason
    assert len(receiver.requests) == 7
    # … and it is counted where the dashboards read open letters
    assert open_letter_counts(world.app.product().connection)[("reactions", "reaction")] == 1
    # … and each retry is a metric point by tenant and outcome, its last one a dead letter's
    dead_at = world.clock.now().timestamp()
    points = world.points(RETRIED_METRIC, WEBHOOK_DEAD_METRIC)
    assert [p[:2] for p in points[:-2]] == [
        (RETRIED_METRIC, {"outcome": "retrying", "tenant": TENANT})
    ] * 5
    emitted = world.emitted()  # each emitted once its row was written
    assert (emitted.count(RETRIED_METRIC), emitted.count(WEBHOOK_DEAD_METRIC)) == (6, 1)
    assert points[-2:] == [
        (
            RETRIED_METRIC,
            {"outcome": "dead", "tenant": TENANT},
            f"{letter.event_id}:{dead_at}",
            PROJECT,
        ),
        (WEBHOOK_DEAD_METRIC, {"tenant": TENANT}, f"{letter.event_id}:{dead_at}", PROJECT),
    ]

    # WHEN an operator retries it (twice: a double click), and the next pass runs
    outcome = await operator.retry_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)
    again = await operator.retry_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)
    await retrier(world).run()

    # THEN the one Retry made it due, the receiver got it once more with the same id, and
    # the letter closed as succeeded
    assert (outcome.sent, outcome.queue, outcome.message_id) == (True, "reactions", letter.event_id)
    assert (again.sent, again.already_retried_as) == (False, 8)
    assert receiver.ids == [letter.event_id] * 8
    closed = operator.list_dead_letters(world.app, tenant_id=TENANT, status=None).letters
    assert [(x.status, x.resolution) for x in closed] == [(DeadLetterStatus.CLOSED, "succeeded")]
    with pytest.raises(DeadLetterClosedError):
        operator.dismiss_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)


async def test_a_dead_webhook_letter_can_be_dismissed_and_is_not_sent_again(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a one-retry schedule and a receiver that fails twice
    clock.set(START)
    limits = ReactionSettings(reaction_webhook_retry_schedule_s=(5.0,))
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500, 500)
        await world.publish(task_completed(clock, "t1"))
        await world.react()
        clock.advance(5)
        await retrier(world, limits).run()
        (letter,) = operator.list_dead_letters(world.app, tenant_id=TENANT).letters

        # WHEN an operator dismisses the letter, and passes run much later
        dismissed = operator.dismiss_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)
        clock.advance(days=1)
        later = await retrier(world, limits).run()

        # THEN the letter is closed as dismissed and nothing is sent again; a Retry of a
        # closed letter is refused
        assert (dismissed.status, dismissed.resolution) == (DeadLetterStatus.CLOSED, "dismissed")
        assert later.sent == 0 and len(receiver.requests) == 2
        assert delivery(world, sub).status is DeliveryStatus.DEAD
        with pytest.raises(DeadLetterClosedError):
            await operator.retry_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)
    finally:
        await world.app.close()


async def test_a_410_disables_the_subscription_with_a_fact_and_its_skipped_deliveries_replay(
    world: World, receiver: ScriptedReceiver
) -> None:
    # GIVEN a receiver that answers 410 Gone to the first delivery
    sub = world.subscribe("hook", webhook(receiver.url))
    first = task_completed(world.clock, "t1")
    receiver.answers(410)
    await world.publish(first)
    await world.react()

    # THEN the subscription is disabled, saying why, with a reaction.disabled fact
    record = world.registry.get(TENANT, sub)
    assert record is not None and not record.governance.enabled
    assert record.endpoint_disabled is not None and record.endpoint_disabled.reason == "gone"
    assert "reaction.disabled" in outbox_kinds(world)

    # WHEN two more events match while it is disabled
    world.clock.advance(minutes=1)
    more = [task_completed(world.clock, f"t{n}") for n in (2, 3)]
    await world.publish(*more)
    await world.react()
    # THEN nothing is sent; they are kept as skipped (with the first), and a replay is
    # refused until the subscription is enabled
    assert len(receiver.requests) == 1
    skipped = world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.SKIPPED])
    assert len(skipped) == 3
    assert world.registry.deliveries(TENANT, sub, limit=2) == skipped[:2]  # newest first
    with pytest.raises(SubscriptionRegistryError, match="enable it first"):
        world.registry.replay_skipped(TENANT, sub)
    # AND a change of its cooldown alone leaves the platform's disablement as it is
    recooled = world.registry.set_governance(TENANT, sub, cooldown_s=5)
    assert recooled.endpoint_disabled == record.endpoint_disabled
    assert not recooled.governance.enabled

    # WHEN an operator enables it again and replays the skipped deliveries
    enabled = world.registry.set_governance(TENANT, sub, enabled=True)
    replayed = world.registry.replay_skipped(TENANT, sub)
    report = await retrier(world).run()

    # THEN all three are delivered, each once, with its own webhook-id
    assert enabled.endpoint_disabled is None and enabled.governance.enabled
    assert (replayed, report.delivered) == (3, 3)
    keys = {f"{e.event_id}:{sub}" for e in (first, *more)}
    assert set(receiver.ids[1:]) == keys and len(receiver.ids) == 4
    assert world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.SKIPPED]) == []


async def test_an_endpoint_failing_for_the_disable_window_is_disabled_and_its_retries_kept(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a 10-minute disable window and a receiver that always fails
    clock.set(START)
    limits = ReactionSettings(reaction_webhook_disable_after_s=600)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(*[500] * 10)
        await world.publish(task_completed(clock, "t1"))
        await world.react()

        # WHEN its first retry fails inside the window, another delivery fails at 4 min,
        # and both retries come due past the window (at 11 min)
        clock.advance(5)
        first_retry = await retrier(world, limits).run()
        clock.set(START + timedelta(minutes=4))
        await world.publish(task_completed(clock, "t2"))
        await world.react()
        clock.set(START + timedelta(minutes=11))
        past_window = await retrier(world, limits).run()

        # THEN the retry inside the window disabled nothing; the first failure past it
        # disabled the subscription, with its fact, and the other delivery's retry is kept
        # (one request past the window: the second was never sent)
        assert first_retry.disabled == []
        assert past_window.disabled == [sub]
        record = world.registry.get(TENANT, sub)
        assert record is not None and record.endpoint_disabled is not None
        assert record.endpoint_disabled.reason == "failing"
        statuses = {d.status for d in world.registry.deliveries(TENANT, sub)}
        assert statuses == {DeliveryStatus.SKIPPED}
        assert outbox_kinds(world).count("reaction.disabled") == 1
        assert (past_window.sent, len(receiver.requests)) == (1, 4)
    finally:
        await world.app.close()


async def test_a_retry_of_a_disabled_subscriptions_letter_is_refused_until_it_is_enabled(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a dead delivery of a subscription an operator then disabled
    clock.set(START)
    limits = ReactionSettings(reaction_webhook_retry_schedule_s=(5.0,))
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500, 500)
        await world.publish(task_completed(clock, "t1"))
        await world.react()
        clock.advance(5)
        await retrier(world, limits).run()
        (letter,) = operator.list_dead_letters(world.app, tenant_id=TENANT).letters
        world.registry.set_governance(TENANT, sub, enabled=False)

        # WHEN an operator retries the letter
        # THEN it is refused, saying what to do
        with pytest.raises(DeadLetterError, match="is disabled; enable it"):
            await operator.retry_dead_letter(world.app, letter.dead_letter_id, tenant_id=TENANT)
        # AND another tenant does not see the letter at all
        with pytest.raises(LookupError):
            await operator.retry_dead_letter(world.app, letter.dead_letter_id, tenant_id="other")
    finally:
        await world.app.close()


@pytest.mark.parametrize("turned", ["disabled", "deleted"])
async def test_a_retry_whose_subscription_is_off_or_gone_is_set_aside_saying_why(
    world: World, receiver: ScriptedReceiver, turned: str
) -> None:
    # GIVEN a delivery its receiver refused, whose subscription is then disabled or deleted
    sub = world.subscribe("hook", webhook(receiver.url))
    receiver.answers(500, 500)
    await world.publish(task_completed(world.clock, "t1"), task_completed(world.clock, "t2"))
    await world.react()
    first, _ = world.registry.deliveries(TENANT, sub)
    if turned == "disabled":
        world.registry.set_governance(TENANT, sub, enabled=False)
    else:
        world.registry.delete(TENANT, sub)
    world.clock.advance(5)

    # WHEN the retry pass runs
    report = await retrier(world).run()

    # THEN it sent nothing: the delivery is skipped, kept with the reason (to replay it once
    #   the subscription is enabled again)
    # (as the sweep's report says it)
    assert report.as_dict() == {
        "sent": 0,
        "delivered": 0,
        "dead": 0,
        "skipped": 2,
        "deferred": 0,
        "disabled": [],
    }
    kept = get_delivery(world.app.product().connection, first.delivery_key)
    assert kept.status is DeliveryStatus.SKIPPED
    assert (
        kept.last_error
        == {
            "disabled": "not sent: the subscription is disabled; enable it and replay its skipped "
            "deliveries",
            "deleted": "not sent: the subscription was deleted",
        }[turned]
    )
    assert [answer for _, _, answer in receiver.requests] == [500, 500]


async def test_a_replayed_delivery_past_its_tenants_budget_is_set_aside_saying_whose_and_when(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a daily budget of 1, spent on a delivery answered 410 (the subscription is
    # disabled), and a second delivery kept uncharged while it was
    clock.set(START)
    limits = ReactionSettings(reaction_daily_budget=1)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(410)
        await world.publish(task_completed(clock, "t1"))
        await world.react()
        clock.advance(5)
        await world.publish(task_completed(clock, "t2"), task_completed(clock, "t3"))
        await world.react()

        # WHEN the subscription is enabled, its skipped deliveries replayed, and the pass runs
        world.registry.set_governance(TENANT, sub, enabled=True)
        assert world.registry.replay_skipped(TENANT, sub) == 3
        report = await retrier(world, limits).run()

        # THEN the charged one is sent; the others are set aside again, saying whose budget
        # of which day ran out
        assert (report.sent, report.skipped) == (1, 2)
        skipped = world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.SKIPPED])
        assert [d.last_error for d in skipped] == 2 * [
            f"not sent: tenant {TENANT!r} spent its reaction budget of "
            f"{START.date().isoformat()} (RHUMBATRON_REACTION_DAILY_BUDGET); replay it later"
        ]
    finally:
        await world.app.close()


async def test_the_retry_pass_respects_the_in_flight_cap_and_leaves_the_rest_due(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN three failed deliveries due, and an in-flight slot held by another delivery
    # (the cap is 1)
    clock.set(START)
    limits = ReactionSettings(reaction_in_flight_cap=1)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500, 500, 500)
        await world.publish(*[task_completed(clock, f"t{n}") for n in (1, 2, 3)])
        await world.react()
        hold_the_tenants_slot_elsewhere(world, clock)
        clock.advance(5)

        # WHEN the retry pass runs
        report = await retrier(world, limits).run()

        # THEN it sent nothing and gave all three back, still due
        assert (report.sent, report.deferred) == (0, 3)
        due = world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.RETRYING])
        assert len(due) == 3
        assert all(d.next_attempt_at_s == clock.now().timestamp() for d in due)
        # AND a pass told to stop after the first counts it with the two it gave back
        stopped = await retrier(world, limits).run(should_stop=stop_after_one())
        assert (stopped.sent, stopped.deferred) == (0, 3)
    finally:
        await world.app.close()


async def test_a_tenant_found_full_is_not_asked_again_in_the_pass_when_a_slot_frees(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN two failed deliveries of one tenant due, in order, and its only in-flight slot
    #   (the cap is 1) held by a delivery another process is sending
    clock.set(START)
    limits = ReactionSettings(reaction_in_flight_cap=1)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500, 500)
        await world.publish(task_completed(clock, "t1"), task_completed(clock, "t2"))
        await world.react()
        hold_the_tenants_slot_elsewhere(world, clock)
        clock.advance(5)
        sent_before = len(receiver.requests)

        asked = ["second", "first"]

        def other_process_finishes_after_the_first() -> bool:
            # Asked before each delivery: the slot frees between the first and the second.
            if asked.pop() == "second":
                with world.app.product().transaction() as db:
                    release(db, [HELD_ELSEWHERE])
            return False

        # WHEN the retry pass finds the tenant full at its first delivery, and the slot frees
        #   before its second
        report = await retrier(world, limits).run(
            should_stop=other_process_finishes_after_the_first
        )

        # THEN the second is given back with the first, unsent (the pass does not ask the
        #   full tenant again), and the next pass sends both
        assert (report.sent, report.deferred) == (0, 2)
        assert len(receiver.requests) == sent_before
        due = world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.RETRYING])
        assert len(due) == 2
        assert (await retrier(world, limits).run()).sent == 2
    finally:
        await world.app.close()


async def test_a_pass_counts_every_retry_it_sends_and_frees_each_slot_for_the_next(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN four refused deliveries of a tenant whose in-flight cap is 1, each with one retry
    #   left
    clock.set(START)
    limits = ReactionSettings(reaction_in_flight_cap=1, reaction_webhook_retry_schedule_s=(5.0,))
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500, 500, 500, 500)
        await world.publish(*[task_completed(clock, f"t{n}") for n in (1, 2, 3, 4)])
        await world.react()
        clock.advance(5)
        # WHEN the retry pass runs, two retries accepted and two refused again
        receiver.answers(ACCEPT, ACCEPT, 500, 500)
        report = await retrier(world, limits).run()
        # THEN it sent all four one after the other (each freed its slot for the next), and
        #   counts two delivered and two dead
        assert report.as_dict() == {
            "sent": 4,
            "delivered": 2,
            "dead": 2,
            "skipped": 0,
            "deferred": 0,
            "disabled": [],
        }
    finally:
        await world.app.close()


async def test_the_retry_of_an_admitted_delivery_is_not_charged_against_the_budget_again(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a tenant's daily budget of 1, spent by a delivery its receiver refused
    clock.set(START)
    limits = ReactionSettings(reaction_daily_budget=1)
    world = make_world(tmp_path, settings, clock, limits=limits)
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(500)
        await world.publish(task_completed(clock, "t1"))
        first = await world.react()
        assert first.applied == 1
        clock.advance(5)

        # WHEN the retry pass runs the same day
        report = await retrier(world, limits).run()

        # THEN the retry is the same delivery, already charged: it is sent and delivered
        assert (report.sent, report.delivered) == (1, 1)
        assert [answer for _, _, answer in receiver.requests] == [500, ACCEPT]
        assert delivery(world, sub).status is DeliveryStatus.DELIVERED
    finally:
        await world.app.close()


async def test_the_cli_lists_deliveries_replays_skipped_ones_and_retries_a_letter(
    world: World,
    receiver: ScriptedReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN a subscription disabled by a 410, and the CLI pointed at the same state
    sub = world.subscribe("hook", webhook(receiver.url))
    receiver.answers(410)
    await world.publish(task_completed(world.clock, "t1"))
    await world.react()
    monkeypatch.setenv("RHUMBATRON_STATE_DIR", str(world.app.settings.state_dir))
    monkeypatch.setenv("RHUMBATRON_NATS_URL", world.app.settings.nats_url)
    capsys.readouterr()

    # WHEN an operator replays before enabling, enables, replays, and lists what is due
    refused = main(["subscriptions", "replay-skipped", sub])
    refusal = capsys.readouterr().err
    enabled = main(["subscriptions", "enable", sub])
    replayed = main(["subscriptions", "replay-skipped", sub])
    replay_line = capsys.readouterr().out.splitlines()[-1]
    listed = main(["subscriptions", "deliveries", sub, "--status", "retrying"])
    due = json.loads(capsys.readouterr().out)

    # THEN the first replay is refused with what to do (3), then one delivery is due again
    assert (refused, enabled, replayed, listed) == (3, 0, 0, 0)
    assert "enable it first" in refusal
    assert replay_line.startswith("1 skipped deliveries of " + sub + " are due again")
    assert [(d["status"], d["attempts"], d["lastStatusCode"]) for d in due] == [
        ("retrying", 0, 410)
    ]


#: A webhook subscription disabled because its endpoint answered 410 Gone.
GONE = Disablement(
    subscription_id="sub_" + "c" * 32,
    tenant_id=TENANT,
    project_id=PROJECT,
    name="hook",
    reason="gone",
    detail="the endpoint answered 410 Gone",
    delivery_key="evt_" + "d" * 32 + ":sub_" + "c" * 32,
    status_code=410,
    failing_since_s=START.timestamp(),
    disabled_at_s=START.timestamp() + 1,
)


def test_a_disablement_recorded_twice_is_one_reaction_disabled_fact(world: World) -> None:
    # GIVEN a disablement whose fact a crash kept from being marked as written
    disablement = GONE
    facts = ShardFacts(world.app.resource_shard, world.clock)
    # WHEN it is written twice (the consumer, then a retry pass that found it owed)
    facts.reaction_disabled(disablement)
    facts.reaction_disabled(disablement)
    # THEN the outbox holds one reaction.disabled: its ID is derived from the disablement
    assert outbox_kinds(world).count("reaction.disabled") == 1
    (fact,) = disabled_facts(world)
    assert fact["payload"] == {
        "subscriptionId": disablement.subscription_id,
        "name": "hook",
        "reason": "gone",
        "deliveryKey": disablement.delivery_key,
        "lastError": "the endpoint answered 410 Gone",
        "failingSince": "2026-03-02T10:00:00Z",  # UTC, as every timestamp on the wire
        "statusCode": 410,
    }
    # AND the same subscription disabled again later (enabled meanwhile) is a fact of its own
    facts.reaction_disabled(dataclasses.replace(disablement, disabled_at_s=START.timestamp() + 9))
    assert outbox_kinds(world).count("reaction.disabled") == 2


class RefusingFacts:
    """A fact sink whose shard cannot be written right now."""

    def budget_exceeded(self, event: object, **fields: object) -> None:
        raise RhumbatronError("the shard is busy")

    def reaction_disabled(self, disablement: Disablement) -> None:
        raise RhumbatronError("the shard is busy")


async def test_a_disablement_whose_fact_cannot_be_written_says_so_and_fails_nothing(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a disablement, and a shard that refuses the write
    disablement = dataclasses.replace(
        GONE, delivery_key="k1", failing_since_s=None, disabled_at_s=START.timestamp()
    )
    # WHEN its fact is recorded  THEN the caller is not failed: the error says the next
    # retry pass writes it
    with caplog.at_level("WARNING", logger="rhumbatron.reactions.reaction_facts"):
        await record_disablement(RefusingFacts(), world.app.product(), disablement)
    assert caplog.messages == [
        f"cannot record reaction.disabled for {disablement.subscription_id} yet (the shard is "
        "busy); the next retry pass will"
    ]
    # AND written for real, a disablement with no failing time says so as null
    caplog.clear()
    with caplog.at_level("WARNING", logger="rhumbatron.reactions.reaction_facts"):
        facts = ShardFacts(world.app.resource_shard, world.clock)
        await record_disablement(facts, world.app.product(), disablement)
    (fact,) = disabled_facts(world)
    assert fact["payload"]["failingSince"] is None
    assert caplog.messages == [
        f"webhook subscription {disablement.subscription_id} (hook) disabled: the endpoint "
        "answered 410 Gone"
    ]


def disabled_facts(world: World) -> list[dict[str, Any]]:
    shard = world.app.resource_shard(PROJECT, project_admin_key(PROJECT))
    rows = shard.connection.execute(
        "SELECT envelope FROM outbox WHERE event_type = 'reaction.disabled' ORDER BY rowid"
    )
    return [json.loads(row[0]) for row in rows]


async def test_the_next_retry_pass_writes_a_disablement_fact_the_consumer_could_not(
    tmp_path: Path, settings: Settings, clock: ManualClock, receiver: ScriptedReceiver
) -> None:
    # GIVEN a delivery answered 410 Gone while the shard refused the reaction.disabled fact
    clock.set(START)
    world = make_world(tmp_path, settings, clock, wrap_facts=lambda _: RefusingFacts())
    await world.app.ensure_streams()
    try:
        sub = world.subscribe("hook", webhook(receiver.url))
        receiver.answers(410)
        await world.publish(task_completed(clock, "t1"))
        await world.react()
        assert disabled_facts(world) == []
        # WHEN the retry pass runs (its own fact sink writes)
        await retrier(world).run()
        # THEN the fact is written, once, and no longer owed
        (fact,) = disabled_facts(world)
        assert fact["payload"]["subscriptionId"] == sub
        assert unrecorded_disablements(world.app.product().connection) == []
    finally:
        await world.app.close()


async def test_a_pass_told_to_stop_gives_the_rest_back_due_now_and_says_how_many(
    world: World, receiver: ScriptedReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN three refused deliveries due for their retry
    sub = world.subscribe("hook", webhook(receiver.url))
    receiver.answers(500, 500, 500)
    await world.publish(*[task_completed(world.clock, f"t{n}") for n in (1, 2, 3)])
    await world.react()
    world.clock.advance(60)
    # WHEN a pass is told to stop after its first retry, which is delivered
    receiver.answers(ACCEPT)
    with caplog.at_level("INFO", logger="rhumbatron.reactions.webhook_retries"):
        report = await retrier(world).run(should_stop=stop_after_one())
    # THEN it sent one, gave the other two back due now for the next pass, and said so
    assert (report.sent, report.delivered, report.deferred) == (1, 1, 2)
    waiting = world.registry.deliveries(TENANT, sub, statuses=[DeliveryStatus.RETRYING])
    assert [d.next_attempt_at_s for d in waiting] == 2 * [world.clock.now().timestamp()]
    assert caplog.messages == [f"webhook retry pass: {report.as_dict()}"]


async def test_a_retry_in_flight_is_leased_for_the_webhook_timeout_and_a_minute(
    world: World, receiver: ScriptedReceiver
) -> None:
    # GIVEN a refused delivery due for its retry, and a pass whose retry the receiver holds
    receiver.answers(500)
    world.subscribe("hook", webhook(receiver.url))
    await world.publish(task_completed(world.clock, "t1"))
    await world.react()
    world.clock.advance(60)
    receiver.answers(HANG)
    first = asyncio.create_task(retrier(world).run())
    for _ in range(3_000):
        if len(receiver.requests) == 2:
            break
        await asyncio.sleep(0.01)  # polls for the held request's arrival
    assert len(receiver.requests) == 2
    lease_s = world.app.settings.webhook_timeout_s + 60
    try:
        # WHEN other passes run while it is held: at once, and until its lease runs out
        at_once = await retrier(world).run()
        world.clock.advance(lease_s - 1)
        just_before = await retrier(world).run()
        world.clock.advance(1)
        at_the_end = await retrier(world).run()
    finally:
        receiver.release.set()
        await first
    # THEN none takes it while the lease holds (the webhook timeout and a minute); once it
    #   has run out, the next pass does (the first pass may have died)
    assert (at_once.sent, just_before.sent, at_the_end.sent) == (0, 0, 1)
