"""One message at a time, as :class:`JetStreamSender.send` publishes it, against a real
nats-server: where it was stored, a repeat dropped by the duplicate window, and each way a
send fails named for what it is: refused by JetStream (an attempt), the log unable to take
it now, or NATS unavailable (neither counts an attempt)."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from rhumbatron.errors import LogUnavailableError, NatsUnavailableError, SendRefusedError
from rhumbatron.messaging.sender import (
    JetStreamSender,
    OutgoingMessage,
    StoredMessage,
    is_log_unavailable_answer,
)
from rhumbatron_dev.local.nats_server import NatsServerProcess


async def test_a_send_says_where_it_was_stored_and_a_repeat_is_a_duplicate(nc: NATS) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    first = await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-1", b"{}"))
    second = await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-2", b"{}"))
    again = await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-1", b"{}"))
    assert (first, second) == (StoredMessage("EVENTS_03", 1), StoredMessage("EVENTS_03", 2))
    assert again == StoredMessage("EVENTS_03", 1, True)
    assert (await nc.jetstream().stream_info("EVENTS_03")).state.messages == 2


async def test_a_send_whose_subject_another_stream_binds_is_refused_naming_the_message(
    nc: NATS,
) -> None:
    # GIVEN a message for stream 3 whose subject stream 4 binds
    sender = JetStreamSender(nc, ack_timeout_s=5)
    # WHEN it is sent, THEN JetStream refuses it (the expected stream does not match) and the
    #   error names the message; nothing is stored on either stream
    with pytest.raises(SendRefusedError, match=r"^publish of evt-9: ") as refused:
        await sender.send("EVENTS_03", OutgoingMessage("events.04", "evt-9", b"{}"))
    assert not isinstance(refused.value, NatsUnavailableError | LogUnavailableError)
    assert "stream" in str(refused.value).lower()
    js = nc.jetstream()
    assert (await js.stream_info("EVENTS_04")).state.messages == 0


async def test_a_send_on_a_closed_connection_is_unavailable_not_refused(nc: NATS) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    await nc.close()
    with pytest.raises(
        NatsUnavailableError, match=r"^publish of evt-1: NATS connection lost \(\w+\)$"
    ):
        await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-1", b"{}"))


async def test_a_send_nobody_answers_is_the_log_unavailable_not_a_refusal(nc: NATS) -> None:
    # GIVEN the stream is gone (as when no replica leads it), so no responder answers
    await nc.jetstream().delete_stream("EVENTS_03")
    sender = JetStreamSender(nc, ack_timeout_s=5)
    # WHEN a message is sent, THEN the log is unavailable (no attempt counts), not refused
    with pytest.raises(LogUnavailableError, match=r"^publish of evt-1: no responders"):
        await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-1", b"{}"))


@pytest.mark.parametrize("kind", ["atomic", "fast"])
async def test_a_batch_nobody_answers_is_the_log_unavailable_not_a_refusal(
    nc: NATS, kind: str
) -> None:
    # GIVEN the stream is gone, so no responder answers
    await nc.jetstream().delete_stream("EVENTS_03")
    sender = JetStreamSender(nc, ack_timeout_s=0.5)
    batch = [OutgoingMessage("events.03", f"evt-{n}", b"{}") for n in range(3)]
    # WHEN a batch of either kind is sent, THEN the log is unavailable, not refused
    send = sender.send_batch if kind == "atomic" else sender.send_fast_batch
    with pytest.raises(LogUnavailableError, match=rf"^{kind} batch of 3 messages: "):
        await send("EVENTS_03", batch)


async def test_a_send_whose_puback_does_not_come_is_the_log_unavailable(tmp_path: Path) -> None:
    # GIVEN a connected client, and then a server that stalls (SIGSTOP) before it answers
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    client = await nats.connect(server.url, allow_reconnect=False)
    try:
        await client.jetstream().add_stream(name="STALL", subjects=["stall.>"])
        sender = JetStreamSender(client, ack_timeout_s=0.3)
        server.pause()
        # WHEN a message is sent, THEN its missing PubAck is the log unavailable, the
        #   connection still up: nothing refused the message
        with pytest.raises(
            LogUnavailableError, match=r"^publish of evt-1: no PubAck within 0.3 s$"
        ):
            await sender.send("STALL", OutgoingMessage("stall.x", "evt-1", b"{}"))
        assert client.is_connected
        # AND once the server carries on, the same message goes (once: the window drops it)
        server.resume()
        stored = await sender.send("STALL", OutgoingMessage("stall.x", "evt-1", b"{}"))
        assert stored.sequence == 1
        assert (await client.jetstream().stream_info("STALL")).state.messages == 1
    finally:
        server.resume()
        await client.close()
        server.stop()


@pytest.mark.parametrize(
    ("answer", "unavailable"),
    [
        ({"code": 503, "err_code": 10008}, True),  # JetStream system temporarily unavailable
        ({"code": 500, "err_code": 10009}, True),  # JetStream cluster can not handle request
        ({"code": 500, "err_code": 10118}, True),  # stream is offline
        ({"code": 400, "err_code": 10158}, True),  # duplicate message id is in process
        ({"code": 503, "err_code": None}, True),  # any 503
        ({"code": 400, "err_code": 10060}, False),  # expected stream does not match
        ({"code": 400, "err_code": 10054}, False),  # message size exceeds maximum allowed
        ({"code": 400, "err_code": 10176}, False),  # atomic publish batch is incomplete
    ],
)
def test_only_a_log_between_leaders_or_without_quorum_is_unavailable(
    answer: dict[str, object], unavailable: bool
) -> None:
    assert is_log_unavailable_answer(answer) is unavailable
