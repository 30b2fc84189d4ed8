"""Fast-ingest batches (``allow_batched``, nats-server 2.14+) as :class:`JetStreamSender` sends
them, against a real nats-server: each row stored as it arrives, in order, nothing after a
row lost on the way, repeats dropped by the duplicate window. The publisher's use of them
(order across a refused row, NATS dying mid-batch, a crash after the PubAck) is proved in
tests/faults/test_publisher_faults.py for every ``publish_batch_mode``."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from rhumbatron.actors.publisher import publish_batch_mode
from rhumbatron.core.settings import load_settings
from rhumbatron.errors import BatchRejectedError, LogUnavailableError, NatsUnavailableError
from rhumbatron.messaging.sender import JetStreamSender, OutgoingMessage
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .test_publisher import eventually

SUBJECT = "events.00"
STREAM = "EVENTS_00"


def messages(*ids: str) -> list[OutgoingMessage]:
    return [OutgoingMessage(SUBJECT, i, json.dumps({"eventId": i}).encode()) for i in ids]


async def on_stream(nc: NATS, stream: str = STREAM) -> list[tuple[int, str]]:
    """``(sequence, Nats-Msg-Id)`` of every message on ``stream``, in order."""
    js = nc.jetstream()
    last = (await js.stream_info(stream)).state.last_seq
    found = []
    for seq in range(1, last + 1):
        msg = await js.get_msg(stream, seq)
        found.append((seq, (msg.headers or {}).get("Nats-Msg-Id", "")))
    return found


async def test_a_fast_batch_stores_every_row_in_order_and_its_puback_names_the_last(
    nc: NATS,
) -> None:
    # GIVEN a stream that already holds another publisher's message
    await nc.jetstream().publish(SUBJECT, b"{}", headers={"Nats-Msg-Id": "other"})
    # WHEN five rows go out as one fast batch
    ack = await JetStreamSender(nc, ack_timeout_s=5).send_fast_batch(
        STREAM, messages("e1", "e2", "e3", "e4", "e5")
    )
    # THEN all five are kept, the PubAck names where the last one went, and the stream holds
    # them once each, in order, after the earlier message
    assert (ack.stream, ack.stored, ack.last_sequence) == (STREAM, 5, 6)
    assert await on_stream(nc) == [(1, "other"), *((n + 1, f"e{n}") for n in range(1, 6))]


async def test_a_fast_batch_longer_than_its_flow_windows_waits_for_the_flow_acks_and_ends_whole(
    nc: NATS,
) -> None:
    # GIVEN more rows than two flow windows of 100 may hold unacknowledged
    ids = [f"e{n:03d}" for n in range(450)]
    # WHEN they go out as one fast batch (the sender must read the server's flow acks to go on)
    ack = await JetStreamSender(nc, ack_timeout_s=5).send_fast_batch(STREAM, messages(*ids))
    # THEN every row is kept, in order
    assert (ack.stored, ack.last_sequence) == (450, 450)
    assert [m for _, m in await on_stream(nc)] == ids


async def test_a_row_lost_on_the_way_ends_the_fast_batch_and_nothing_after_it_is_stored(
    nc: NATS,
) -> None:
    # GIVEN a batch whose third row is lost on the way (no stream binds its subject)
    batch = messages("e1", "e2", "e3", "e4", "e5")
    batch[2] = replace(batch[2], subject="lost.in.transit")
    # WHEN it is sent
    ack = await JetStreamSender(nc, ack_timeout_s=5).send_fast_batch(STREAM, batch)
    # THEN the server saw the gap: only the two rows before it are kept, and rows 4 and 5,
    # which would have been stored, are not (so a retry keeps the project's order)
    assert (ack.stored, ack.last_sequence) == (2, 2)
    assert await on_stream(nc) == [(1, "e1"), (2, "e2")]


async def test_a_row_already_stored_is_dropped_by_the_duplicate_window_and_the_batch_goes_on(
    nc: NATS,
) -> None:
    # GIVEN row 3 already on the stream (an earlier publisher died before marking it)
    await nc.jetstream().publish(SUBJECT, b"{}", headers={"Nats-Msg-Id": "e3"})
    # WHEN a batch holding it again is sent
    ack = await JetStreamSender(nc, ack_timeout_s=5).send_fast_batch(
        STREAM, messages("e1", "e2", "e3", "e4", "e5")
    )
    # THEN the batch is kept whole, and the stream holds one copy of each row
    assert (ack.stored, ack.last_sequence) == (5, 5)
    assert [msg_id for _, msg_id in await on_stream(nc)] == ["e3", "e1", "e2", "e4", "e5"]


async def test_a_stream_without_fast_batches_refuses_the_batch_naming_jetstreams_code(
    nc: NATS,
) -> None:
    # GIVEN a stream made without allow_batched (by another tool, or an older version)
    js = nc.jetstream()
    await js.add_stream(name="PLAIN", subjects=["plain.>"])
    batch = [replace(m, subject="plain.x") for m in messages("e1", "e2")]
    # WHEN a fast batch is sent to it
    # THEN it is refused as a whole, with JetStream's reason and code; nothing is stored
    with pytest.raises(BatchRejectedError, match="refused the fast batch") as refused:
        await JetStreamSender(nc, ack_timeout_s=5).send_fast_batch("PLAIN", batch)
    assert refused.value.code == 10205
    assert (await js.stream_info("PLAIN")).state.messages == 0


def test_auto_picks_atomic_batches_where_durability_is_required_and_fast_batches_elsewhere() -> (
    None
):
    # GIVEN the default, and the cloud's RHUMBATRON_REQUIRE_DURABLE_JETSTREAM=true
    local = load_settings(nats_url="nats://127.0.0.1:1")
    cloud = load_settings(nats_url="nats://127.0.0.1:1", require_durable_jetstream=True)
    # THEN a periodic-sync server gets fast batches, a sync-always deployment atomic ones,
    # and an explicit choice stands
    assert (publish_batch_mode(local), publish_batch_mode(cloud)) == ("fast", "atomic")
    for chosen in ("atomic", "fast", "off"):
        pinned = load_settings(nats_url="nats://127.0.0.1:1", publish_batch_mode=chosen)
        assert publish_batch_mode(pinned) == chosen


async def test_a_fast_batch_of_one_is_refused_by_name_and_a_closed_connection_is_unavailable(
    nc: NATS,
) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    with pytest.raises(
        ValueError, match=r"^a fast batch needs at least two messages; use send\(\)$"
    ):
        await sender.send_fast_batch(STREAM, messages("e1"))
    await nc.close()
    with pytest.raises(NatsUnavailableError) as unavailable:
        await sender.send_fast_batch(STREAM, messages("e1", "e2"))
    # named for the batch and for the error nats-py raised
    assert str(unavailable.value) == (
        "fast batch of 2 messages: NATS connection lost (ConnectionClosedError)"
    )


async def test_a_fast_batch_nobody_answers_gives_up_at_its_ack_timeout(nc: NATS) -> None:
    # GIVEN the stream is gone: each row's only answer is a status without a body
    await nc.jetstream().delete_stream(STREAM)
    sender = JetStreamSender(nc, ack_timeout_s=0.2)
    # WHEN a batch goes out
    started = time.monotonic()
    with pytest.raises(LogUnavailableError) as unavailable:
        await sender.send_fast_batch(STREAM, messages("e1", "e2", "e3"))
    # THEN it gives up at its deadline, not a wait later: the statuses it skipped do not
    # buy it more time (one more wait of a second would pass 0.9 s)
    assert str(unavailable.value) == "fast batch of 3 messages: no PubAck within 0.2 s"
    assert time.monotonic() - started < 0.9


async def test_a_connection_lost_mid_batch_is_named_for_the_batch(tmp_path: Path) -> None:
    # GIVEN a client whose server went away: it reconnects, buffering what it is given
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    client = await nats.connect(server.url, max_reconnect_attempts=-1)
    try:
        server.stop()
        await eventually(lambda: client.is_reconnecting, timeout_s=10)
        # WHEN a batch is sent (its rows buffered), THEN waiting for an answer that cannot
        #   come is NATS unavailable, in words that name the batch
        with pytest.raises(NatsUnavailableError) as lost:
            await JetStreamSender(client, ack_timeout_s=5).send_fast_batch(
                STREAM, messages("e1", "e2")
            )
        assert str(lost.value) == "fast batch of 2 messages: NATS connection lost"
    finally:
        # nats-py's close drains a transport the lost server already reset
        with contextlib.suppress(ConnectionResetError):
            await client.close()
