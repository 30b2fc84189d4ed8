"""A dry-run replay reads the claims of a batch in chunks of IDs (SQLite caps a statement's
parameters): every claim of a batch of up to 1,000 records is found, the last one too."""

from __future__ import annotations

import sqlite3

from rhumbatron.router.replay_batches import _claim_states


def test_every_claim_of_a_batch_larger_than_one_query_is_read() -> None:
    # GIVEN 1,001 claims of one consumer (the largest fetch is 1,000 records) and one of
    # another consumer
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE processed_events (consumer TEXT, event_id TEXT, status TEXT, "
        "lease_until_s REAL, processed_at_s REAL)"
    )
    ids = [f"evt_{n:04d}" for n in range(1_001)]
    db.executemany(
        "INSERT INTO processed_events VALUES ('causal-router', ?, 'claimed', ?, 0)",
        [(event_id, float(n)) for n, event_id in enumerate(ids)],
    )
    db.execute(
        "INSERT INTO processed_events VALUES ('audit-archiver', 'evt_0000', 'done', NULL, 0)"
    )

    # WHEN the causal router's claims of all of them are read
    states = _claim_states(db, "causal-router", ids)

    # THEN each is found, with its own lease, and none of the other consumer's
    assert states == {event_id: ("claimed", float(n)) for n, event_id in enumerate(ids)}
