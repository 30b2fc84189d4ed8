"""Reconciliation tells a replica that lost events from one still catching up (issue #18): an
event stored beyond a copy's own last sequence has not reached it yet; one inside its range is
lost (a node that lost stored events keeps its range, with holes in it)."""

from __future__ import annotations

from rhumbatron.messaging.log_state import ReplicaState
from rhumbatron.operator.reconciliation import ReplicaReport, split_missing

WANTED: dict[str, int | None] = {"e-1": 1, "e-2": 2, "e-3": 3, "e-4": 4, "e-5": None}


def copy(last_seq: int, messages: int) -> ReplicaState:
    return ReplicaState("EVENTS_00", "node1", messages, 1, last_seq, 0, "node0")


def test_a_follower_behind_the_leader_is_catching_up_not_damaged() -> None:
    # GIVEN a copy that holds 1 and 2 and ends there (no holes): 3 and 4 have not reached it
    state = copy(last_seq=2, messages=2)
    lost, catching_up = split_missing(WANTED, {"e-1": 1, "e-2": 2, "e-5": 5}, state, leader_last=5)
    assert (lost, catching_up) == ((), ("e-3", "e-4"))
    report = ReplicaReport("node1", False, 5, 3, lost, state, 2, catching_up=catching_up)
    # THEN it is no gap: nothing to rebuild, nothing to publish again
    assert not report.has_gap
    assert report.as_json()["catchingUp"] == ["e-3", "e-4"]


def test_an_event_missing_inside_the_copys_range_is_lost() -> None:
    # GIVEN a copy whose range reaches 4 but which holds only 1, 2 and 4 (3 lost in place)
    state = copy(last_seq=4, messages=3)
    lost, catching_up = split_missing(
        WANTED, {"e-1": 1, "e-2": 2, "e-4": 4, "e-5": 5}, state, leader_last=5
    )
    assert (lost, catching_up) == (("e-3",), ())
    assert ReplicaReport("node1", False, 5, 4, lost, state).has_gap


def test_without_the_copys_range_or_the_events_place_a_missing_event_counts_as_lost() -> None:
    lost, catching_up = split_missing(
        WANTED, {"e-1": 1, "e-2": 2, "e-3": 3, "e-4": 4}, None, leader_last=5
    )
    assert (lost, catching_up) == (("e-5",), ())
    # an event whose place the outbox did not keep is lost even beyond the range
    lost, catching_up = split_missing(WANTED, {}, copy(last_seq=0, messages=0), leader_last=5)
    assert (lost, catching_up) == (("e-5",), ("e-1", "e-2", "e-3", "e-4"))


def test_beyond_the_leaders_own_last_sequence_nothing_is_catching_up() -> None:
    # GIVEN the leader (or a server on its own) whose newest events were cut with their
    # sequences: its range ends at 2, and it was the one to send 3 and 4 to anyone
    state = copy(last_seq=2, messages=2)
    lost, catching_up = split_missing(WANTED, {"e-1": 1, "e-2": 2, "e-5": 5}, state, leader_last=2)
    # THEN they are lost, not on their way
    assert (lost, catching_up) == (("e-3", "e-4"), ())
    # AND a follower behind that leader is catching up only to what the leader has
    lost, catching_up = split_missing(WANTED, {"e-1": 1, "e-5": 5}, copy(1, 1), leader_last=3)
    assert (lost, catching_up) == (("e-4",), ("e-2", "e-3"))
