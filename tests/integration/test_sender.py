"""One message at a time, as :class:`JetStreamSender.send` publishes it, against a real
nats-server: where it was stored, a repeat dropped by the duplicate window, and each way a
send fails named for what it is (refused by JetStream, or NATS unavailable)."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from rhumbatron.errors import NatsUnavailableError, SendRefusedError
from rhumbatron.messaging.sender import JetStreamSender, OutgoingMessage, StoredMessage


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
    assert not isinstance(refused.value, NatsUnavailableError)
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
