"""Records a run leaves waiting (deferred by the apply-call cap) are kept by message, per
stream, for the stream's next run: a held message comes back as the record it was, not
decoded again; a message of another stream, or one no longer held, is decoded."""

from __future__ import annotations

from typing import Any, cast

from nats.aio.msg import Msg

from rhumbatron.messaging.event_log import Subscription
from rhumbatron.router.handlers import RunContext
from rhumbatron.router.records import Record
from rhumbatron.router.settling import HeldRecords

PROJECTOR = Subscription.PROJECT_VIEW_PROJECTOR


class _Log:
    """The event log's one call ``keep`` makes: the puller holds the messages."""

    def __init__(self) -> None:
        self.held: list[tuple[int, Subscription, list[Msg]]] = []

    def hold(self, stream: int, subscription: Subscription, messages: list[Msg]) -> None:
        self.held.append((stream, subscription, messages))


def messages(count: int, stream: int = 1) -> list[Msg]:
    client = cast(Any, None)
    return [Msg(_client=client, subject=f"events.{stream}", data=b"{}") for _ in range(count)]


def records_of(msgs: list[Msg]) -> list[Record]:
    return [Record(msg, n, f"evt_{n}", None, None) for n, msg in enumerate(msgs, start=1)]


class _Decoder:
    """Decodes messages as the puller's records would be, and counts what it decoded."""

    def __init__(self) -> None:
        self.decoded: list[Msg] = []

    def __call__(self, msgs: list[Msg]) -> list[Record]:
        self.decoded += msgs
        return [Record(msg, 0, "decoded", None, None) for msg in msgs]


def run(stream: int) -> RunContext:
    return RunContext(stream, now_s=0.0, apply_calls_left=15)


def test_held_records_come_back_as_they_were_for_their_own_stream_only() -> None:
    # GIVEN three records of stream 1 left waiting, and their puller told to hold them
    log, held, decode = _Log(), HeldRecords(), _Decoder()
    msgs = messages(3)
    kept = records_of(msgs)
    held.keep(cast(Any, log), run(1), PROJECTOR, kept)
    assert log.held == [(1, PROJECTOR, msgs)]
    # WHEN stream 2's next run gets the same messages, THEN they are decoded there
    assert [r.key for r in held.take(2, msgs, decode)] == ["decoded"] * 3
    # AND stream 1's next run gets its own records back, each its own, none decoded
    assert held.take(1, [msgs[2], msgs[0], msgs[1]], decode) == [kept[2], kept[0], kept[1]]
    assert decode.decoded == msgs  # only stream 2's
    # AND once taken, or forgotten, a message is decoded again
    held.keep(cast(Any, log), run(1), PROJECTOR, kept[:1])
    held.forget(1)
    assert [r.key for r in held.take(1, msgs[:1], decode)] == ["decoded"]


def test_the_held_records_are_cleared_only_once_they_pass_the_limit() -> None:
    # GIVEN a limit of two records per stream, and two held
    log, held, decode = _Log(), HeldRecords(limit=2), _Decoder()
    first, second = messages(2), messages(1)
    held.keep(cast(Any, log), run(1), PROJECTOR, records_of(first))
    # WHEN one more is kept (the stream holds no more than the limit before it), THEN all
    # three come back as they were
    held.keep(cast(Any, log), run(1), PROJECTOR, records_of(second))
    assert [r.key for r in held.take(1, first + second, decode)] == ["evt_1", "evt_2", "evt_1"]
    # AND when a stream already holds more than the limit, its records are cleared first
    over = messages(3)
    held.keep(cast(Any, log), run(1), PROJECTOR, records_of(over))
    last = messages(1)
    held.keep(cast(Any, log), run(1), PROJECTOR, records_of(last))
    assert decode.decoded == []
    assert [r.key for r in held.take(1, last + over, decode)] == ["evt_1"] + ["decoded"] * 3
    assert decode.decoded == over
