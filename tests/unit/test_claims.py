"""Claims (``processed_events``): INSERT OR IGNORE makes a consumer apply a fact once; a lease
left by a dead holder expires and is taken over (spec "Idempotency and dedupe", F10)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rhumbatron.router.claims import (
    CLAIMS_SCHEMA,
    claim_events,
    claim_leases,
    complete_claims,
    done_event_ids,
    prune_claims,
    release_claims,
)


@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(tmp_path / "claims.sqlite", isolation_level=None)
    connection.executescript(CLAIMS_SCHEMA)
    return connection


def test_one_row_changed_means_fresh_and_none_means_duplicate(db: sqlite3.Connection) -> None:
    # GIVEN E claimed by the projector
    assert claim_events(db, "project-view-projector", ["E"], now_s=10) == ["E"]
    # WHEN the same event is claimed again by the same consumer
    again = claim_events(db, "project-view-projector", ["E", "F"], now_s=11)
    # THEN only the new one is fresh; another consumer has its own claim
    assert again == ["F"]
    assert claim_events(db, "causal-router", ["E"], now_s=12) == ["E"]


def test_a_live_lease_blocks_a_second_holder_and_an_expired_one_is_taken_over(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a lease of 300 s taken at t=0 by a holder that then died
    assert claim_events(db, "audit-archiver", ["E"], now_s=0, lease_s=300) == ["E"]
    # WHEN the redelivery comes before the lease expires, E is not fresh
    assert claim_events(db, "audit-archiver", ["E"], now_s=299, lease_s=300) == []
    # THEN after the ack wait (= the lease) the redelivery takes it over
    assert claim_events(db, "audit-archiver", ["E"], now_s=300, lease_s=300) == ["E"]


def test_a_completed_claim_is_never_released_or_taken_over(db: sqlite3.Connection) -> None:
    claim_events(db, "audit-archiver", ["E", "F"], now_s=0, lease_s=300)
    complete_claims(db, "audit-archiver", ["E"], now_s=1)
    # releasing both drops only the unfinished lease: the redelivery applies F again
    assert release_claims(db, "audit-archiver", ["E", "F"]) == 1
    assert claim_events(db, "audit-archiver", ["E", "F"], now_s=10_000, lease_s=300) == ["F"]
    assert done_event_ids(db, "audit-archiver", ["E", "F"]) == {"E"}


def test_prune_deletes_only_done_claims_older_than_the_cutoff_up_to_the_limit(
    db: sqlite3.Connection,
) -> None:
    claim_events(db, "causal-router", [f"old-{i}" for i in range(5)], now_s=100)
    claim_events(db, "causal-router", ["lease"], now_s=100, lease_s=10)
    claim_events(db, "causal-router", ["new"], now_s=5_000)
    assert prune_claims(db, older_than_s=1_000, limit=3) == 3
    assert prune_claims(db, older_than_s=1_000, limit=10) == 2  # the lease is not done: kept
    left = {row[0] for row in db.execute("SELECT event_id FROM processed_events")}
    assert left == {"lease", "new"}


def test_prune_keeps_a_claim_processed_exactly_at_the_cutoff(db: sqlite3.Connection) -> None:
    # GIVEN a claim processed exactly at the cutoff and one a millisecond before it
    claim_events(db, "causal-router", ["at-cutoff"], now_s=1_000)
    claim_events(db, "causal-router", ["before"], now_s=999.999)
    # WHEN claims older than the cutoff are pruned
    # THEN only the older one goes: a claim exactly the retention old is not older than it
    assert prune_claims(db, older_than_s=1_000, limit=10) == 1
    left = {row[0] for row in db.execute("SELECT event_id FROM processed_events")}
    assert left == {"at-cutoff"}


def test_a_live_lease_is_reported_held_not_done(db: sqlite3.Connection) -> None:
    # GIVEN E leased by a run that died, and F done
    claim_events(db, "causal-router", ["E", "F"], now_s=0, lease_s=300)
    complete_claims(db, "causal-router", ["F"], now_s=1)
    # WHEN a redelivery reaches another run before E's lease expires
    leases = claim_leases(db, "causal-router", ["E", "F", "G"], now_s=299.5, lease_s=300)
    # THEN G is fresh, E is held (to retry: acking it would lose its effect), F is done
    assert leases.fresh == ["G"]
    assert leases.held == {"E"}
    # AND a held lease behind a fresh event in the batch is held all the same
    behind = claim_leases(db, "causal-router", ["H", "E"], now_s=299.6, lease_s=300)
    assert (behind.fresh, behind.held) == (["H"], {"E"})
