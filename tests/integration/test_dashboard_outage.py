"""The dashboard while NATS is down (S0-057): it lags rather than erroring — the panels read
from files still answer, with the outbox backlog growing, and a panel that needs NATS says
it is unavailable instead of blanking the page."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.ids import event_stream_name, stream_index
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.dashboard.summary import collect_summary
from rhumbatron_dev.local.nats_server import NatsServerProcess

pytestmark = pytest.mark.integration


async def test_with_nats_down_the_dashboard_shows_the_backlog_and_marks_the_lag_unavailable(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN a runtime whose NATS has gone away, with a fact waiting in an outbox
    settings = load_settings(
        state_dir=tmp_path / "state", nats_url=nats_server.url, nats_connect_timeout_s=0.5
    )
    app = bootstrap(settings, clock=ManualClock(), alarms=RecordingAlarmSink())
    app.project_root("acme-shop").create_project(Caller("acme", "user:ann", "c1"), name="Shop")
    nats_server.stop()
    try:
        # WHEN the dashboard's summary is read
        summary = await collect_summary(app, stats=None)

        # THEN it answers: the backlog shows the fact not yet published (the dashboard lags),
        # the dead letters read as usual, and the lag and command panels say NATS is down
        assert summary["outbox"]["pending"] == 1
        assert summary["deadLetters"]["open"] == 0 and summary["deadLetters"]["letters"] == []
        assert "error" in summary["lags"] and "error" in summary["commands"]
    finally:
        await app.close()


async def test_the_lag_panel_says_which_sweep_tick_a_streams_waiting_records_wait_for(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    # GIVEN a published project.created no consumer has read yet (nothing nudged, no sweep:
    # the router's consumers, not made yet, lag by the whole stream), at 10:00:30 UTC
    settings = load_settings(state_dir=tmp_path / "state", nats_url=nats_server.url)
    clock = ManualClock(datetime(2026, 12, 4, 10, 0, 30, tzinfo=UTC))
    app = bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())
    try:
        await app.ensure_streams()
        app.project_root("acme-shop").create_project(Caller("acme", "user:ann", "c1"), name="S")
        await app.fire_due_alarms()
        # WHEN the dashboard's summary is read
        summary = await collect_summary(app, stats=None)
        # THEN the lag panel names the stream, what waits there, and its next sweep tick:
        # the first minute after now whose minute of the day mod 8 is the stream's index
        index = stream_index("acme-shop")
        [waiting] = summary["lags"]["waiting"]
        assert waiting["stream"] == event_stream_name(index)
        assert waiting["pending"] >= 1
        minute = next(m for m in range(1, 9) if (600 + m) % 8 == index)
        assert waiting["nextSweepAt"] == f"2026-12-04T10:{minute:02d}:00+00:00"
    finally:
        await app.close()
