"""When a reconciliation scan's empty fetch ends the copy, and when empty fetches with
messages still pending fail the scan (``log_state._ScanPacing``)."""

from __future__ import annotations

import pytest

from rhumbatron.errors import MessagingError
from rhumbatron.messaging.log_state import SCAN_STALLS, _ScanPacing


def test_a_caught_up_copy_ends_at_its_first_fetch_with_nothing_pending() -> None:
    pacing = _ScanPacing("EVENTS_00", caught_up=True)
    assert pacing.timed_out_ends_copy(0)


def test_a_copy_not_caught_up_waits_for_its_catch_up_before_it_ends() -> None:
    # nothing pending, but the copy may still be catching up: not the end yet
    assert not _ScanPacing("EVENTS_00", caught_up=False).timed_out_ends_copy(0)


def test_empty_fetches_with_messages_pending_fail_the_scan_at_the_tenth_in_a_row() -> None:
    assert SCAN_STALLS == 10
    pacing = _ScanPacing("EVENTS_03", caught_up=True)
    # the stalls of a run broken by an answer do not add up
    for _ in range(SCAN_STALLS - 1):
        assert not pacing.timed_out_ends_copy(5)
    pacing.answered()
    for _ in range(SCAN_STALLS - 1):
        assert not pacing.timed_out_ends_copy(None)  # pending unknown counts as pending
    with pytest.raises(MessagingError) as raised:
        pacing.timed_out_ends_copy(5)
    assert str(raised.value) == (
        "the scan of EVENTS_03 got nothing in 10 fetches in a row with messages still pending"
    )
