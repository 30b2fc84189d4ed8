"""The real reactions consumer delivering to a :class:`LocalWebhookReceiver` over loopback,
against a real nats-server and real SQLite files (RELIABILITY B1, B2, B3): a delivery accepted
with its signature verified; a secret rotation seen from the receiving end; and a webhook URL
at a loopback address refused at send once it is no longer allow-listed."""

from __future__ import annotations

import http.client
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
import pytest_asyncio

from project_roots import ensure_project_roots
from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.agents.signing import generate_secret, signed_headers
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import MetricBinding, metric_counts
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import event_stream_subject, stream_index
from rhumbatron.reactions.consumer import FIRED_METRIC
from rhumbatron.reactions.local_webhook_receiver import LocalWebhookReceiver, RejectedDelivery
from rhumbatron.reactions.selectors import Selector
from rhumbatron.reactions.subscription_models import Governance, WebhookReaction
from rhumbatron.reactions.subscription_registry import SubscriptionRegistry
from rhumbatron.reactions.webhook_verification import RejectionReason, WebhookReceiver
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.reports import SubscriptionReport
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron.runtime.reactions_assembly import LazyHttpClient, reactions_for

pytestmark = pytest.mark.integration

TENANT = "acme"
PROJECT = "proj-receiver"
STREAM = stream_index(PROJECT)
START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
OLD, NEW = generate_secret(), generate_secret()


@dataclass
class World:
    """A runtime whose router reacts through ``registry`` (as ``test_reactions`` drives it)."""

    app: Rhumbatron
    registry: SubscriptionRegistry
    clock: ManualClock
    http: LazyHttpClient

    async def publish(self, *events: Event) -> None:
        ensure_project_roots(self.app, events)
        js = (await self.app.nats()).jetstream()
        for event in events:
            await js.publish(
                event_stream_subject(STREAM),
                event.to_json(),
                headers={"Nats-Msg-Id": event.event_id},
            )

    async def react(self, attempts: int = 200) -> SubscriptionReport:
        """One reactions consume that fetched something (a message published a moment ago
        can trail the consumer by a moment: this bounds that wait, it never sleeps)."""
        router = self.app.router()
        report = SubscriptionReport()
        for _ in range(attempts):
            run = RunContext(STREAM, self.clock.now().timestamp(), apply_calls_left=15)
            report = await router.consume(run, Subscription.REACTIONS, consumes=1, batch=100)
            if report.fetched:
                break
        return report

    def subscribe(self, name: str, url: str, secrets: tuple[str, ...]) -> str:
        created = self.registry.create(
            TENANT,
            name,
            Selector.create(["task.completed"]),
            WebhookReaction(url=url, secrets=secrets),
            Governance(cooldown_s=0),
        )
        return created.record.subscription_id

    def fired(self) -> int:
        """Reactions counted as taken (``reaction_fired``): a failed delivery is not."""
        counts = metric_counts(self.app.product().connection, MetricBinding.METRICS)
        return int(counts.get(FIRED_METRIC, 0))


async def make_world(
    settings: Settings, clock: ManualClock, *, allowed: tuple[str, ...], registering: Settings
) -> World:
    """A runtime that sends under ``allowed`` hosts, its registry checking URLs under
    ``registering`` (the allow-list in force when the subscription was created)."""
    values = settings.model_dump() | {"webhook_allowed_hosts": allowed, "router_nak_delay_s": 0}
    app = bootstrap(load_settings(**values), clock=clock, alarms=RecordingAlarmSink())
    registry = SubscriptionRegistry(app.product(), registering, clock)
    http = LazyHttpClient()
    app.bind_reactions(reactions_for(app, registry, http=http))
    await app.ensure_streams()
    return World(app, registry, clock, http)


@pytest_asyncio.fixture
async def world(settings: Settings, clock: ManualClock) -> AsyncIterator[World]:
    clock.set(START)
    permissive = settings.model_copy(update={"webhook_allowed_hosts": ("127.0.0.1",)})
    built = await make_world(settings, clock, allowed=("127.0.0.1",), registering=permissive)
    yield built
    await built.http.aclose()
    await built.app.close()


def local_receiver(clock: ManualClock, *secrets: str) -> LocalWebhookReceiver:
    return LocalWebhookReceiver(WebhookReceiver(list(secrets), clock=clock))


@pytest.fixture
def receivers() -> Iterator[list[LocalWebhookReceiver]]:
    """Started receivers are stopped at the end of the test."""
    started: list[LocalWebhookReceiver] = []
    yield started
    for receiver in started:
        receiver.stop()


def start(receivers: list[LocalWebhookReceiver], receiver: LocalWebhookReceiver) -> str:
    receivers.append(receiver.start())
    return receiver.url


def task_completed(clock: ManualClock, task: str) -> Event:
    ctx = FactContext(Caller(TENANT, "system:test", "corr-1"), PROJECT, clock.now())
    return ctx.fact(
        "task.completed", {"agentId": "agent-7"}, change_id=f"{PROJECT}-chg-1", task_id=task
    )


# -- B1: accepted, signature verified ------------------------------------------------------------


async def test_the_consumer_delivery_is_accepted_by_the_receiver_with_its_signature_verified(
    world: World, receivers: list[LocalWebhookReceiver]
) -> None:
    # GIVEN a local receiver holding the subscription's secret
    receiver = local_receiver(world.clock, NEW)
    sub = world.subscribe("hook", start(receivers, receiver), (NEW,))
    event = task_completed(world.clock, "t1")
    await world.publish(event)

    # WHEN the reactions consumer delivers the event
    report = await world.react()

    # THEN the receiver answered 204 to one verified delivery: the pointer to the event
    assert (report.applied, report.failed) == (1, 0)
    (accepted,) = receiver.accepted
    assert accepted.signature_verified
    assert accepted.webhook.webhook_id == f"{event.event_id}:{sub}"
    assert (accepted.webhook.event_id, accepted.webhook.kind) == (event.event_id, "task.completed")
    assert accepted.webhook.subscription_id == sub
    assert accepted.webhook.timestamp == int(START.timestamp())
    assert accepted.json()["subject"] == {"type": "task", "id": "t1"}
    assert accepted.path == "/hook"
    assert receiver.rejected == []
    assert world.fired() == 1


# -- B2: rotation from the receiving end ---------------------------------------------------------


async def test_during_a_rotation_a_receiver_holding_only_the_new_secret_accepts(
    world: World, receivers: list[LocalWebhookReceiver]
) -> None:
    # GIVEN a subscription in its rotation overlap (new and old secret), whose endpoint
    # already holds only the new one, and another endpoint still holding only the old one
    new_side = local_receiver(world.clock, NEW)
    old_side = local_receiver(world.clock, OLD)
    world.subscribe("new-side", start(receivers, new_side), (NEW, OLD))
    world.subscribe("old-side", start(receivers, old_side), (NEW, OLD))
    await world.publish(task_completed(world.clock, "t1"))

    # WHEN the event is delivered to both
    report = await world.react()

    # THEN both accept it: the sender signs with both secrets
    assert (report.applied, report.failed) == (1, 0)
    assert [d.signature_verified for d in new_side.accepted] == [True]
    assert [d.signature_verified for d in old_side.accepted] == [True]


async def test_a_receiver_holding_a_secret_the_sender_dropped_rejects_with_401(
    world: World, receivers: list[LocalWebhookReceiver]
) -> None:
    # GIVEN a subscription that finished its rotation (new secret only) and an endpoint that
    # still holds only the old one
    receiver = local_receiver(world.clock, OLD)
    sub = world.subscribe("hook", start(receivers, receiver), (NEW,))
    event = task_completed(world.clock, "t1")
    await world.publish(event)

    # WHEN the event is delivered
    await world.react()

    # THEN the receiver answered 401 for the signature, and the delivery did not count as
    # delivered (whatever retries it next: the router, or the delivery ledger)
    assert receiver.accepted == []
    (refused,) = receiver.rejected
    assert (refused.status, refused.reason) == (401, RejectionReason.SIGNATURE)
    assert refused.webhook_id == f"{event.event_id}:{sub}"
    assert "no signature of webhook" in refused.message
    assert world.fired() == 0


# -- the local server itself ---------------------------------------------------------------------


async def test_the_local_receiver_answers_the_reason_and_fails_on_purpose_when_told(
    receivers: list[LocalWebhookReceiver], clock: ManualClock
) -> None:
    # GIVEN a local receiver told to fail its next verified delivery
    clock.set(START)
    receiver = local_receiver(clock, NEW)
    url = start(receivers, receiver)
    receiver.fail_next = 1
    event = task_completed(clock, "t1")
    body = (
        f'{{"eventId":"{event.event_id}","kind":"task.completed","link":"/e",'
        f'"projectId":"{PROJECT}","subject":{{"type":"task","id":"t1"}}}}'
    ).encode()
    msg_id = f"{event.event_id}:sub_1"
    headers = signed_headers([NEW], msg_id, int(START.timestamp()), body)

    # WHEN a request without signatures, then the signed one three times, are posted
    async with httpx.AsyncClient() as http:
        unsigned = await http.post(url, content=body)
        answers = [(await http.post(url, content=body, headers=headers)) for _ in range(3)]

    # THEN the unsigned one is a 401 with its reason; the signed one failed on purpose once
    # (and was forgotten), its retry was accepted, and the third is a replay
    assert unsigned.status_code == 401
    assert "no webhook-id, webhook-timestamp, webhook-signature header" in unsigned.text
    assert [a.status_code for a in answers] == [500, 204, 401]
    assert "a replay" in answers[2].text
    assert [d.webhook.webhook_id for d in receiver.failed] == [msg_id]
    assert [d.webhook.webhook_id for d in receiver.accepted] == [msg_id]
    assert [(r.reason, r.path) for r in receiver.rejected] == [
        (RejectionReason.HEADERS, "/hook"),
        (RejectionReason.REPLAY, "/hook"),
    ]


def post_raw(url: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, str, str]:
    """POST with exactly ``headers`` (no content-length unless given): status, content-type
    and text of the answer."""
    parsed = httpx.URL(url)
    connection = http.client.HTTPConnection(parsed.host, parsed.port, timeout=10)
    try:
        connection.putrequest("POST", parsed.path, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        answer = connection.getresponse()
        return answer.status, answer.getheader("content-type", ""), answer.read().decode()
    finally:
        connection.close()


def test_the_local_receiver_refuses_a_body_no_pointer_has_before_reading_it(
    receivers: list[LocalWebhookReceiver], clock: ManualClock
) -> None:
    # GIVEN a started local receiver
    receiver = local_receiver(clock, NEW)
    url = start(receivers, receiver)
    limit = 1 << 20

    # WHEN requests declare a body over 1 MiB, or a length that is no number
    too_large = post_raw(url, {"content-length": str(limit + 1)})
    unreadable = post_raw(url, {"content-length": "many"})
    # AND unsigned ones carry exactly 1 MiB, nothing, or no content-length at all
    at_limit = post_raw(url, {"content-length": str(limit)}, b"x" * limit)
    empty = post_raw(url, {"content-length": "0"})
    undeclared = post_raw(url, {})

    # THEN the first two are a 413 that says why, as text, and are recorded unchecked
    expected = [
        f"content-length {given!r} is not 0..{limit}: not a pointer body"
        for given in (str(limit + 1), "many")
    ]
    assert [too_large, unreadable] == [(413, "text/plain; charset=utf-8", m) for m in expected]
    assert receiver.rejected[:2] == [
        RejectedDelivery(413, None, message, None, "/hook") for message in expected
    ]
    # AND the others were read and checked: a 401 for their missing signatures
    assert [answer[0] for answer in (at_limit, empty, undeclared)] == [401, 401, 401]
    assert [r.reason for r in receiver.rejected[2:]] == [RejectionReason.HEADERS] * 3
    assert receiver.accepted == []


async def test_the_local_receiver_answers_a_retry_as_a_duplicate_and_fails_as_often_as_told(
    receivers: list[LocalWebhookReceiver], clock: ManualClock
) -> None:
    # GIVEN a local receiver told to fail its next two verified deliveries
    clock.set(START)
    receiver = local_receiver(clock, NEW)
    url = start(receivers, receiver)
    receiver.fail_next = 2
    body = (
        b'{"eventId":"evt_1","kind":"task.completed","link":"/e","projectId":"p",'
        b'"subject":{"type":"task","id":"t1"}}'
    )

    def signed(at_s: int) -> dict[str, str]:
        return signed_headers([NEW], "evt_1:sub_1", at_s, body)

    # WHEN the sender sends it, retrying with a new timestamp until it has a 2xx, and once more
    now_s = int(START.timestamp())
    async with httpx.AsyncClient() as client:
        answers = [
            await client.post(url, content=body, headers=signed(now_s + n)) for n in range(4)
        ]

    # THEN two failed on purpose, the third was accepted, the fourth is a duplicate: a 204
    #   with no body, kept apart from the accepted ones
    assert [a.status_code for a in answers] == [500, 500, 204, 204]
    assert {a.text for a in answers[:2]} == {"failing on purpose (fail_next)"}
    assert answers[2].content == b"" and "content-type" not in answers[2].headers
    assert answers[2].headers["content-length"] == "0"
    assert (len(receiver.failed), len(receiver.accepted), len(receiver.duplicates)) == (2, 1, 1)
    (accepted,) = receiver.accepted
    assert (accepted.headers["webhook-id"], accepted.body, accepted.path) == (
        "evt_1:sub_1",
        body,
        "/hook",
    )
    assert receiver.duplicates[0].webhook.duplicate
    assert receiver.fail_next == 0


def test_a_local_receiver_serves_on_a_daemon_thread_and_stops_even_if_never_started(
    receivers: list[LocalWebhookReceiver], clock: ManualClock
) -> None:
    # GIVEN a receiver never started  WHEN it is stopped  THEN nothing happens
    local_receiver(clock, NEW).stop()
    # AND a started one serves on a daemon thread named for it: a test that forgets to stop
    #   it cannot keep the interpreter from exiting
    receiver = local_receiver(clock, NEW)
    before = set(threading.enumerate())
    start(receivers, receiver)
    assert receiver.start() is receiver  # a second start keeps the one server
    serving = [t for t in threading.enumerate() if t not in before]
    assert [(t.name, t.daemon) for t in serving] == [("webhook-receiver", True)]
    # AND once stopped, its thread has ended
    receiver.stop()
    assert not any(t.is_alive() for t in serving)


def test_a_local_receiver_has_no_url_before_it_starts(clock: ManualClock) -> None:
    with pytest.raises(RuntimeError, match="call start"):
        _ = local_receiver(clock, NEW).url


# -- B3: refused at send -------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_a_loopback_webhook_allowed_at_registration_is_refused_at_send_without_the_list(
    settings: Settings,
    clock: ManualClock,
    receivers: list[LocalWebhookReceiver],
    host: str,
) -> None:
    # GIVEN a subscription created while its loopback host was allow-listed, pointing at a
    # listening receiver that holds its secret, and a runtime whose settings no longer allow it
    clock.set(START)
    receiver = local_receiver(clock, NEW)
    url = start(receivers, receiver).replace("127.0.0.1", host)
    registering = settings.model_copy(update={"webhook_allowed_hosts": (host,)})
    world = await make_world(settings, clock, allowed=(), registering=registering)
    try:
        world.subscribe("hook", url, (NEW,))
        await world.publish(task_completed(clock, "t1"))

        # WHEN the reactions consumer would deliver the event
        await world.react()

        # THEN the URL is refused at send, before any connection: the receiver saw no
        # request at all, and nothing counts as delivered
        assert receiver.accepted == [] and receiver.rejected == []
        assert world.fired() == 0
    finally:
        await world.http.aclose()
        await world.app.close()
