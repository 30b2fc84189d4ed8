"""One webhook delivery as the reactions consumer sends it, against an httpx transport that
answers like a receiver: the pointer body byte for byte, the request's headers, a redirect
refused, a stall bounded by the reaction's timeout, and each failure as the delivery ledger
records it (an :class:`Attempt`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from rhumbatron.agents.signing import generate_secret
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import ReactionDeliveryError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.reactions.deliveries import attempt_webhook, pointer_body, post_webhook
from rhumbatron.reactions.subscription_models import WebhookReaction
from rhumbatron.reactions.webhook_ledger import Attempt

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
LINK = "/projects/{projectId}/events/{eventId}"
URL = "http://127.0.0.1:8080/hook"
SECRET = generate_secret()
MSG_ID = "evt_1:sub_1"
Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]


def fact(
    event_type: str,
    payload: dict[str, object],
    *,
    change_id: str | None = None,
    task_id: str | None = None,
) -> Event:
    ctx = FactContext(Caller("acme", "system:test", "corr-1"), "proj-r", NOW)
    return ctx.fact(event_type, payload, change_id=change_id, task_id=task_id)


def client(handler: Handler, *, follow_redirects: bool = False) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.MockTransport(handler), follow_redirects=follow_redirects
    )


async def post(handler: Handler, *, follow_redirects: bool = False, timeout_s: float = 5) -> int:
    async with client(handler, follow_redirects=follow_redirects) as http:
        return await post_webhook(
            http,
            url=URL,
            secrets=[SECRET],
            msg_id=MSG_ID,
            body=b'{"eventId":"evt_1"}',
            timestamp=int(NOW.timestamp()),
            allowed_hosts=("127.0.0.1",),
            timeout_s=timeout_s,
        )


async def attempt(handler: Handler, url: str = URL) -> Attempt:
    settings = load_settings(webhook_allowed_hosts=("127.0.0.1",))
    async with client(handler) as http:
        return await attempt_webhook(
            http,
            WebhookReaction(url=url, secrets=(SECRET,)),
            msg_id=MSG_ID,
            body=b"{}",
            timestamp=int(NOW.timestamp()),
            settings=settings,
        )


def test_the_pointer_body_is_sorted_compact_json_naming_the_events_subject() -> None:
    event = fact("task.completed", {"agentId": "a7"}, change_id="chg-1", task_id="t1")
    assert (
        pointer_body(event, link_template=LINK)
        == (
            f'{{"eventId":"{event.event_id}","kind":"task.completed",'
            f'"link":"/projects/proj-r/events/{event.event_id}","projectId":"proj-r",'
            '"subject":{"id":"t1","type":"task"}}'
        ).encode()
    )


def test_a_pointer_whose_subject_the_event_leaves_out_has_no_id() -> None:
    # A claim acquired on no named resource: its subject is a resource without an ID
    event = fact(
        "claim.acquired", {"claimId": "c1", "agentId": "a1", "expiresAt": "2026-12-06T11:00:00Z"}
    )
    pointer = json.loads(pointer_body(event, link_template=LINK))
    assert pointer["subject"] == {"type": "resource", "id": None}


async def test_a_delivery_is_a_signed_json_post_and_returns_its_2xx() -> None:
    seen: list[httpx.Request] = []

    async def accept(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202)

    assert await post(accept) == 202
    (request,) = seen
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == MSG_ID
    assert request.content == b'{"eventId":"evt_1"}'


async def test_a_redirect_is_refused_even_by_a_client_that_follows_them() -> None:
    async def redirect(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/elsewhere":
            return httpx.Response(204)
        return httpx.Response(307, headers={"location": "/elsewhere"}, text="moved")

    with pytest.raises(ReactionDeliveryError) as refused:
        await post(redirect, follow_redirects=True)
    assert str(refused.value) == (f"webhook {MSG_ID} to '{URL}' was answered 307, not 2xx: 'moved'")
    assert refused.value.status_code == 307


async def test_a_receiver_that_never_answers_is_given_up_after_the_timeout() -> None:
    async def stall(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(1)  # a receiver that holds the request 20 times the timeout
        return httpx.Response(204)

    with pytest.raises(ReactionDeliveryError) as refused:
        await post(stall, timeout_s=0.05)
    assert str(refused.value) == (
        f"webhook {MSG_ID} to '{URL}' got no answer within 0.05 s (RHUMBATRON_WEBHOOK_TIMEOUT_S)"
    )


async def test_the_reactions_timeout_not_the_clients_bounds_a_slow_answer() -> None:
    # GIVEN a receiver on loopback that answers 0.3 s after the request, and a client whose
    #   own timeout (0.1 s) is shorter than the reaction's (2 s)
    async def answer_late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.3)  # the answer's lateness: what the test is about
        writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_late, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(timeout=0.1) as http:
            # WHEN the delivery is posted  THEN the reaction's timeout is the one that counts
            status = await post_webhook(
                http,
                url=f"http://127.0.0.1:{port}/hook",
                secrets=[SECRET],
                msg_id=MSG_ID,
                body=b"{}",
                timestamp=int(NOW.timestamp()),
                allowed_hosts=("127.0.0.1",),
                timeout_s=2,
            )
        assert status == 204
    finally:
        server.close()
        await server.wait_closed()


async def test_a_transport_failure_is_named_with_its_type() -> None:
    async def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ReactionDeliveryError) as refused:
        await post(unreachable)
    assert str(refused.value) == (
        f"webhook {MSG_ID} to '{URL}' failed: ConnectError: connection refused"
    )


async def test_each_outcome_is_an_attempt_as_the_ledger_records_it() -> None:
    async def accept(request: httpx.Request) -> httpx.Response:
        return httpx.Response(204)

    async def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="x" * 300)

    assert await attempt(accept) == Attempt(ok=True, status_code=204)
    quoted = "x" * 200
    assert await attempt(refuse) == Attempt(
        ok=False,
        status_code=500,
        error=f"webhook {MSG_ID} to '{URL}' was answered 500, not 2xx: '{quoted}'",
    )
    # A URL the send-time check refuses: never posted, and no status
    unsafe = await attempt(accept, url="http://169.254.169.254/latest")
    assert unsafe.ok is False and unsafe.status_code is None
    assert unsafe.error is not None
    assert unsafe.error.startswith(
        "UnsafeWebhookUrlError: webhook URL 'http://169.254.169.254/latest': host "
        "'169.254.169.254' is a cloud metadata address"
    )
