"""The rewind reader's rule that needs no server: when a pull that brought nothing may end
the read (the rewinds themselves, stalls included, run on a real nats-server in
tests/integration/test_replay.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from nats.js.api import ConsumerConfig, ConsumerInfo

from rhumbatron.router.replay_stream import undelivered_count


def consumer(num_pending: int | None, num_ack_pending: int | None) -> ConsumerInfo:
    return ConsumerInfo(
        name="replay-project_view_projector-0123456789ab",
        stream_name="EVENTS_0",
        config=ConsumerConfig(),
        created=datetime(2026, 12, 6, tzinfo=UTC),
        num_pending=num_pending,
        num_ack_pending=num_ack_pending,
    )


@pytest.mark.parametrize(
    ("num_pending", "num_ack_pending", "owed"),
    [
        (3, 0, 3),  # not delivered yet: a server slow to answer the pull
        (0, 2, 2),  # delivered to a pull the reader gave up on, not acknowledged
        (3, 2, 5),
        (0, 0, 0),  # nothing owed: the records up to the end were removed meanwhile
        (None, None, 0),  # a server that leaves the counts out owes nothing it said
    ],
)
def test_a_replay_consumer_owes_what_it_has_not_delivered_and_what_is_unacknowledged(
    num_pending: int | None, num_ack_pending: int | None, owed: int
) -> None:
    assert undelivered_count(consumer(num_pending, num_ack_pending)) == owed
