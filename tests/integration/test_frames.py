"""The batch publishers' frames, built by :class:`FramePublisher` instead of nats-py, against
a real nats-server: a subscriber receives exactly what ``Client.publish`` would have sent,
and every message the publisher cannot vouch for goes through ``Client.publish`` itself."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import (
    BadSubjectError,
    ConnectionClosedError,
    ConnectionDrainingError,
    MaxPayloadError,
    MsgAlreadyAckdError,
    NotJSMessageError,
)

from rhumbatron.messaging.frames import FramePublisher, ack, header_block
from rhumbatron_dev.local.nats_server import NatsServerProcess
from server_counts import settles_to

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def received(nc: NATS, subject: str, count: int) -> tuple[asyncio.Future[None], list[Msg]]:
    """A subscription on ``subject``; the future ends when ``count`` messages came."""
    messages: list[Msg] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_message(msg: Msg) -> None:
        messages.append(msg)
        if len(messages) == count and not done.done():
            done.set_result(None)

    await nc.subscribe(subject, cb=on_message)
    await nc.flush()
    return done, messages


def seen(msg: Msg) -> tuple[str, str, dict[str, str], bytes]:
    return msg.subject, msg.reply, dict(msg.headers or {}), msg.data


def test_a_header_block_is_what_nats_py_writes_and_none_for_anything_it_would_rewrite() -> None:
    assert header_block({"Nats-Msg-Id": "e1", "traceparent": TRACEPARENT}) == (
        f"NATS/1.0\r\nNats-Msg-Id: e1\r\ntraceparent: {TRACEPARENT}\r\n\r\n".encode()
    )
    assert header_block({}) == b"NATS/1.0\r\n\r\n"
    # nats-py strips values and turns CR and LF into spaces, skips empty names and refuses
    # names outside the token class: none of those may be written as they are
    for odd in (
        {"Nats-Msg-Id": " e1"},
        {"Nats-Msg-Id": "e1 "},
        {"Nats-Msg-Id": "e\r\n1"},
        {"Nats-Msg-Id": ""},
        {"Nats-Msg-Id": "é"},
        {"Nats-Msg-Id": "e\t1"},
        {"Bad Name": "e1"},
        {"": "e1"},
        {"Nats-Msg-Id": "e1", "x": "y\n"},
    ):
        assert header_block(odd) is None, odd
    # a space inside a value is plain; only its ends would be stripped
    assert header_block({"k": "a b"}) == b"NATS/1.0\r\nk: a b\r\n\r\n"


async def test_frames_written_here_arrive_as_client_publish_would_send_them(nc: NATS) -> None:
    # GIVEN a publisher that writes its own frames on a connected nats-py client
    frames = FramePublisher(nc)
    assert frames.writes_frames
    done, messages = await received(nc, "frames.>", 4)
    headers = {"Nats-Msg-Id": "01JABCDEFGHJKMNPQRSTVWXYZ0", "traceparent": TRACEPARENT}
    sent_before = nc.stats["out_msgs"], nc.stats["out_bytes"]
    # WHEN the same messages go out through it and through Client.publish, with and
    # without a reply subject
    await frames.publish("frames.a", b'{"n":1}', reply="_INBOX.x.100.fail.1.0.$FI", headers=headers)
    await nc.publish("frames.a", b'{"n":1}', reply="_INBOX.x.100.fail.1.0.$FI", headers=headers)
    await frames.publish("frames.b", b"", headers={"Nats-Batch-Sequence": "2"})
    await nc.publish("frames.b", b"", headers={"Nats-Batch-Sequence": "2"})
    await asyncio.wait_for(done, 5)
    # THEN each pair is received the same: subject, reply, headers and body
    assert seen(messages[0]) == seen(messages[1])
    assert seen(messages[0]) == (
        "frames.a",
        "_INBOX.x.100.fail.1.0.$FI",
        headers,
        b'{"n":1}',
    )
    assert (
        seen(messages[2])
        == seen(messages[3])
        == ("frames.b", "", {"Nats-Batch-Sequence": "2"}, b"")
    )
    # AND the client's counters count the frames written here as its own publishes do
    assert (nc.stats["out_msgs"] - sent_before[0], nc.stats["out_bytes"] - sent_before[1]) == (
        4,
        2 * len(b'{"n":1}'),
    )


async def test_on_a_connected_client_frames_and_acks_never_go_through_client_publish(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a stream message pulled on a connected client, whose Client.publish is watched
    js = nc.jetstream()
    await js.add_stream(name="OWN", subjects=["own.s"])
    await js.publish("own.s", b"1")
    (msg,) = await (await js.pull_subscribe("own.s", durable="r", stream="OWN")).fetch(1)
    done, messages = await received(nc, "own.>", 2)
    through_client: list[str] = []
    client_publish = nc.publish

    async def watched(subject: str, payload: bytes = b"", **options: object) -> None:
        through_client.append(subject)
        await client_publish(subject, payload, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(nc, "publish", watched)
    # WHEN a message with a reply subject, one without, and an ack go out through this module
    frames = FramePublisher(nc)
    await frames.publish("own.a", b"1", reply="_INBOX.own.1", headers={"k": "v"})
    await frames.publish("own.b", b"2", headers={"k": "v"})
    await ack(msg)
    await asyncio.wait_for(done, 5)
    # THEN all three were written here, none by Client.publish
    assert through_client == []
    assert [seen(m) for m in messages] == [
        ("own.a", "_INBOX.own.1", {"k": "v"}, b"1"),
        ("own.b", "", {"k": "v"}, b"2"),
    ]
    assert msg.is_acked


async def test_a_message_it_cannot_vouch_for_goes_through_client_publish(nc: NATS) -> None:
    frames = FramePublisher(nc)
    done, messages = await received(nc, "odd.>", 1)
    # a value nats-py sanitises is sent sanitised, as nats-py would send it
    await frames.publish("odd.a", b"x", headers={"Nats-Msg-Id": " e\n1 "})
    await asyncio.wait_for(done, 5)
    assert seen(messages[0]) == ("odd.a", "", {"Nats-Msg-Id": "e 1"}, b"x")
    # a subject or reply nats-py refuses is refused by nats-py, with its own error
    for subject, reply in (("odd b", ""), ("", ""), ("odd.\tb", ""), ("odd.b", "in box")):
        with pytest.raises(BadSubjectError):
            await frames.publish(subject, b"x", reply=reply, headers={"k": "v"})
    # a body over the server's max_payload is refused before it is written
    with pytest.raises(MaxPayloadError):
        await frames.publish("odd.c", b"x" * (nc.max_payload + 1), headers={"k": "v"})
    # and a closed connection says so
    await nc.close()
    with pytest.raises(ConnectionClosedError):
        await frames.publish("odd.d", b"x", headers={"k": "v"})


def test_a_client_without_the_members_frames_need_is_always_served_by_its_publish() -> None:
    class OlderClient:
        is_connected = True
        max_payload = 1 << 20

        def __init__(self) -> None:
            self.published: list[tuple[str, bytes, str, dict[str, str]]] = []

        async def publish(
            self,
            subject: str,
            data: bytes = b"",
            *,
            reply: str = "",
            headers: dict[str, str] | None = None,
        ) -> None:
            self.published.append((subject, data, reply, headers or {}))

    client = OlderClient()
    frames = FramePublisher(client)  # type: ignore[arg-type]
    assert not frames.writes_frames
    asyncio.run(frames.publish("s", b"x", reply="r", headers={"k": "v"}))
    # and an ack of one of its messages is Msg.ack's
    msg = Msg(client, subject="s", reply="$JS.ACK.S.c.1.1.1.1.0")  # type: ignore[arg-type]
    asyncio.run(ack(msg))
    assert client.published == [
        ("s", b"x", "r", {"k": "v"}),
        ("$JS.ACK.S.c.1.1.1.1.0", b"", "", {}),
    ]
    assert msg.is_acked


async def test_an_ack_written_here_settles_the_message_as_msg_ack_does(nc: NATS) -> None:
    # GIVEN two messages of a stream, pulled by a durable consumer
    js = nc.jetstream()
    await js.add_stream(name="ACKS", subjects=["acks.>"])
    for n in (1, 2):
        await js.publish("acks.a", str(n).encode())
    sub = await js.pull_subscribe("acks.a", durable="reader", stream="ACKS")
    first, second = await sub.fetch(2, timeout=5)
    sent_before, bytes_before = nc.stats["out_msgs"], nc.stats["out_bytes"]
    # WHEN the first is acknowledged by a frame written here and the second by Msg.ack
    await ack(first)
    await second.ack()
    await nc.flush()
    # THEN both are settled alike: counted (a message each, no payload byte), marked
    #   acknowledged here and on the server
    assert nc.stats["out_msgs"] - sent_before == 2
    assert nc.stats["out_bytes"] == bytes_before
    assert first.is_acked and second.is_acked

    async def settled() -> tuple[int | None, int | None, int | None]:
        # (JetStream settles acks on a queue of its own: the counts may trail them a moment.)
        info = await js.consumer_info("ACKS", "reader")
        return info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq

    await settles_to(settled, (0, 0, 2))
    # AND what Msg.ack refuses, it refuses too, with Msg.ack's own errors
    with pytest.raises(MsgAlreadyAckdError):
        await ack(first)
    done, plain = await received(nc, "plain", 1)
    await nc.publish("plain", b"x")
    await asyncio.wait_for(done, 5)
    with pytest.raises(NotJSMessageError):
        await ack(plain[0])
    # AND a reply subject nats-py would refuse goes to Msg.ack, which refuses it
    odd = Msg(nc, subject="acks.a", reply="in box", data=b"")
    with pytest.raises(BadSubjectError):
        await ack(odd)


async def test_an_ack_on_a_closed_connection_says_so(nc: NATS) -> None:
    js = nc.jetstream()
    await js.add_stream(name="ACKS", subjects=["acks.>"])
    await js.publish("acks.a", b"1")
    (msg,) = await (await js.pull_subscribe("acks.a", durable="r", stream="ACKS")).fetch(1)
    await nc.close()
    with pytest.raises(ConnectionClosedError):
        await ack(msg)
    assert not msg.is_acked


async def test_a_frame_written_here_goes_out_at_once_with_nothing_sent_after_it(
    nc: NATS, nats_server: NatsServerProcess
) -> None:
    # GIVEN a reader on another connection, and a stream message pulled on this one
    other = await nats.connect(nats_server.url)
    try:
        done, messages = await received(other, "alone.a", 1)
        js = nc.jetstream()
        await js.add_stream(name="ALONE", subjects=["alone.s"])
        await js.publish("alone.s", b"1")
        (msg,) = await (await js.pull_subscribe("alone.s", durable="r", stream="ALONE")).fetch(1)
        # WHEN a frame is written here and nothing else is sent or flushed on this connection
        await FramePublisher(nc).publish("alone.a", b"x", headers={"k": "v"})
        await ack(msg)
        # THEN the flusher sent both: the reader has the message, the server the ack, well
        # within the client's ping interval (the next write that would carry them otherwise)
        await asyncio.wait_for(done, 1.0)
        assert seen(messages[0]) == ("alone.a", "", {"k": "v"}, b"x")
        ojs = other.jetstream()

        async def ack_pending() -> int:
            return int((await ojs.consumer_info("ALONE", "r")).num_ack_pending or 0)

        await settles_to(ack_pending, 0)
    finally:
        await other.close()


async def test_a_draining_client_refuses_frames_as_it_refuses_publishes(nc: NATS) -> None:
    js = nc.jetstream()
    await js.add_stream(name="DRAIN", subjects=["drain.>"])
    await js.publish("drain.a", b"1")
    (msg,) = await (await js.pull_subscribe("drain.a", durable="r", stream="DRAIN")).fetch(1)
    # nats-py's state while Client.drain() flushes what was published before it
    nc._status = NATS.DRAINING_PUBS
    try:
        with pytest.raises(ConnectionDrainingError):
            await FramePublisher(nc).publish("drain.b", b"x", headers={"k": "v"})
        with pytest.raises(ConnectionDrainingError):
            await ack(msg)
        assert not msg.is_acked
    finally:
        nc._status = NATS.CONNECTED
