"""Housekeeping sends its commands onto their queues on a real nats-server (spec "Sweep
housekeeping", "Queues"): each lands on ``cmd.<queue>`` once, a second run of the same tick is
dropped by JetStream's duplicate window, and one queue that refuses does not stop the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from rhumbatron.core.clock import ManualClock
from rhumbatron.lifecycle.housekeeping import Housekeeper, QuietChange, ReleasingChange
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.protocol.envelopes import Command
from rhumbatron.runtime.bootstrap import Rhumbatron

pytestmark = pytest.mark.integration

DAILY = datetime(2026, 11, 29, 4, 17, tzinfo=UTC)
SWEEP = datetime(2026, 11, 29, 18, 4, tzinfo=UTC)
OLD = SWEEP - timedelta(hours=1)


@dataclass
class World:
    """Two archived Projects, one without a ready index, one deleted with index rows, one
    Change stuck releasing and two quiet ones."""

    archived: list[str] = field(default_factory=lambda: ["arch-1", "arch-2"])
    unindexed: list[str] = field(default_factory=lambda: ["new-1"])
    deleted: list[str] = field(default_factory=lambda: ["gone-1"])
    releasing: list[ReleasingChange] = field(
        default_factory=lambda: [ReleasingChange("acme-web", "chg-1", "rel-1", OLD)]
    )
    quiet: list[QuietChange] = field(
        default_factory=lambda: [
            QuietChange("acme-web", "chg-2", "verifying", OLD),
            QuietChange("acme-web", "chg-3", "integrating", OLD),
        ]
    )

    def archived_projects(self, limit: int) -> list[str]:
        return self.archived[:limit]

    def active_projects_without_ready_index(self, limit: int) -> list[str]:
        return self.unindexed[:limit]

    def deleted_projects_with_index_rows(self, limit: int) -> list[str]:
        return self.deleted[:limit]

    def releasing_changes(self, promoted_before: datetime, limit: int) -> list[ReleasingChange]:
        return [c for c in self.releasing if c.promoted_at < promoted_before][:limit]

    def quiet_changes(
        self, updated_after: datetime, updated_before: datetime, limit: int
    ) -> list[QuietChange]:
        return [c for c in self.quiet if updated_after < c.updated_at <= updated_before][:limit]


def housekeeper(app: Rhumbatron) -> Housekeeper:
    return Housekeeper(World(), app.settings, app.clock, app.command_bus)


async def subject_counts(app: Rhumbatron) -> dict[str, int]:
    """Messages stored on the COMMANDS stream by subject (nothing consumes them here)."""
    js = (await app.nats()).jetstream()
    info = await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.>")
    return dict(info.state.subjects or {})


async def last_command(app: Rhumbatron, queue: str) -> Command:
    js = (await app.nats()).jetstream()
    message = await js.get_last_msg(COMMAND_STREAM, command_subject(queue))
    return Command.parse(message.data)


async def test_the_daily_tick_sends_its_set_once_and_a_rerun_is_all_duplicates(
    app: Rhumbatron,
) -> None:
    # GIVEN the clock at the 04:17 UTC tick
    assert isinstance(app.clock, ManualClock)
    app.clock.set(DAILY)
    keeper = housekeeper(app)

    # WHEN housekeeping runs
    report = await keeper.run()

    # THEN forks.sweep, 2 cleanups, 2 purges and 1 backfill were stored on their queues
    assert report.sent == {
        "forks.sweep": 1,
        "project.cleanup": 2,
        "index.purge": 2,
        "index.build": 1,
    }
    assert (report.duplicates, report.failed) == ({}, {})
    assert await subject_counts(app) == {"cmd.integration": 3, "cmd.indexing": 3}
    backfill = await last_command(app, "indexing")
    assert (backfill.command_id, backfill.command_type) == (
        "cmd_index_backfill_new-1_20261129",
        "index.build",
    )

    # WHEN the same tick runs again later in the minute (a retried Lambda)
    app.clock.advance(40)
    again = await keeper.run()

    # THEN JetStream dropped every command as a duplicate and the queues hold the same six
    assert again.command_ids == report.command_ids
    assert (again.sent, again.failed) == ({}, {})
    assert again.duplicates == report.sent
    assert await subject_counts(app) == {"cmd.integration": 3, "cmd.indexing": 3}


async def test_the_release_sweep_sends_its_set_and_the_next_tick_sends_again(
    app: Rhumbatron,
) -> None:
    # GIVEN the 18:04 release-sweep tick
    assert isinstance(app.clock, ManualClock)
    app.clock.set(SWEEP)
    keeper = housekeeper(app)

    # WHEN it runs twice in the minute
    first = await keeper.run()
    again = await keeper.run()

    # THEN one recover, two settles and one purge were stored once
    assert first.sent == {"release.recover": 1, "change.settle": 2, "index.purge": 1}
    assert again.duplicates == first.sent and again.sent == {}
    assert await subject_counts(app) == {"cmd.integration": 3, "cmd.indexing": 1}
    last = await last_command(app, "integration")
    assert (last.command_id, last.change_id) == ("cmd_settle_chg-3_202611291804", "chg-3")

    # WHEN the next release-sweep tick finds the same Changes still stuck
    app.clock.advance(minutes=5)
    later = await keeper.run()

    # THEN it queues them again under new IDs
    assert later.sent == first.sent and later.duplicates == {}
    assert await subject_counts(app) == {"cmd.integration": 6, "cmd.indexing": 2}


async def test_a_queue_that_refuses_does_not_stop_the_other_commands(
    app: Rhumbatron, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a COMMANDS stream that no longer takes cmd.indexing (a send there has no responder)
    js = (await app.nats()).jetstream()
    config = (await js.stream_info(COMMAND_STREAM)).config
    config.subjects = [s for s in config.subjects or [] if s != command_subject("indexing")]
    await js.update_stream(config)
    assert isinstance(app.clock, ManualClock)
    app.clock.set(DAILY)

    # WHEN the daily tick runs
    report = await housekeeper(app).run()

    # THEN the two index commands failed, were counted, and the integration ones still went
    assert report.failed == {"index.purge": 2, "index.build": 1}
    assert report.failed_ids == [
        "cmd_index_purge_arch-1_20261129",
        "cmd_index_purge_arch-2_20261129",
        "cmd_index_backfill_new-1_20261129",
    ]
    assert report.sent == {"forks.sweep": 1, "project.cleanup": 2}
    assert await subject_counts(app) == {"cmd.integration": 3}
    # AND each failure was logged with its command ID
    logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert all(any(cid in line for line in logged) for cid in report.failed_ids)
