"""The webhook receiver helper (RELIABILITY B1, B2): a signed pointer body accepted; a bad
signature, a re-serialised body, a timestamp past the 300 s tolerance, a replayed ID, missing
headers and a body that is not the pointer refused with a clear 401; both secrets valid during
a rotation and the dropped one refused after; a seen set that forgets and stays bounded."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from rhumbatron.agents.signing import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    generate_secret,
    signed_headers,
)
from rhumbatron.core.clock import ManualClock
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import (
    ConfigurationError,
    WebhookRejected,
    WebhookSecretError,
    WebhookSignatureError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions import webhook_verification as receiver_module
from rhumbatron.reactions.deliveries import pointer_body, webhook_id
from rhumbatron.reactions.webhook_verification import (
    PointerSubject,
    RejectionReason,
    WebhookReceiver,
)

START = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
OLD, NEW = generate_secret(), generate_secret()
SUB = "sub_" + "b" * 32
LINK = "/projects/{projectId}/events/{eventId}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def task_completed(clock: ManualClock, task: str = "t1") -> Event:
    ctx = FactContext(Caller("acme", "system:test", "corr-1"), "proj-r", clock.now())
    return ctx.fact("task.completed", {"agentId": "a7"}, change_id="proj-r-chg-1", task_id=task)


def delivery(
    clock: ManualClock,
    *,
    secrets: tuple[str, ...] = (NEW,),
    event: Event | None = None,
    body: bytes | None = None,
    timestamp: int | None = None,
) -> tuple[dict[str, str], bytes]:
    """What the reactions consumer sends for ``event``: its signed headers and pointer body."""
    event = event or task_completed(clock)
    body = pointer_body(event, link_template=LINK) if body is None else body
    stamp = int(clock.now().timestamp()) if timestamp is None else timestamp
    return signed_headers(secrets, webhook_id(event.event_id, SUB), stamp, body), body


def rejection(receiver: WebhookReceiver, headers: dict[str, str], body: bytes) -> WebhookRejected:
    with pytest.raises(WebhookRejected) as caught:
        receiver.verify(headers, body)
    return caught.value


# -- accepted ------------------------------------------------------------------------------------


def test_a_signed_pointer_body_is_accepted_with_its_fields(clock: ManualClock) -> None:
    # GIVEN a receiver holding the subscription's secret, and a delivery as the consumer signs it
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    headers, body = delivery(clock, event=event)

    # WHEN it is verified, header names in another case
    received = receiver.verify({k.upper(): v for k, v in headers.items()}, body)

    # THEN the pointer's fields and the signed headers' values come back
    assert received.webhook_id == f"{event.event_id}:{SUB}"
    assert received.timestamp == int(START.timestamp())
    assert (received.event_id, received.kind, received.project_id) == (
        event.event_id,
        "task.completed",
        "proj-r",
    )
    assert received.subject == PointerSubject(type="task", id="t1")
    assert received.link == f"/projects/proj-r/events/{event.event_id}"
    assert received.subscription_id == SUB
    assert receiver.seen_count == 1


# -- B1: each refusal is a clear 401 -------------------------------------------------------------


def test_a_signature_of_another_secret_is_rejected_with_401(clock: ManualClock) -> None:
    # GIVEN a delivery signed with a secret the receiver does not hold
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock, secrets=(OLD,))
    # WHEN it is verified  THEN it is a 401 for the signature, saying what was tried
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.SIGNATURE)
    assert refused.webhook_id == headers[ID_HEADER]
    assert "no signature of webhook" in str(refused)
    assert "1 current secret(s) tried" in str(refused)
    assert isinstance(refused, WebhookSignatureError)
    assert receiver.seen_count == 0


def test_a_re_serialised_body_with_the_same_json_is_rejected(clock: ManualClock) -> None:
    # GIVEN a signed delivery whose body a proxy re-serialised: the same JSON, other bytes
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock)
    reserialised = json.dumps(json.loads(body), indent=2).encode()
    assert json.loads(reserialised) == json.loads(body) and reserialised != body

    # WHEN it is verified  THEN the signature over the original bytes does not match
    refused = rejection(receiver, headers, reserialised)
    assert (refused.status, refused.reason) == (401, RejectionReason.SIGNATURE)
    assert "the body or a header was changed" in str(refused)


@pytest.mark.parametrize(
    ("offset_s", "accepted"),
    [(-300, True), (-301, False), (300, True), (301, False)],
    ids=["300s-old", "301s-old", "300s-ahead", "301s-ahead"],
)
def test_the_timestamp_tolerance_is_300_s_either_way(
    clock: ManualClock, offset_s: int, accepted: bool
) -> None:
    # GIVEN a delivery signed offset_s from the receiver's now
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock, timestamp=int(START.timestamp()) + offset_s)

    # WHEN it is verified
    # THEN 300 s passes and 301 s is a 401 for the timestamp, naming how far off it is
    if accepted:
        assert receiver.verify(headers, body).timestamp == int(START.timestamp()) + offset_s
        return
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.TIMESTAMP)
    assert "301 s" in str(refused) and "the tolerance is 300 s" in str(refused)


def test_a_replayed_webhook_id_is_rejected_until_forgotten(clock: ManualClock) -> None:
    # GIVEN a delivery the receiver accepted
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock)
    receiver.verify(headers, body)

    # WHEN the same bytes arrive again 10 s later
    clock.advance(10)
    refused = rejection(receiver, headers, body)

    # THEN it is a 401 for a replay; once the receiver forgets it (its processing failed),
    # the sender's retry is accepted
    assert (refused.status, refused.reason) == (401, RejectionReason.REPLAY)
    assert str(refused) == (
        f"webhook {headers[ID_HEADER]!r} with timestamp {int(START.timestamp())} was accepted "
        "before, and is still inside the 300 s window: the same message again is a replay, "
        "refused (a retry by the sender carries a new timestamp and is answered as a duplicate)"
    )
    assert refused.webhook_id == headers[ID_HEADER]
    receiver.forget(headers[ID_HEADER])
    receiver.forget(headers[ID_HEADER])  # forgetting twice, or an ID never seen, is harmless
    assert receiver.verify(headers, body).webhook_id == headers[ID_HEADER]


def test_the_senders_retry_of_an_accepted_id_is_a_duplicate_not_a_replay(
    clock: ManualClock,
) -> None:
    # GIVEN a delivery the receiver accepted (its answer never reached the sender)
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    first = receiver.verify(*delivery(clock, event=event))

    # WHEN the sender retries it 5 s later: the same webhook-id, a new timestamp and signature
    clock.advance(5)
    retry_headers, retry_body = delivery(clock, event=event)
    retry = receiver.verify(retry_headers, retry_body)

    # THEN the retry is accepted as a duplicate (answer 2xx, do not act twice), and a replay
    # of the retry's own bytes is still refused
    assert (first.duplicate, retry.duplicate) == (False, True)
    assert retry.webhook_id == first.webhook_id
    assert rejection(receiver, retry_headers, retry_body).reason is RejectionReason.REPLAY


@pytest.mark.parametrize("missing", [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER])
def test_a_missing_header_is_rejected_naming_it(clock: ManualClock, missing: str) -> None:
    # GIVEN a signed delivery without one of its three headers
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock)
    del headers[missing]
    # WHEN it is verified  THEN it is a 401 naming the header
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.HEADERS)
    assert f"no {missing} header" in str(refused)


def test_a_timestamp_that_is_not_unix_seconds_is_rejected(clock: ManualClock) -> None:
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock)
    headers[TIMESTAMP_HEADER] = START.isoformat()
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.HEADERS)
    assert "is not Unix seconds" in str(refused)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "is not JSON"),
        (b"[1, 2]", "is a JSON list, not an object"),
        (b'{"eventId": "evt_1"}', "lacks kind, subject, projectId, link"),
        (
            b'{"eventId": "", "kind": "task.completed", "subject": {"type": "task", "id": "t"},'
            b' "projectId": "p", "link": "/l"}',
            "has eventId that is not a non-empty string",
        ),
        (
            b'{"eventId": "EVENT", "kind": "task.completed", "subject": "t1", "projectId": "p",'
            b' "link": "/l"}',
            "has subject 't1', not {type, id}",
        ),
        (
            b'{"eventId": "evt_other", "kind": "task.completed", "subject": {"type": "task",'
            b' "id": "t"}, "projectId": "p", "link": "/l"}',
            "names event 'evt_other' while the webhook-id is not",
        ),
    ],
    ids=["not-json", "array", "missing-fields", "empty-id", "bad-subject", "other-event"],
)
def test_a_signed_body_that_is_not_the_pointer_is_rejected(
    clock: ManualClock, body: bytes, says: str
) -> None:
    # GIVEN a correctly signed body of another shape
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    body = body.replace(b"EVENT", event.event_id.encode())
    headers, body = delivery(clock, event=event, body=body)
    # WHEN it is verified  THEN it is a 401 for the body, saying what is wrong with it
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.BODY)
    assert says in str(refused)
    assert refused.webhook_id == headers[ID_HEADER]
    assert "pointer body is a JSON object of eventId, kind, subject, projectId, link" in str(
        refused
    )
    assert receiver.seen_count == 0


# -- B2: secret rotation -------------------------------------------------------------------------


def test_during_a_rotation_a_receiver_holding_either_secret_accepts(clock: ManualClock) -> None:
    # GIVEN a sender in the overlap, signing with the new and the old secret
    new_only = WebhookReceiver([NEW], clock=clock)
    old_only = WebhookReceiver([OLD], clock=clock)
    both = WebhookReceiver([NEW, OLD], clock=clock)
    headers, body = delivery(clock, secrets=(NEW, OLD))

    # WHEN receivers holding the new, the old, or both secrets verify it
    # THEN each accepts
    for receiver in (new_only, old_only, both):
        assert receiver.verify(headers, body).webhook_id == headers[ID_HEADER]


def test_once_the_sender_dropped_the_old_secret_a_receiver_holding_only_it_rejects(
    clock: ManualClock,
) -> None:
    # GIVEN a sender that finished its rotation (new secret only) and a receiver still on the old
    receiver = WebhookReceiver([OLD], clock=clock)
    headers, body = delivery(clock, secrets=(NEW,))

    # WHEN it verifies a delivery  THEN it is a 401 for the signature
    refused = rejection(receiver, headers, body)
    assert (refused.status, refused.reason) == (401, RejectionReason.SIGNATURE)

    # AND once the receiver is given the new secret, the delivery is accepted
    receiver.set_secrets([NEW])
    assert receiver.verify(headers, body).webhook_id == headers[ID_HEADER]


# -- the seen set --------------------------------------------------------------------------------


def test_an_accepted_id_is_remembered_through_the_window_and_forgotten_after_it(
    clock: ManualClock,
) -> None:
    # GIVEN a delivery accepted at its own timestamp
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock)
    receiver.verify(headers, body)

    # WHEN its bytes are replayed 300 s later, and again 301 s later
    clock.advance(300)
    at_300 = rejection(receiver, headers, body)
    clock.advance(1)
    at_301 = rejection(receiver, headers, body)

    # THEN the first is caught by the seen set, the second by the timestamp, which the
    # seen set no longer needs to remember
    assert at_300.reason is RejectionReason.REPLAY
    assert at_301.reason is RejectionReason.TIMESTAMP
    assert receiver.seen_count == 0


def test_the_seen_set_is_bounded_and_forgets_the_soonest_to_expire_first(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a receiver that remembers at most two IDs
    receiver = WebhookReceiver([NEW], clock=clock, seen_capacity=2)
    first, second, third = (delivery(clock, event=task_completed(clock, t)) for t in "abc")
    receiver.verify(*first)
    clock.advance(1)
    receiver.verify(*second)

    # WHEN a third is accepted
    with caplog.at_level(logging.WARNING, logger=receiver_module.__name__):
        receiver.verify(*third)

    # THEN it holds two: the first was forgotten early (and said so), the others still caught
    assert receiver.seen_count == 2
    assert caplog.messages == [
        f"the webhook receiver's seen set is full (2 IDs): forgot {first[0][ID_HEADER]} early; "
        "a replay of it would no longer be caught (raise seen_capacity)"
    ]
    assert rejection(receiver, *second).reason is RejectionReason.REPLAY
    assert rejection(receiver, *third).reason is RejectionReason.REPLAY
    assert receiver.verify(*first).webhook_id == first[0][ID_HEADER]


def test_forgetting_and_accepting_again_keeps_the_seen_set_bounded(clock: ManualClock) -> None:
    # GIVEN a receiver of capacity 3 whose processing keeps failing on one delivery
    receiver = WebhookReceiver([NEW], clock=clock, seen_capacity=3)
    headers, body = delivery(clock)

    # WHEN it is accepted and forgotten many times
    held: list[int] = []
    for _ in range(50):
        receiver.verify(headers, body)
        held.append(len(receiver._seen._heap))
        receiver.forget(headers[ID_HEADER])

    # THEN nothing piles up: the entries kept stay within twice the capacity
    assert receiver.seen_count == 0
    assert max(held) <= 6


# -- configuration -------------------------------------------------------------------------------


def test_a_receiver_refuses_a_malformed_secret_or_none_at_construction(clock: ManualClock) -> None:
    with pytest.raises(WebhookSecretError, match="without that prefix"):
        WebhookReceiver(["not-a-secret"], clock=clock)
    needs = "a webhook receiver needs a sequence of one or two whsec_ secrets (the "
    needs += "subscription's); got "
    with pytest.raises(WebhookSecretError) as caught:
        WebhookReceiver([], clock=clock)
    assert str(caught.value) == needs + "none"
    with pytest.raises(WebhookSecretError) as caught:
        WebhookReceiver(NEW, clock=clock)
    assert str(caught.value) == needs + "a single string: wrap it in a list"
    with pytest.raises(ConfigurationError, match="tolerance_s=0"):
        WebhookReceiver([NEW], clock=clock, tolerance_s=0)
    with pytest.raises(ConfigurationError, match="seen_capacity=0"):
        WebhookReceiver([NEW], clock=clock, seen_capacity=0)


def test_the_smallest_tolerance_and_seen_set_are_one(clock: ManualClock) -> None:
    # GIVEN a receiver with a 1 s tolerance that remembers one ID  WHEN a delivery arrives
    receiver = WebhookReceiver([NEW], clock=clock, tolerance_s=1, seen_capacity=1)
    # THEN it is accepted and remembered
    assert receiver.verify(*delivery(clock)).timestamp == int(START.timestamp())
    assert receiver.seen_count == 1


def test_a_wrong_signature_at_the_edge_of_the_tolerance_is_refused_for_its_signature(
    clock: ManualClock,
) -> None:
    # GIVEN a delivery signed with another secret, its timestamp exactly 300 s old
    receiver = WebhookReceiver([NEW], clock=clock)
    headers, body = delivery(clock, secrets=(OLD,), timestamp=int(START.timestamp()) - 300)
    # WHEN it is verified  THEN the timestamp is within the tolerance: the signature failed
    assert rejection(receiver, headers, body).reason is RejectionReason.SIGNATURE


@pytest.mark.parametrize(
    ("subject", "fields", "says"),
    [
        ({"type": "task", "id": 5}, {}, "has subject \"{'type': 'task', 'id': 5}\", not"),
        ("x" * 100, {}, f"has subject {'x' * 80!r}, not {{type, id}}"),
        ({"type": "task", "id": "t"}, {"kind": "", "link": 7}, "has kind, link that is not"),
    ],
)
def test_a_pointers_bad_fields_are_named_in_the_refusal(
    clock: ManualClock, subject: object, fields: dict[str, object], says: str
) -> None:
    # GIVEN a signed pointer with a bad subject, or two fields that are no non-empty string
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    pointer = json.loads(pointer_body(event, link_template=LINK)) | {"subject": subject}
    headers, body = delivery(clock, event=event, body=json.dumps(pointer | fields).encode())
    # WHEN it is verified  THEN the refusal names what is wrong
    assert f"is signed but its body {says}" in str(rejection(receiver, headers, body))


def test_a_pointer_whose_subject_has_no_id_is_accepted(clock: ManualClock) -> None:
    # GIVEN a pointer about a project-wide fact: its subject has a type and no id
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    pointer = json.loads(pointer_body(event, link_template=LINK))
    pointer["subject"] = {"type": "project"}
    headers, body = delivery(clock, event=event, body=json.dumps(pointer).encode())
    # WHEN it is verified  THEN it is accepted, its subject's id None
    assert receiver.verify(headers, body).subject == PointerSubject(type="project", id=None)


def test_the_public_api_is_what_all_says() -> None:
    public = {
        name
        for name, value in vars(receiver_module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == receiver_module.__name__
    }
    assert public <= set(receiver_module.__all__)
    assert all(hasattr(receiver_module, name) for name in receiver_module.__all__)


def test_a_receiver_that_remembers_the_whole_schedule_flags_a_late_retry_as_a_duplicate(
    clock: ManualClock,
) -> None:
    # GIVEN two receivers that took the same delivery: one remembering IDs for the retry
    # schedule (about 17.6 h), one for the tolerance window only
    event = task_completed(clock)
    long_memory = WebhookReceiver([NEW], clock=clock, remember_s=63_305)
    short_memory = WebhookReceiver([NEW], clock=clock)
    first = delivery(clock, event=event)
    long_memory.verify(*first)
    short_memory.verify(*first)

    # WHEN the sender's retry comes 30 min later (its third attempt)
    clock.advance(minutes=30)
    retry = delivery(clock, event=event)

    # THEN only the receiver that still remembers the ID flags it as a duplicate
    assert long_memory.verify(*retry).duplicate is True
    assert short_memory.verify(*retry).duplicate is False


def test_a_webhook_id_is_split_at_its_first_colon(clock: ManualClock) -> None:
    # GIVEN a delivery whose webhook-id holds a colon in its subscription part
    receiver = WebhookReceiver([NEW], clock=clock)
    event = task_completed(clock)
    body = pointer_body(event, link_template=LINK)
    stamp = int(clock.now().timestamp())
    headers = signed_headers((NEW,), f"{event.event_id}:sub_a:b", stamp, body)
    # WHEN it is verified  THEN the event part is the event's ID and the rest the subscription
    assert receiver.verify(headers, body).subscription_id == "sub_a:b"
