"""One message at a time, as :class:`JetStreamSender.send` publishes it, against a real
nats-server: where it was stored, a repeat dropped by the duplicate window, and each way a
send fails named for what it is: refused by JetStream (an attempt), the log unable to take
it now, or NATS unavailable (neither counts an attempt)."""

from __future__ import annotations

import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from rhumbatron.errors import (
    BatchRejectedError,
    LogUnavailableError,
    NatsUnavailableError,
    SendRefusedError,
)
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


# --- what each failure is called: the words an operator reads in a report -----------------


async def test_a_send_on_a_closed_connection_names_the_error_nats_py_raised(nc: NATS) -> None:
    sender = JetStreamSender(nc, ack_timeout_s=5)
    await nc.close()
    with pytest.raises(NatsUnavailableError) as lost:
        await sender.send("EVENTS_03", OutgoingMessage("events.03", "evt-1", b"{}"))
    assert str(lost.value) == "publish of evt-1: NATS connection lost (ConnectionClosedError)"


@pytest.mark.parametrize(
    ("code", "err_code"),
    [(503, None), (500, 10118)],  # by the HTTP-like code alone, by the JetStream code alone
)
async def test_an_api_error_of_a_log_that_cannot_take_it_now_keeps_its_words_and_code(
    nc: NATS, code: int, err_code: int | None
) -> None:
    from nats.js.errors import APIError

    sender = JetStreamSender(nc, ack_timeout_s=5)
    said = sender._classify(
        APIError(code=code, err_code=err_code, description="stream is offline"), "publish of e"
    )
    assert isinstance(said, LogUnavailableError)
    assert str(said) == (
        f"publish of e: the log cannot take it now: stream is offline (code {err_code})"
    )


async def test_any_other_error_is_a_refusal_named_by_its_type_and_text(nc: NATS) -> None:
    from nats.errors import Error as NatsError
    from nats.js.errors import APIError

    sender = JetStreamSender(nc, ack_timeout_s=5)
    refused = sender._classify(
        APIError(code=400, err_code=10054, description="message size exceeds maximum allowed"),
        "publish of e",
    )
    assert type(refused) is SendRefusedError
    assert str(refused) == (
        "publish of e: APIError: nats: APIError: code=400 err_code=10054 "
        "description='message size exceeds maximum allowed'"
    )
    # an error without text ends at its type: no dangling separator; its own text is kept
    # whole, to the last letter
    assert str(sender._classify(NatsError(), "publish of e")) == "publish of e: Error"
    assert str(sender._classify(RuntimeError("no route to X"), "publish of e")) == (
        "publish of e: RuntimeError: no route to X"
    )


def test_a_batch_the_server_refused_whole_is_named_with_its_words_and_code() -> None:
    unavailable = JetStreamSender._batch_refused(
        {"code": 503, "err_code": 10008, "description": "JetStream system unavailable"},
        "fast batch of 3 messages",
    )
    assert isinstance(unavailable, LogUnavailableError)
    assert str(unavailable) == (
        "fast batch of 3 messages: the log cannot take it now: "
        "JetStream system unavailable (code 10008)"
    )
    refused = JetStreamSender._batch_refused(
        {"code": 400, "err_code": 10174, "description": "batch publish not enabled"},
        "fast batch of 3 messages",
    )
    assert isinstance(refused, BatchRejectedError)
    assert str(refused) == (
        "JetStream refused the fast batch of 3 messages: batch publish not enabled (code 10174)"
    )


def test_a_fast_batch_puback_that_cannot_be_read_is_refused_showing_it() -> None:
    with pytest.raises(SendRefusedError) as refused:
        JetStreamSender._fast_final({"stream": "EVENTS_03", "seq": 9}, "fast batch of 2")
    assert str(refused.value) == (
        "fast batch of 2: unexpected PubAck {'stream': 'EVENTS_03', 'seq': 9}"
    )


@pytest.mark.parametrize(
    ("answer", "flow"),
    [
        ({"type": "ack", "seq": 40, "msgs": 25}, (40, 25)),  # acked to 40, 25 per ack now
        ({"type": "ack", "seq": 40}, (40, 100)),  # the flow stays when the ack names none
        ({"type": "ack", "msgs": 25}, (10, 25)),  # the mark stays when the ack names none
        ({"type": "ack", "seq": 5, "msgs": 25}, (10, 25)),  # a late ack never moves it back
        ({"type": "gap", "seq": 40, "msgs": 25}, (10, 100)),  # a gap is only news
    ],
)
def test_a_fast_batchs_flow_acks_move_the_acknowledged_mark_and_the_flow(
    answer: dict[str, object], flow: tuple[int, int]
) -> None:
    assert JetStreamSender._fast_flow(answer, 10, 100) == flow


# --- an atomic batch's commit answered by something that is not JetStream ----------------


async def _answer_commits_with(nc: NATS, subject: str, reply: bytes | None) -> None:
    """A responder on ``subject`` (bound to no stream) that answers each request with
    ``reply``, or never (None)."""

    async def answer(msg: Msg) -> None:
        if msg.reply and reply is not None:
            await msg.respond(reply)

    await nc.subscribe(subject, cb=answer)
    await nc.flush()


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"not json", "unreadable batch ack b'not json'"),
        # a long answer is quoted to its first 200 bytes
        (b"<" + b"x" * 298 + b">", "unreadable batch ack b'<" + "x" * 199 + "'"),
        (
            b'{"stream": "ODD", "seq": 9, "count": 2}',
            "batch ack counts 2 of 3 messages",
        ),
    ],
)
async def test_an_atomic_batch_ack_that_is_not_a_puback_of_the_whole_batch_is_a_refusal(
    nc: NATS, reply: bytes, expected: str
) -> None:
    await _answer_commits_with(nc, "odd.x", reply)
    sender = JetStreamSender(nc, ack_timeout_s=5)
    batch = [OutgoingMessage("odd.x", f"evt-{n}", b"{}") for n in range(3)]
    with pytest.raises(SendRefusedError) as refused:
        await sender.send_batch("ODD", batch)
    assert str(refused.value) == expected


async def test_a_fast_batch_answered_with_garbage_is_refused_quoting_its_first_200_bytes(
    nc: NATS,
) -> None:
    # GIVEN a responder that answers every message of a fast batch with 300 bytes of garbage
    await _answer_commits_with(nc, "odd.f", b"<" + b"x" * 298 + b">")
    sender = JetStreamSender(nc, ack_timeout_s=5)
    batch = [OutgoingMessage("odd.f", f"evt-{n}", b"{}") for n in range(2)]
    # WHEN the batch is sent, THEN it is refused, the answer quoted to its first 200 bytes
    with pytest.raises(SendRefusedError) as refused:
        await sender.send_fast_batch("ODD", batch)
    assert str(refused.value) == (
        "fast batch of 2 messages: unreadable answer b'<" + "x" * 199 + "'"
    )


async def test_an_atomic_batch_waits_for_its_puback_as_long_as_its_ack_timeout(nc: NATS) -> None:
    # GIVEN a commit that reaches a responder which never answers
    await _answer_commits_with(nc, "odd.x", None)
    sender = JetStreamSender(nc, ack_timeout_s=1.0)
    batch = [OutgoingMessage("odd.x", f"evt-{n}", b"{}") for n in range(2)]
    # WHEN the batch is sent, THEN it gives up after its own 1 s (not nats-py's 0.5 s request
    #   default, nor never), the log unavailable
    started = time.monotonic()
    with pytest.raises(LogUnavailableError) as unavailable:
        await sender.send_batch("ODD", batch)
    waited_s = time.monotonic() - started
    assert str(unavailable.value) == "atomic batch of 2 messages: no PubAck within 1 s"
    assert 0.9 <= waited_s < 5
