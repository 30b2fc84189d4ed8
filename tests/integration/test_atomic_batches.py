"""Atomic batches (``allow_atomic``, nats-server 2.12+) as :class:`JetStreamSender` sends them,
against a real nats-server: all of a batch stored or none, in order and contiguous, each row
under its own ``Nats-Msg-Id``, and every way JetStream refuses one named in the error. The
publisher's use of them is proved in tests/faults/test_publisher_faults.py."""

from __future__ import annotations

import json
from dataclasses import replace

import nats
import pytest
from nats.aio.client import Client as NATS

from rhumbatron.errors import BatchRejectedError, NatsUnavailableError
from rhumbatron.messaging.sender import JetStreamSender, OutgoingMessage, StoredMessage
from rhumbatron_dev.local.nats_server import NatsServerProcess

SUBJECT = "events.00"
STREAM = "EVENTS_00"


def messages(*ids: str) -> list[OutgoingMessage]:
    return [OutgoingMessage(SUBJECT, i, json.dumps({"eventId": i}).encode()) for i in ids]


async def on_stream(nc: NATS) -> list[tuple[int, str, bytes]]:
    """``(sequence, Nats-Msg-Id, data)`` of every message on the stream, in order."""
    js = nc.jetstream()
    last = (await js.stream_info(STREAM)).state.last_seq
    found = []
    for seq in range(1, last + 1):
        msg = await js.get_msg(STREAM, seq)
        found.append((seq, (msg.headers or {}).get("Nats-Msg-Id", ""), msg.data or b""))
    return found


async def test_an_atomic_batch_stores_every_row_in_order_where_its_answer_says(nc: NATS) -> None:
    # GIVEN a stream that already holds another publisher's message
    await nc.jetstream().publish(SUBJECT, b"{}", headers={"Nats-Msg-Id": "other"})
    batch = messages("e1", "e2", "e3")
    # WHEN three rows go out as one atomic batch
    stored = await JetStreamSender(nc, ack_timeout_s=5).send_batch(STREAM, batch)
    # THEN each row's place is the one it has on the stream, contiguous after the other
    #   message, with its own message ID and its own bytes
    assert stored == [StoredMessage(STREAM, 2), StoredMessage(STREAM, 3), StoredMessage(STREAM, 4)]
    assert await on_stream(nc) == [
        (1, "other", b"{}"),
        *((n + 1, m.message_id, m.data) for n, m in enumerate(batch, start=1)),
    ]


async def test_a_batch_of_two_is_the_smallest_and_one_row_is_refused_by_name(nc: NATS) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    assert await sender.send_batch(STREAM, messages("a", "b")) == [
        StoredMessage(STREAM, 1),
        StoredMessage(STREAM, 2),
    ]
    with pytest.raises(
        ValueError, match=r"^an atomic batch needs at least two messages; use send\(\)$"
    ):
        await sender.send_batch(STREAM, messages("c"))
    assert [m for _, m, _ in await on_stream(nc)] == ["a", "b"]


async def test_a_batch_with_a_row_lost_on_the_way_stores_nothing(nc: NATS) -> None:
    # GIVEN a batch whose middle row is lost on the way (no stream binds its subject)
    batch = messages("e1", "e2", "e3")
    batch[1] = replace(batch[1], subject="lost.in.transit")
    # WHEN it is sent, THEN JetStream refuses it whole, with its reason and its code
    with pytest.raises(BatchRejectedError) as refused:
        await JetStreamSender(nc, ack_timeout_s=5).send_batch(STREAM, batch)
    assert str(refused.value) == (
        "JetStream refused the atomic batch: atomic publish batch is incomplete (code 10176)"
    )
    assert refused.value.code == 10176
    # AND nothing of it is on the stream
    assert await on_stream(nc) == []


async def test_a_batch_to_a_stream_that_does_not_allow_atomic_batches_is_refused(
    nats_server: NatsServerProcess,
) -> None:
    # GIVEN a stream made without allow_atomic
    client = await nats.connect(nats_server.url)
    try:
        await client.jetstream().add_stream(name="PLAIN", subjects=["plain.>"])
        batch = [OutgoingMessage("plain.x", f"p{n}", b"{}") for n in range(2)]
        # WHEN a batch is sent there, THEN it is refused whole with the server's reason
        with pytest.raises(BatchRejectedError) as refused:
            await JetStreamSender(client, ack_timeout_s=5).send_batch("PLAIN", batch)
        assert str(refused.value) == (
            "JetStream refused the atomic batch: atomic publish is disabled (code 10174)"
        )
        assert refused.value.code == 10174
        assert (await client.jetstream().stream_info("PLAIN")).state.messages == 0
    finally:
        await client.close()


async def test_a_batch_on_a_closed_connection_is_unavailable_not_refused(nc: NATS) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    await nc.close()
    with pytest.raises(
        NatsUnavailableError, match=r"^atomic batch of 2 messages: NATS connection lost"
    ):
        await sender.send_batch(STREAM, messages("a", "b"))
