"""The ``Puller`` against a real nats-server: a no-wait pull returns what is waiting, whole,
and every status JetStream ends it with is an empty batch or a named error."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from rhumbatron.errors import ConsumerGoneError, MessagingError
from rhumbatron.messaging.pull import Puller, ensure_consumer
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration

STREAM = "PULLED"
DURABLE = "reader"


@pytest_asyncio.fixture
async def nc(nats_server: NatsServerProcess) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_server.url)
    await client.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["pulled.>"]))
    yield client
    await client.close()


async def reader(nc: NATS, **fields: Any) -> Puller:
    config = ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, **fields)
    await ensure_consumer(nc.jetstream(), STREAM, config)
    return Puller(nc, STREAM, DURABLE, timeout_s=5.0)


async def test_one_pull_returns_the_whole_batch_when_enough_are_waiting(nc: NATS) -> None:
    # 300 messages of 1 KiB: more than one read of the socket, so a pull that ended at its
    # first message would come back short
    js = nc.jetstream()
    for n in range(300):
        body = f"m{n:03d}".encode().ljust(1024, b".")
        await js.publish("pulled.a", body, headers={"Nats-Msg-Id": f"id-{n}"})
    puller = await reader(nc)
    try:
        batch = await puller.pull(300)
        assert [m.data[:4] for m in batch] == [f"m{n:03d}".encode() for n in range(300)]
        assert await puller.pull(300) == []  # and then nothing, at once
    finally:
        await puller.close()


async def test_a_message_published_without_headers_is_pulled_like_any_other(nc: NATS) -> None:
    await nc.jetstream().publish("pulled.a", b"bare")
    puller = await reader(nc)
    try:
        assert [m.data for m in await puller.pull(5)] == [b"bare"]
    finally:
        await puller.close()


async def test_a_pull_from_a_consumer_that_does_not_exist_names_it(nc: NATS) -> None:
    puller = Puller(nc, STREAM, "never-made", timeout_s=5.0)
    try:
        with pytest.raises(ConsumerGoneError) as gone:
            await puller.pull(5)
        assert str(gone.value) == (
            f"consumer never-made on {STREAM} does not exist (503 no responders)"
        )
    finally:
        await puller.close()


async def test_a_pull_the_server_refuses_names_its_status_and_its_words(nc: NATS) -> None:
    # GIVEN a consumer that serves at most one message per request (max_batch: nats-py's
    #   ConsumerConfig has no field for it, so it is created through the API itself)
    await nc.jetstream().publish("pulled.a", b"one")
    created = await nc.request(
        f"$JS.API.CONSUMER.CREATE.{STREAM}.{DURABLE}",
        json.dumps(
            {
                "stream_name": STREAM,
                "config": {"durable_name": DURABLE, "ack_policy": "explicit", "max_batch": 1},
            }
        ).encode(),
        timeout=5,
    )
    assert "error" not in json.loads(created.data), created.data
    puller = Puller(nc, STREAM, DURABLE, timeout_s=5.0)
    try:
        # WHEN a pull asks for five
        with pytest.raises(MessagingError) as refused:
            await puller.pull(5)
        # THEN the refusal is JetStream's status and description, not an empty batch
        assert not isinstance(refused.value, ConsumerGoneError)
        assert str(refused.value) == (
            f"pull from consumer {DURABLE} on {STREAM} failed: 409 Exceeded MaxRequestBatch of 1"
        )
        # AND a pull within the limit still gets the message
        assert [m.data for m in await puller.pull(1)] == [b"one"]
    finally:
        await puller.close()
