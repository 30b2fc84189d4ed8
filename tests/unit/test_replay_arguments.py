"""The replay's argument checks that need no runtime: a moment's UTC day."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from rhumbatron.errors import ReplayError
from rhumbatron.router.replay_arguments import utc_day_of


@pytest.mark.usefixtures("local_time_far_from_utc")
def test_a_moments_day_is_its_utc_day_whatever_the_hosts_time_zone() -> None:
    # GIVEN a host five hours west of UTC, where 03:00 UTC is still the day before
    # WHEN the UTC day of moments near midnight is asked  THEN it is UTC's day
    assert utc_day_of(datetime(2026, 3, 2, 3, 0, tzinfo=UTC), "start") == date(2026, 3, 2)
    east = timezone(timedelta(hours=5))
    assert utc_day_of(datetime(2026, 3, 2, 2, 0, tzinfo=east), "end") == date(2026, 3, 1)


def test_a_moment_with_no_utc_day_is_refused_naming_the_argument() -> None:
    moment = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    with pytest.raises(ReplayError) as refused:
        utc_day_of(moment, "start")
    assert str(refused.value) == (
        "start=0001-01-01T00:00:00+05:00 has no UTC day (it is outside the calendar's range); "
        "pass a time between the years 1 and 9999 in UTC"
    )
