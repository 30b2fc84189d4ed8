"""The webhook delivery ledger over a real product-database file: the retry schedule, the
dead letter at its end, disabling an endpoint (410 Gone, or failing through the window), the
skipped deliveries kept for a replay, an operator's Retry, leases and pruning (issue #7 item 3,
DECISIONS "Webhook signature": retries 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, then a dead letter).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.actors.storage import SqliteStore
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.product.dead_letters import (
    DEAD_LETTERS_SCHEMA,
    DeadLetterKind,
    DeadLetterStatus,
    claim_retry,
    list_dead_letters,
    migrate_dead_letters,
    reaction_dead_letter_id,
)
from rhumbatron.queues.wake_consumer import AGENT_EVENT_WAKES_SCHEMA
from rhumbatron.reactions.config import ReactionSettings
from rhumbatron.reactions.store import (
    REACTIONS_SCHEMA,
    ReactionHistoryPruner,
    prune_reaction_history,
)
from rhumbatron.reactions.subscription_table import SUBSCRIPTIONS_SCHEMA
from rhumbatron.reactions.webhook_attempts import (
    record_attempt,
    record_retry,
    unrecorded_disablements,
)
from rhumbatron.reactions.webhook_ledger import (
    Attempt,
    DeliveryStatus,
    RetryPolicy,
    claim_due,
    get_delivery,
    list_deliveries,
    park_dead,
    prune_deliveries,
    rearm_for_retry,
    record_skipped,
    replay_skipped,
)

SUB = "sub_" + "a" * 32
OTHER = "sub_" + "b" * 32
POLICY = ReactionSettings().webhook_retry_policy
T0 = 1_800_000_000.0
FAILED = Attempt(ok=False, status_code=500, error="answered 500")
GONE = Attempt(ok=False, status_code=410, error="answered 410")
OK = Attempt(ok=True, status_code=204)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    settings: Settings = load_settings(state_dir=tmp_path / "state")
    store = SqliteStore(
        tmp_path / "product.sqlite",
        settings,
        DEAD_LETTERS_SCHEMA + SUBSCRIPTIONS_SCHEMA + REACTIONS_SCHEMA + AGENT_EVENT_WAKES_SCHEMA,
    )
    connection = store.connection
    for sub, name in ((SUB, "hook"), (OTHER, "other")):
        connection.execute(
            "INSERT INTO subscriptions (subscription_id, tenant_id, name, selector, reaction, "
            "created_at, updated_at) VALUES (?, 'acme', ?, '{}', '{}', 'now', 'now')",
            (sub, name),
        )
    yield connection
    store.close()


def first_attempt(
    db: sqlite3.Connection,
    n: int,
    attempt: Attempt,
    *,
    now_s: float = T0,
    sub: str = SUB,
    policy: RetryPolicy = POLICY,
) -> str:
    key = f"evt_{n:032x}:{sub}"
    record_attempt(
        db,
        delivery_key=key,
        tenant_id="acme",
        project_id="proj",
        event_id=f"evt_{n:032x}",
        event_type="task.completed",
        subscription_id=sub,
        body=json.dumps({"eventId": f"evt_{n:032x}"}).encode(),
        attempt=attempt,
        now_s=now_s,
        policy=policy,
    )
    return key


def kept_while_disabled(db: sqlite3.Connection, key: str, event_id: str, *, now_s: float) -> None:
    """A delivery of the subscription kept as skipped while its endpoint was disabled."""
    record_skipped(
        db,
        delivery_key=key,
        tenant_id="acme",
        project_id="proj",
        event_id=event_id,
        event_type="task.completed",
        subscription_id=SUB,
        body=b"{}",
        now_s=now_s,
    )


def retry_due(
    db: sqlite3.Connection, attempt: Attempt, *, now_s: float, policy: RetryPolicy = POLICY
) -> list[str]:
    """One pass of the retry pass's bookkeeping: claim what is due, record ``attempt``."""
    due = claim_due(db, now_s=now_s, limit=100, lease_s=90)
    for delivery in due:
        record_retry(db, delivery, attempt, now_s=now_s, policy=policy)
    return [d.delivery_key for d in due]


def test_a_delivered_first_attempt_is_recorded_and_never_retried(db: sqlite3.Connection) -> None:
    # GIVEN a first attempt the receiver accepted
    key = first_attempt(db, 1, OK)
    # WHEN a retry pass runs much later
    due = retry_due(db, OK, now_s=T0 + 86_400)
    # THEN the delivery is delivered, once, and nothing is due
    assert get_delivery(db, key).status is DeliveryStatus.DELIVERED
    assert get_delivery(db, key).attempts == 1
    assert due == []


def test_failed_attempts_follow_the_schedule_and_end_in_one_open_dead_letter(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a first attempt that failed
    key = first_attempt(db, 1, FAILED)
    # WHEN every retry fails too, each run exactly when it is due (and once just before)
    now, sent_at = T0, []
    for wait in POLICY.schedule_s:
        assert retry_due(db, FAILED, now_s=now + wait - 1) == []
        now += wait
        assert retry_due(db, FAILED, now_s=now) == [key]
        sent_at.append(now - T0)
    # THEN the retries came 5 s, 5 min, 30 min, 2 h, 5 h and 10 h apart, and the seventh
    # failure made the delivery dead with one open reaction letter that says so
    assert sent_at == [5, 305, 2_105, 9_305, 27_305, 63_305]
    delivery = get_delivery(db, key)
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at_s) == (
        DeliveryStatus.DEAD,
        7,
        None,
    )
    (letter,) = list_dead_letters(db, kind=DeadLetterKind.REACTION)
    assert letter.dead_letter_id == reaction_dead_letter_id(key)
    assert (letter.event_id, letter.consumer, letter.attempt) == (key, "reactions", 7)
    assert "failed 7 times" in letter.reason and "answered 500" in letter.reason
    # its body shows the pointer sent and where it came from, keys sorted (stable text)
    pointer = {"eventId": f"evt_{1:032x}"}
    assert letter.body == json.dumps(
        {
            "body": pointer,
            "deliveryKey": key,
            "eventId": f"evt_{1:032x}",
            "kind": "task.completed",
            "subscriptionId": SUB,
        }
    )
    assert letter.project_id == "proj"
    assert retry_due(db, FAILED, now_s=now + 10**6) == []


def test_an_operators_retry_is_one_more_attempt_that_closes_the_letter_when_delivered(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a dead delivery
    policy = RetryPolicy(schedule_s=(5.0,), disable_after_s=10**9)
    key = first_attempt(db, 1, FAILED, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 5, policy=policy)
    assert get_delivery(db, key).status is DeliveryStatus.DEAD
    # WHEN an operator's Retry re-arms it and it fails again, then is re-armed and delivered
    rearm_for_retry(db, key, now_s=T0 + 100)
    retry_due(db, FAILED, now_s=T0 + 100, policy=policy)
    again = get_delivery(db, key)
    letter_again = list_dead_letters(db, kind=DeadLetterKind.REACTION)
    rearm_for_retry(db, key, now_s=T0 + 200)
    retry_due(db, OK, now_s=T0 + 200, policy=policy)
    # THEN the failed Retry made it dead at once and reopened the same letter with the new
    # count; the delivered one closed the letter as succeeded
    assert (again.status, again.attempts) == (DeliveryStatus.DEAD, 3)
    assert [(x.attempt, x.status) for x in letter_again] == [(3, DeadLetterStatus.OPEN)]
    assert get_delivery(db, key).status is DeliveryStatus.DELIVERED
    (closed,) = list_dead_letters(db, status=None, kind=DeadLetterKind.REACTION)
    assert (closed.status, closed.resolution) == (DeadLetterStatus.CLOSED, "succeeded")
    assert closed.closed_at_s == T0 + 200


def test_a_410_gone_disables_the_subscription_at_once_and_keeps_what_waited(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a delivery of the subscription waiting for its retry
    waiting = first_attempt(db, 1, FAILED)
    # WHEN another delivery of it is answered 410 Gone
    gone = first_attempt(db, 2, GONE, now_s=T0 + 1)
    # THEN the subscription is off with a disablement whose fact is owed, and neither
    # delivery will be sent: both are kept as skipped
    enabled = db.execute("SELECT enabled FROM subscriptions WHERE subscription_id = ?", (SUB,))
    assert enabled.fetchone()[0] == 0
    (owed,) = unrecorded_disablements(db)
    assert (owed.subscription_id, owed.reason, owed.status_code, owed.delivery_key) == (
        SUB,
        "gone",
        410,
        gone,
    )
    assert (owed.name, owed.project_id, owed.tenant_id) == ("hook", "proj", "acme")
    assert owed.detail == f"the endpoint answered 410 Gone to delivery {gone}: answered 410"
    assert (owed.failing_since_s, owed.disabled_at_s) == (T0, T0 + 1)
    assert {get_delivery(db, k).status for k in (waiting, gone)} == {DeliveryStatus.SKIPPED}
    assert retry_due(db, OK, now_s=T0 + 10**6) == []


def test_an_endpoint_failing_through_the_window_is_disabled_and_a_success_resets_it(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a 10-minute disable window, and an endpoint that failed, then once succeeded
    policy = RetryPolicy(schedule_s=(5.0, 300.0, 1_800.0), disable_after_s=600)
    first_attempt(db, 1, FAILED, now_s=T0, policy=policy)
    first_attempt(db, 2, OK, now_s=T0 + 400, policy=policy)
    # WHEN it fails from then on
    first_attempt(db, 3, FAILED, now_s=T0 + 700, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 705, policy=policy)
    not_yet = unrecorded_disablements(db)
    retry_due(db, FAILED, now_s=T0 + 1_300, policy=policy)
    # THEN the success reset the window: the 1st delivery's retry at T0+705 disabled nothing,
    # and the first failure 600 s (the window, to the second) after the endpoint's last
    # success did
    assert not_yet == []
    (owed,) = unrecorded_disablements(db)
    assert (owed.reason, owed.status_code) == ("failing", 500)
    assert (owed.failing_since_s, owed.disabled_at_s) == (T0 + 700, T0 + 1_300)
    assert owed.detail == (
        "every attempt failed for 600 s (the disable window is 600 s, "
        "RHUMBATRON_REACTION_WEBHOOK_DISABLE_AFTER_S); the last: answered 500"
    )


def test_skipped_deliveries_are_replayed_with_a_fresh_schedule(db: sqlite3.Connection) -> None:
    # GIVEN deliveries kept while the endpoint was disabled, and one of another subscription
    for n in (1, 2):
        kept_while_disabled(db, f"k{n}", f"evt_{n}", now_s=T0)
    first_attempt(db, 3, GONE, sub=OTHER)
    kept = list_deliveries(db, SUB, statuses=[DeliveryStatus.SKIPPED])
    assert {d.last_error for d in kept} == {"not sent: the subscription's endpoint is disabled"}
    # WHEN the subscription's skipped deliveries are replayed
    replayed = replay_skipped(db, SUB, now_s=T0 + 50)
    # THEN exactly its two are due now, from their first attempt
    assert replayed == 2
    due = claim_due(db, now_s=T0 + 50, limit=10, lease_s=90)
    assert sorted(d.delivery_key for d in due) == ["k1", "k2"]
    assert {d.attempts for d in due} == {0}
    listed = list_deliveries(db, OTHER, statuses=[DeliveryStatus.SKIPPED])
    assert len(listed) == 1


def test_a_claimed_delivery_is_leased_so_an_overlapping_pass_does_not_take_it(
    db: sqlite3.Connection,
) -> None:
    # GIVEN a due retry
    key = first_attempt(db, 1, FAILED)
    # WHEN two passes claim at the same moment, and a third after the lease ran out
    first = claim_due(db, now_s=T0 + 5, limit=10, lease_s=90)
    second = claim_due(db, now_s=T0 + 5, limit=10, lease_s=90)
    third = claim_due(db, now_s=T0 + 95, limit=10, lease_s=90)
    # THEN only the first took it, and a pass that died holding it is retried after the lease
    assert [d.delivery_key for d in first] == [key]
    assert second == []
    assert [d.delivery_key for d in third] == [key]


def test_pruning_deletes_old_delivered_and_skipped_deliveries_but_not_open_letters(
    db: sqlite3.Connection,
) -> None:
    # GIVEN an old delivered one, an old dead one with an open letter, an old skipped one
    # and a fresh delivered one
    policy = RetryPolicy(schedule_s=(5.0,), disable_after_s=10**9)
    delivered = first_attempt(db, 1, OK, policy=policy)
    dead = first_attempt(db, 2, FAILED, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 5, policy=policy)
    first_attempt(db, 3, GONE, sub=OTHER)
    fresh = first_attempt(db, 4, OK, now_s=T0 + 10_000, policy=policy)
    # WHEN deliveries untouched since before T0+1000 are pruned
    pruned = prune_deliveries(db, before_s=T0 + 1_000, limit=100)
    # THEN the delivered and the skipped one went (a skipped delivery is replayable for the
    # history's window, not forever); the dead one stays while its letter is open
    assert pruned == 2
    kept = {row[0] for row in db.execute("SELECT delivery_key FROM webhook_deliveries")}
    assert delivered not in kept and kept == {dead, fresh}


def test_a_dead_letters_table_of_the_older_shape_takes_reaction_letters_after_migrating(
    tmp_path: Path,
) -> None:
    # GIVEN a product file whose dead_letters table knows two kinds, holding a letter
    connection = sqlite3.connect(tmp_path / "old.sqlite")
    old_schema = DEAD_LETTERS_SCHEMA.replace(
        "CHECK (kind IN ('command', 'poison_event', 'reaction'))",
        "CHECK (kind IN ('command', 'poison_event'))",
    )
    assert old_schema != DEAD_LETTERS_SCHEMA
    connection.executescript(old_schema)
    connection.execute(
        "INSERT INTO dead_letters (dead_letter_id, kind, reason, body, created_at_s) "
        "VALUES ('dl_old', 'command', 'why', '{}', 1)"
    )
    with pytest.raises(sqlite3.IntegrityError):
        connection.execute(
            "INSERT INTO dead_letters (dead_letter_id, kind, reason, body, created_at_s) "
            "VALUES ('dl_new', 'reaction', 'why', '{}', 2)"
        )
    # WHEN it is migrated (twice: the second is a no-op)
    migrate_dead_letters(connection)
    migrate_dead_letters(connection)
    # THEN the old letter is kept and a reaction letter fits
    connection.execute(
        "INSERT INTO dead_letters (dead_letter_id, kind, reason, body, created_at_s) "
        "VALUES ('dl_new', 'reaction', 'why', '{}', 2)"
    )
    kinds = connection.execute("SELECT dead_letter_id, kind FROM dead_letters ORDER BY 1")
    assert kinds.fetchall() == [("dl_new", "reaction"), ("dl_old", "command")]
    connection.close()


def test_the_retry_schedule_is_a_setting_whose_waits_must_be_positive() -> None:
    # GIVEN the defaults and a schedule with a zero wait
    # WHEN the settings are built
    # THEN the default is the decided schedule, and the bad one is refused by name
    assert ReactionSettings().reaction_webhook_retry_schedule_s == (
        5,
        300,
        1800,
        7200,
        18000,
        36000,
    )
    assert ReactionSettings().reaction_webhook_disable_after_s == 5 * 24 * 3600
    with pytest.raises(ValueError, match="every retry wait must be over 0 s"):
        ReactionSettings(reaction_webhook_retry_schedule_s=(5.0, 0.0))


def test_the_reactions_history_ages_out_within_the_cap(db: sqlite3.Connection) -> None:
    # GIVEN old and fresh suppressions, cause chains and admissions, and an old delivery
    for at, tag in ((T0, "old"), (T0 + 10_000, "new")):
        db.execute(
            "INSERT INTO reaction_suppressions VALUES (?, 'acme', 'p', 'e', 'task.completed', "
            "?, 'cooldown', 'd', 0, '[]', ?)",
            (f"s-{tag}", SUB, at),
        )
        db.execute("INSERT INTO reaction_causes VALUES (?, 'acme', 0, '[]', ?)", (f"c-{tag}", at))
        db.execute(
            "INSERT INTO reaction_admissions VALUES (?, 'acme', '2027-01-15', ?)", (f"a-{tag}", at)
        )
        db.execute("INSERT INTO agent_event_wakes VALUES ('a7', ?, 'cmd', ?)", (f"e-{tag}", at))
        db.execute("INSERT INTO delivered_ready_wakes VALUES (?, 'a7', ?)", (f"cmd-{tag}", at))
    first_attempt(db, 1, OK)
    # WHEN the history before T0+1000 is pruned with a cap of 3, then with room
    capped = prune_reaction_history(db, before_s=T0 + 1_000, limit=3)
    rest = prune_reaction_history(db, before_s=T0 + 1_000, limit=100)
    # THEN the cap held, and in the end only the fresh rows are left
    assert (capped, rest) == (3, 3)
    for table in (
        "reaction_suppressions",
        "reaction_causes",
        "reaction_admissions",
        "delivered_ready_wakes",
        "agent_event_wakes",
    ):
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM webhook_deliveries").fetchone()[0] == 0


def test_a_letter_reopened_after_a_replay_can_be_retried_again(db: sqlite3.Connection) -> None:
    # GIVEN a delivery dead after 2 attempts whose letter an operator retried (attempt 3
    # reserved), which then met a 410 (skipped), was replayed, and died again after 2
    policy = RetryPolicy(schedule_s=(5.0,), disable_after_s=10**9)
    key = first_attempt(db, 1, FAILED, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 5, policy=policy)
    letter_id = reaction_dead_letter_id(key)
    claim_retry(db, letter_id, now_s=T0 + 10)
    rearm_for_retry(db, key, now_s=T0 + 10)
    retry_due(db, GONE, now_s=T0 + 10, policy=policy)
    db.execute("UPDATE subscriptions SET enabled = 1")  # an operator enabled it again
    replay_skipped(db, SUB, now_s=T0 + 20)
    retry_due(db, FAILED, now_s=T0 + 20, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 25, policy=policy)
    assert get_delivery(db, key).status is DeliveryStatus.DEAD

    # WHEN an operator retries the reopened letter
    letter, won = claim_retry(db, letter_id, now_s=T0 + 30)

    # THEN this Retry is a new one (the old reservation went with the reopening)
    assert won and (letter.attempt, letter.retried_attempt) == (2, 3)


def test_a_dismissed_letter_withdraws_the_retry_it_had_made_due(db: sqlite3.Connection) -> None:
    # GIVEN a dead delivery that an operator's Retry made due again
    policy = RetryPolicy(schedule_s=(5.0,), disable_after_s=10**9)
    key = first_attempt(db, 1, FAILED, policy=policy)
    retry_due(db, FAILED, now_s=T0 + 5, policy=policy)
    rearm_for_retry(db, key, now_s=T0 + 10)
    # WHEN the letter is dismissed before the retry pass runs
    park_dead(db, key, now_s=T0 + 11)
    # THEN nothing is due: the delivery is dead again and the letter stays closed
    assert claim_due(db, now_s=T0 + 100, limit=10, lease_s=90) == []
    assert get_delivery(db, key).status is DeliveryStatus.DEAD


@pytest.mark.parametrize("meanwhile", ["deleted", "switched off"])
def test_a_410_for_a_subscription_deleted_or_switched_off_meanwhile_disables_nothing(
    db: sqlite3.Connection, meanwhile: str
) -> None:
    # GIVEN a subscription deleted, or switched off, while its delivery was in flight
    if meanwhile == "deleted":
        db.execute("DELETE FROM subscriptions WHERE subscription_id = ?", (SUB,))
    else:
        db.execute("UPDATE subscriptions SET enabled = 0 WHERE subscription_id = ?", (SUB,))
    # WHEN the receiver answers that delivery 410 Gone
    key = first_attempt(db, 1, GONE)
    # THEN there is nothing left to disable and no fact is owed; the delivery is recorded
    assert unrecorded_disablements(db) == []
    assert get_delivery(db, key).attempts == 1


def test_the_history_pruner_deletes_what_is_older_than_its_days_up_to_its_limit_to_the_row(
    tmp_path: Path,
) -> None:
    # GIVEN the reactions' bookkeeping: a ready wake and an (agent, event) wake 14 days and a
    # second old, and the same just under 14 days old
    settings = load_settings(state_dir=tmp_path / "state")
    store = SqliteStore(
        tmp_path / "product.sqlite",
        settings,
        DEAD_LETTERS_SCHEMA + REACTIONS_SCHEMA + AGENT_EVENT_WAKES_SCHEMA,
    )
    now_s, day_s = T0, 86_400.0
    old, young = now_s - 14 * day_s - 1, now_s - 14 * day_s + 1
    with store.transaction() as db:
        for n, at in enumerate((old, young)):
            db.execute("INSERT INTO delivered_ready_wakes VALUES (?, 'a1', ?)", (f"cmd_{n}", at))
            db.execute(
                "INSERT INTO agent_event_wakes VALUES ('a1', ?, ?, ?)", (f"evt_{n}", f"c{n}", at)
            )
    prune = ReactionHistoryPruner(store, history_days=14)

    # WHEN the pruner runs with room for one row, then for one more, then for many
    # THEN each call deletes what its limit allows, in the order of the tables, and only
    # rows older than 14 days: the last row of a limit reaches the (agent, event) wakes
    assert prune(now_s, 1) == 1
    assert db_rows(store, "delivered_ready_wakes") == ["cmd_1"]
    assert prune(now_s, 1) == 1
    assert db_rows(store, "agent_event_wakes") == ["evt_1"]
    assert prune(now_s, 100) == 0
    store.close()


def db_rows(store: SqliteStore, table: str) -> list[str]:
    column = "command_id" if table == "delivered_ready_wakes" else "event_id"
    return [row[0] for row in store.connection.execute(f"SELECT {column} FROM {table}")]


def test_a_listing_shows_the_newest_100_by_default_of_one_or_several_statuses(
    db: sqlite3.Connection,
) -> None:
    # GIVEN 101 skipped deliveries of a subscription and one delivered
    for n in range(101):
        kept_while_disabled(db, f"k{n:03d}", f"evt_{n}", now_s=T0 + n)
    delivered = first_attempt(db, 200, OK, now_s=T0 + 500)
    # WHEN they are listed  THEN a page holds the newest 100 unless asked for fewer
    listed = list_deliveries(db, SUB)
    assert len(listed) == 100 and listed[0].delivery_key == delivered
    assert [d.delivery_key for d in list_deliveries(db, SUB, limit=2)] == [delivered, "k100"]
    # AND the statuses asked for are all listed
    both = list_deliveries(db, SUB, statuses=[DeliveryStatus.DELIVERED, DeliveryStatus.SKIPPED])
    assert len(both) == 100
    only = list_deliveries(db, SUB, statuses=[DeliveryStatus.DELIVERED])
    assert [d.delivery_key for d in only] == [delivered]


def test_the_disablement_an_attempt_returns_is_the_one_recorded(db: sqlite3.Connection) -> None:
    # WHEN a first attempt is answered 410 Gone
    disabled = record_attempt(
        db,
        delivery_key=f"evt_{7:032x}:{SUB}",
        tenant_id="acme",
        project_id="proj",
        event_id=f"evt_{7:032x}",
        event_type="task.completed",
        subscription_id=SUB,
        body=b"{}",
        attempt=GONE,
        now_s=T0,
        policy=POLICY,
    )
    # THEN what it returns (the consumer writes its fact from it) is what the ledger keeps
    assert disabled is not None
    assert unrecorded_disablements(db) == [disabled]
    assert (disabled.status_code, disabled.failing_since_s, disabled.disabled_at_s) == (
        410,
        T0,
        T0,
    )


def test_a_failed_attempt_with_no_error_of_its_own_says_it_was_not_answered_2xx(
    db: sqlite3.Connection,
) -> None:
    key = first_attempt(db, 1, Attempt(ok=False, status_code=None))
    assert get_delivery(db, key).last_error == "the receiver did not answer 2xx"
    with pytest.raises(LookupError) as unknown:
        get_delivery(db, "evt_x:sub_x")
    assert str(unknown.value) == "no webhook delivery 'evt_x:sub_x'"
