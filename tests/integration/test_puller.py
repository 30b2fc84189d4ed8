"""The ``Puller`` against a real nats-server: a no-wait pull returns what is waiting, whole,
and every status JetStream ends it with is an empty batch or a named error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, StreamConfig

from rhumbatron.errors import ConsumerGoneError, MessagingError, NatsUnavailableError
from rhumbatron.messaging.pull import Puller, delivery, ensure_consumer
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


async def publish_numbered(nc: NATS, numbers: range) -> None:
    """``m<n>`` on ``pulled.a`` for each n of ``numbers``, in order."""
    js = nc.jetstream()
    for n in numbers:
        await js.publish("pulled.a", f"m{n}".encode())


async def consumer_reaches(nc: NATS, **counts: int) -> ConsumerInfo:
    """The consumer's info once its ``counts`` (``num_ack_pending=3``, …) are as given, asked
    at most 200 times: the server delivers a request on a queue of its own. The caller
    asserts on what comes back."""
    js = nc.jetstream()
    info: ConsumerInfo
    for _ in range(200):
        info = await js.consumer_info(STREAM, DURABLE)
        if all(getattr(info, name) == value for name, value in counts.items()):
            break
    return info


async def one_per_request(nc: NATS) -> None:
    """The consumer, serving at most one message per request (max_batch: nats-py's
    ConsumerConfig has no field for it, so it is created through the API itself)."""
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


def subscriptions(server: NatsServerProcess) -> int:
    """How many subscriptions the server holds, over every connection (``/connz``)."""
    return sum(len(c.get("subscriptions_list") or []) for c in server.connz(subscriptions=True))


async def test_a_closed_puller_leaves_no_subscription_and_subscribes_again_when_used(
    nc: NATS, nats_server: NatsServerProcess
) -> None:
    # GIVEN two waiting messages and a puller that has pulled once (its inbox subscribed)
    for n in range(2):
        await nc.jetstream().publish("pulled.a", b"m", headers={"Nats-Msg-Id": f"id-{n}"})
    puller = await reader(nc)
    await nc.flush()
    before = subscriptions(nats_server)
    assert len(await puller.pull(1)) == 1
    await nc.flush()
    assert subscriptions(nats_server) == before + 1
    # WHEN it is closed, THEN the server holds its subscription no more
    await puller.close()
    await nc.flush()
    assert subscriptions(nats_server) == before
    # WHEN it is used again, THEN it subscribes again and pulls what waits
    assert len(await puller.pull(1)) == 1
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
    # GIVEN a consumer that serves at most one message per request, and a message waiting
    await nc.jetstream().publish("pulled.a", b"one")
    await one_per_request(nc)
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


async def test_a_refusal_that_comes_after_its_pull_gave_up_does_not_end_the_next_pull(
    nc: NATS, nats_server: NatsServerProcess
) -> None:
    # GIVEN a consumer that serves at most one message per request, nothing waiting, and a
    #   server that stalls
    await one_per_request(nc)
    puller = Puller(nc, STREAM, DURABLE, timeout_s=1.0)
    nats_server.pause()
    try:
        # WHEN a pull asking for five gives up before the server could refuse it
        assert await puller.pull(5) == []
        # AND the next pull is in flight when the server carries on
        second = asyncio.create_task(puller.pull(1))
        nats_server.resume()
        # THEN the first pull's refusal, arriving first, is not taken for the second's
        #   answer: the second ends with its own (nothing waiting), not with that error
        assert await second == []
    finally:
        nats_server.resume()
        await puller.close()


async def test_a_refusal_that_comes_after_its_own_pull_ended_is_dropped_without_an_error(
    nats_server: NatsServerProcess,
) -> None:
    # GIVEN a client that records what its subscriptions' callbacks raise, a consumer that
    #   serves at most one message per request, a watcher of every inbox's refusals, and a
    #   server that stalls
    raised: list[Exception] = []

    async def record(exc: Exception) -> None:
        raised.append(exc)

    client = await nats.connect(nats_server.url, error_cb=record)
    await client.jetstream().add_stream(StreamConfig(name=STREAM, subjects=["pulled.>"]))
    await one_per_request(client)
    refused = asyncio.get_running_loop().create_future()

    async def watch(msg: Msg) -> None:
        if msg.headers and msg.headers.get("Status") == "409" and not refused.done():
            refused.set_result(msg.subject)

    await client.subscribe("_INBOX.>", cb=watch)
    puller = Puller(client, STREAM, DURABLE, timeout_s=1.0)
    nats_server.pause()
    try:
        # WHEN a pull asking for five gives up, and the server's refusal then reaches its
        #   reply subject while no pull is in flight
        assert await puller.pull(5) == []
        nats_server.resume()
        await asyncio.wait_for(refused, 10.0)
        # (a drain returns once every subscription's callback has handled what it got)
        await client.drain()
        # THEN the refusal was dropped quietly: the puller's callback raised nothing
        assert raised == []
    finally:
        nats_server.resume()
        await puller.close()
        await client.close()


async def test_held_messages_come_first_and_the_server_is_asked_only_for_the_rest(
    nc: NATS,
) -> None:
    # GIVEN ten messages, and a pull of four whose last two the reader hands back unsettled
    js = nc.jetstream()
    await publish_numbered(nc, range(10))
    puller = await reader(nc)
    try:
        first = await puller.pull(4)
        puller.hold(first[2:])

        # WHEN it pulls four again
        second = await puller.pull(4)

        # THEN the two held come first, then two new ones: the server sent only two more
        assert [m.data for m in second] == [b"m2", b"m3", b"m4", b"m5"]
        info = await js.consumer_info(STREAM, DURABLE)
        assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (4, 6, 0)

        # AND what is held is given back by release, once
        puller.hold(second[3:])
        assert [m.data for m in await puller.release()] == [b"m5"]
        assert await puller.release() == []
    finally:
        await puller.close()


async def test_held_messages_that_fill_the_pull_are_handed_out_without_asking_the_server(
    nc: NATS,
) -> None:
    # GIVEN six messages, and a pull of four whose last two the reader hands back unsettled
    js = nc.jetstream()
    await publish_numbered(nc, range(6))
    puller = await reader(nc)
    try:
        puller.hold((await puller.pull(4))[2:])
        # WHEN it pulls exactly two
        again = await puller.pull(2)
        # THEN the two held are the pull, and the server delivered nothing more
        assert [m.data for m in again] == [b"m2", b"m3"]
        info = await js.consumer_info(STREAM, DURABLE)
        assert (info.num_pending, info.num_ack_pending) == (2, 4)
    finally:
        await puller.close()


async def test_a_pull_on_a_closed_connection_says_so_and_that_the_next_run_tries_again(
    nats_server: NatsServerProcess, nc: NATS
) -> None:
    # GIVEN a consumer, and a puller of it whose connection is closed
    await (await reader(nc)).close()
    closed = await nats.connect(nats_server.url)
    await closed.close()
    puller = Puller(closed, STREAM, DURABLE, timeout_s=5.0)
    # WHEN it pulls, THEN the error names the consumer, the stream and nats-py's words
    with pytest.raises(NatsUnavailableError) as refused:
        await puller.pull(1)
    assert str(refused.value) == (
        f"cannot pull from consumer {DURABLE} on {STREAM}: ConnectionClosedError: "
        "nats: connection closed; the next run tries again"
    )


async def test_a_held_message_is_kept_no_longer_than_the_late_messages_limit(nc: NATS) -> None:
    # GIVEN a reader that keeps messages 0 s after their arrival, and one message held
    await nc.jetstream().publish("pulled.a", b"old")
    puller = await reader(nc)
    puller.keep_late_s = 0.0
    try:
        puller.hold(await puller.pull(1))
        # WHEN it pulls again, THEN the held message is not handed out (JetStream will send
        #   it again after the ack wait), and nothing else is waiting
        assert await puller.pull(1) == []
    finally:
        await puller.close()


async def test_a_held_messages_age_counts_from_its_arrival_not_from_its_hold(nc: NATS) -> None:
    # GIVEN a reader that keeps messages 0.2 s after their arrival, and one message it
    #   worked on for 0.3 s before holding it back
    await nc.jetstream().publish("pulled.a", b"worked")
    puller = await reader(nc)
    puller.keep_late_s = 0.2
    try:
        pulled = await puller.pull(1)
        await asyncio.sleep(0.3)  # the reader's work on the batch (the fault), not a wait
        puller.hold(pulled)
        # WHEN it pulls again, THEN the message is too old to hand out: holding it did not
        #   make it young again (JetStream will send it again after its ack wait)
        assert await puller.pull(1) == []
    finally:
        await puller.close()


async def test_a_held_message_redelivered_meanwhile_is_handed_out_once_as_its_newest_copy(
    nc: NATS,
) -> None:
    # GIVEN a reader whose consumer waits 1 s for an ack, and a message it held back for the
    #   next pull past that wait (the server will send it again)
    await nc.jetstream().publish("pulled.a", b"held")
    puller = await reader(nc, ack_wait=1.0)
    try:
        puller.hold(await puller.pull(1))
        await asyncio.sleep(1.3)  # the hold outlives the ack wait: the fault, not a sync
        # WHEN it pulls two, so the server's redelivery comes with the held copy
        pulled = await puller.pull(2)
        # THEN the message is handed out once, as the copy JetStream expects the ack of
        assert [(m.data, delivery(m)) for m in pulled] == [(b"held", (1, 2))]
    finally:
        await puller.close()


async def test_a_hold_puts_its_messages_ahead_of_those_prefetched_and_loses_none(
    nc: NATS,
) -> None:
    # GIVEN six messages, a pull of two, and the next four asked for ahead and delivered
    await publish_numbered(nc, range(6))
    puller = await reader(nc)
    try:
        first = await puller.pull(2)
        await puller.prefetch(6)
        info = await consumer_reaches(nc, num_ack_pending=6)
        assert info.num_ack_pending == 6
        # WHEN the second of the first two is held back, and the reader pulls five
        puller.hold(first[1:])
        # THEN it comes first, then the four prefetched, none lost or doubled
        assert [m.data for m in await puller.pull(5)] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    finally:
        await puller.close()


async def test_a_messages_delivery_is_read_off_its_reply_subject_as_nats_py_reads_it(
    nc: NATS,
) -> None:
    # GIVEN messages pulled from a real server, one of them delivered twice
    await publish_numbered(nc, range(3))
    puller = await reader(nc)
    try:
        first = await puller.pull(3)
        await first[1].nak()
        # JetStream handles a nak on a queue of its own: the redelivery may trail it
        # (asked a bounded number of times)
        again: list[Msg] = []
        for _ in range(200):
            again = await puller.pull(3)
            if again:
                break
        # THEN the stream sequence and delivery count match nats.py's full metadata
        for msg in [*first, *again]:
            expected = (msg.metadata.sequence.stream, msg.metadata.num_delivered)
            assert delivery(msg) == expected
        assert [delivery(m) for m in again] == [(2, 2)]
    finally:
        await puller.close()


def test_a_reply_subject_of_the_domain_form_is_read_too() -> None:
    # The 12-token form a server with a JetStream domain sends (nats.py reads both)
    reply = "$JS.ACK.hub.ACCHASH.PULLED.reader.3.41.17.1700000000000000000.5.token"
    assert delivery(Msg(_client=None, reply=reply)) == (41, 3)  # type: ignore[arg-type]
    # even where its stream and consumer are named with digits, where the common form's
    # numbers sit
    reply = "$JS.ACK.hub.ACCHASH.70.90.3.41.17.1700000000000000000.5.token"
    assert delivery(Msg(_client=None, reply=reply)) == (41, 3)  # type: ignore[arg-type]


class _MetadataRefused(Msg):
    """A message whose nats.py metadata may not be built: the hot path must not need it."""

    @property
    def metadata(self) -> Msg.Metadata:
        raise AssertionError("nats.py's metadata was built for the common reply form")


def test_the_common_reply_form_is_read_without_building_nats_pys_metadata() -> None:
    # The 9-token form nats-server sends without a domain: read off the subject itself (a
    # tenth of the metadata's cost, which also builds a datetime per message)
    reply = "$JS.ACK.PULLED.reader.3.41.17.1700000000000000000.5"
    assert delivery(_MetadataRefused(_client=None, reply=reply)) == (41, 3)  # type: ignore[arg-type]


async def test_a_prefetch_delivers_now_what_the_next_pull_hands_out(nc: NATS) -> None:
    # GIVEN five messages, and a reader that prefetches three
    await publish_numbered(nc, range(5))
    puller = await reader(nc)
    try:
        await puller.prefetch(3)
        # THEN the server delivers them at once, before any pull asks
        info = await consumer_reaches(nc, num_ack_pending=3)
        assert (info.num_ack_pending, info.num_pending) == (3, 2)
        # AND the next pull of three hands out exactly those
        assert [m.data for m in await puller.pull(3)] == [b"m0", b"m1", b"m2"]
        # AND a prefetch in flight is waited for by release, which returns its messages
        await puller.prefetch(2)
        assert [m.data for m in await puller.release()] == [b"m3", b"m4"]
    finally:
        await puller.close()


async def test_a_pull_after_a_short_prefetch_asks_the_server_for_the_rest(nc: NATS) -> None:
    # GIVEN two messages, and a reader whose prefetch of five got only those
    await publish_numbered(nc, range(2))
    puller = await reader(nc)
    try:
        await puller.prefetch(5)
        # (the prefetch's request ended: the server delivered the two and waits for no pull)
        info = await consumer_reaches(nc, num_ack_pending=2, num_waiting=0)
        assert (info.num_ack_pending, info.num_waiting) == (2, 0)
        # WHEN three more are published, and a pull of five follows
        await publish_numbered(nc, range(2, 5))
        pulled = await puller.pull(5)
        # THEN the pull handed out the prefetched two and asked the server for the other three
        assert [m.data for m in pulled] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    finally:
        await puller.close()
