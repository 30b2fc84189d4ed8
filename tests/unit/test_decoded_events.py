"""The router's per-process decode cache (``records.DecodedEvents``): a record read by several
subscriptions is decoded once, by stream and sequence, up to a bound, the oldest forgotten
first; a hit must carry the same bytes."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import EnvelopeError
from rhumbatron.router.records import (
    DecodedEvents,
    ProjectOwners,
    decode_record,
    decode_records,
)

CALLER = Caller("acme", "system:test", correlation_id="corr-decode")
T = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def wire(number: int) -> bytes:
    """Envelope bytes of one ``agent.woke`` Event, a different Event per ``number``."""
    fact = FactContext(CALLER, "acme-web", T).fact(
        "agent.woke", {"agentId": f"agent-{number}"}, change_id="chg-1", key=str(number)
    )
    return fact.to_json()


def test_a_record_read_again_is_the_event_decoded_the_first_time() -> None:
    # GIVEN a cache that decoded two records of a stream
    decoded = DecodedEvents()
    first, second = decoded.decode(0, 1, wire(1)), decoded.decode(0, 2, wire(2))
    # WHEN another subscription reads the first, and the same sequence of another stream
    again = decoded.decode(0, 1, wire(1))
    other_stream = decoded.decode(3, 1, wire(1))
    # THEN the first is the very Event decoded before; the other stream's is its own decode
    assert again is first and first is not second
    assert other_stream is not first and other_stream == first


def test_a_hit_with_other_bytes_is_decoded_anew() -> None:
    # GIVEN a record decoded at sequence 1, then the stream recreated under its name
    decoded = DecodedEvents()
    old = decoded.decode(0, 1, wire(1))
    # WHEN sequence 1 now carries another Event
    new = decoded.decode(0, 1, wire(2))
    # THEN that Event is decoded, not the old one handed back; and it is kept in turn
    assert new.event_id != old.event_id
    assert decoded.decode(0, 1, wire(2)) is new


def test_the_cache_keeps_its_limit_of_the_latest_records_and_forgets_the_oldest() -> None:
    # GIVEN a cache of two records that decoded sequences 1 and 2
    decoded = DecodedEvents(limit=2)
    one, two = decoded.decode(0, 1, wire(1)), decoded.decode(0, 2, wire(2))
    # THEN both are kept: a full cache keeps its limit
    assert decoded.decode(0, 1, wire(1)) is one and decoded.decode(0, 2, wire(2)) is two
    # WHEN a third is decoded
    three = decoded.decode(0, 3, wire(3))
    # THEN the oldest (1) is forgotten, and the newest two are kept
    assert decoded.decode(0, 3, wire(3)) is three
    assert decoded.decode(0, 2, wire(2)) is two
    assert decoded.decode(0, 1, wire(1)) is not one
    # (the default bound is 4,096 records)
    assert DecodedEvents().limit == 4_096


def test_bytes_that_are_no_event_are_refused_and_not_kept() -> None:
    decoded = DecodedEvents()
    with pytest.raises(EnvelopeError):
        decoded.decode(0, 1, b"{not json")
    assert decoded.decode(0, 1, wire(1)).event_type == "agent.woke"


def test_every_subscription_reading_a_record_gets_the_event_decoded_once() -> None:
    # GIVEN one record of stream 0, as JetStream delivers it to two subscriptions of a run
    def delivered(consumer: str) -> Any:
        reply = f"$JS.ACK.EVENTS_00.{consumer}.1.7.7.1772445600000000000.0"
        return cast(Any, SimpleNamespace(data=wire(1), reply=reply, headers=None))

    owners = ProjectOwners(lambda project_id: "acme" if project_id == "acme-web" else None)
    decoded = DecodedEvents()
    # WHEN each decodes it with the run's cache
    first = decode_record(delivered("project-view-projector"), 0, owners, decoded)
    second = decode_record(delivered("causal-router"), 0, owners, decoded)
    # THEN the second has the very Event the first decoded: its envelope was validated once
    assert first.event is not None and second.event is first.event
    # AND without the cache each decodes its own
    alone = decode_record(delivered("causal-router"), 0, owners)
    assert alone.event == first.event and alone.event is not first.event
    # AND a whole fetch goes through the cache the same way
    (fetched,) = decode_records([delivered("reactions")], 0, owners, decoded)
    assert fetched.event is first.event
