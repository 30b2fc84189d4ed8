"""The housekeeping the every-minute sweep queues (spec "Sweep housekeeping", "Queues").

Two ticks queue commands; every other minute queues nothing:

* the **daily maintenance tick** (04:17 UTC): one ``forks.sweep``; ``project.cleanup`` and
  ``index.purge`` for up to 10 archived Projects (the same Projects for both); an
  ``index.build`` backfill for up to 10 active Projects without a ready index;
* the **release-sweep tick** (minutes 4, 9, 14 … of each hour): ``release.recover`` for up to
  10 Changes still releasing 45 minutes after promotion; ``change.settle`` for up to 10 open
  Changes quiet for 3 minutes to 6 hours that cannot move on their own; ``index.purge`` for up
  to 10 deleted Projects that still have index rows.

Each cap is ``housekeeping_batch_cap`` per kind and per tick. :func:`plan_housekeeping` is a pure
function of a read-only :class:`HousekeepingWorld` and the time; :class:`Housekeeper` sends the
plan. Command IDs are stable per tick — keyed on the UTC day (daily) or the tick's minute
(release sweep) — so a tick that runs twice (a retried Lambda) sends nothing twice inside
JetStream's 2-hour duplicate window, while the next tick sends again. The rest of the two
ticks (the ``processed_events`` prune, closing the dead letters of ended Changes) lives in
the router.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from rhumbatron.causal.rules import PlannedCommand
from rhumbatron.core.clock import Clock
from rhumbatron.core.settings import Settings
from rhumbatron.errors import RhumbatronError
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.envelopes import Command, format_timestamp

if TYPE_CHECKING:
    from rhumbatron.messaging.commands import CommandBus, SendResult

__all__ = [
    "PLATFORM_PROJECT_ID",
    "Housekeeper",
    "HousekeepingPlan",
    "HousekeepingReport",
    "HousekeepingWorld",
    "QuietChange",
    "ReleasingChange",
    "plan_housekeeping",
]

_log = logging.getLogger(__name__)

#: The ``projectId`` of a command about no one Project (``forks.sweep``). The envelope
#: requires a project ID matching ``PROJECT_ID_PATTERN``, which refuses a leading ``_``, so the
#: placeholder is a plain word; no tenant owns it, so its dead letters carry no tenant.
PLATFORM_PROJECT_ID = "platform"

# An ID part used verbatim only if it stays inside the envelope's command-ID alphabet and
# leaves room for the prefix and the tick key under the 200-character limit.
_SAFE_ID_PART = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


@dataclass(frozen=True, slots=True)
class ReleasingChange:
    """A Change whose release has not finished, and when its generation was promoted."""

    project_id: str
    change_id: str
    release_id: str
    promoted_at: datetime


@dataclass(frozen=True, slots=True)
class QuietChange:
    """An open Change that nothing has touched since ``updated_at`` and that cannot move on
    its own (no running Task, no workflow in flight)."""

    project_id: str
    change_id: str
    status: str
    updated_at: datetime


class HousekeepingWorld(Protocol):
    """What the planner reads; the lifecycle's actors answer it. Every method returns at most
    ``limit`` items, oldest first where an order matters."""

    def archived_projects(self, limit: int) -> Sequence[str]:
        """IDs of archived Projects whose files and index are still to be cleaned up."""
        ...

    def active_projects_without_ready_index(self, limit: int) -> Sequence[str]:
        """IDs of active Projects that have no index in the ``ready`` state."""
        ...

    def deleted_projects_with_index_rows(self, limit: int) -> Sequence[str]:
        """IDs of deleted Projects that still have rows in the index."""
        ...

    def releasing_changes(self, promoted_before: datetime, limit: int) -> Sequence[ReleasingChange]:
        """Changes still releasing whose generation was promoted at or before
        ``promoted_before`` (a Change exactly 45 minutes after its promotion is one)."""
        ...

    def quiet_changes(
        self, updated_after: datetime, updated_before: datetime, limit: int
    ) -> Sequence[QuietChange]:
        """Open Changes last updated inside ``[updated_after, updated_before]`` (both ends
        included) that cannot move on their own."""
        ...


@dataclass
class HousekeepingPlan:
    """The commands one tick queues, and which of the two housekeeping ticks ``at`` is."""

    at: datetime
    daily: bool
    release_sweep: bool
    commands: list[PlannedCommand] = field(default_factory=list)

    @property
    def command_ids(self) -> list[str]:
        """The planned command IDs, in send order."""
        return [planned.command.command_id for planned in self.commands]


def plan_housekeeping(
    world: HousekeepingWorld, settings: Settings, now: datetime
) -> HousekeepingPlan:
    """The commands the tick of ``now`` (UTC minute) queues; empty on a minute that is neither
    the daily maintenance tick nor a release-sweep tick. The world is asked only for the
    kinds that run, each with ``limit=housekeeping_batch_cap``."""
    # Imported here, not at the top: the router's sweep is where housekeeping runs, so the
    # router may import this module, and a top-level import back would be circular.
    from rhumbatron.router.ticks import tick_kind

    now = now.astimezone(UTC)
    _, daily, release_sweep = tick_kind(settings, now)
    plan = HousekeepingPlan(now, daily, release_sweep)
    if daily:
        plan.commands.extend(_daily(world, settings, now))
    if release_sweep:
        plan.commands.extend(_release_sweep(world, settings, now))
    return plan


def _daily(world: HousekeepingWorld, settings: Settings, now: datetime) -> list[PlannedCommand]:
    cap = settings.housekeeping_batch_cap
    day = now.strftime("%Y%m%d")
    commands = [_command("forks.sweep", f"cmd_forks_sweep_{day}", PLATFORM_PROJECT_ID, now, {})]
    # The same archived Projects get both commands: their files and their index go together.
    archived = list(world.archived_projects(cap))[:cap]
    commands += [
        _command(
            "project.cleanup",
            f"cmd_cleanup_{_id_part(project)}_{day}",
            project,
            now,
            {"reason": "archived"},
        )
        for project in archived
    ]
    commands += [
        _command(
            "index.purge",
            f"cmd_index_purge_{_id_part(project)}_{day}",
            project,
            now,
            {"reason": "archived"},
        )
        for project in archived
    ]
    commands += [
        _command(
            "index.build",
            f"cmd_index_backfill_{_id_part(project)}_{day}",
            project,
            now,
            {"generation": None, "reason": "backfill"},
        )
        for project in list(world.active_projects_without_ready_index(cap))[:cap]
    ]
    return commands


def _release_sweep(
    world: HousekeepingWorld, settings: Settings, now: datetime
) -> list[PlannedCommand]:
    cap = settings.housekeeping_batch_cap
    minute = now.strftime("%Y%m%d%H%M")
    promoted_before = now - timedelta(seconds=settings.release_recover_after_s)
    commands = [
        _command(
            "release.recover",
            f"cmd_recover_{_id_part(change.release_id)}_{minute}",
            change.project_id,
            now,
            {"releaseId": change.release_id},
            change_id=change.change_id,
        )
        for change in list(world.releasing_changes(promoted_before, cap))[:cap]
    ]
    quiet = world.quiet_changes(
        now - timedelta(seconds=settings.settle_quiet_max_s),
        now - timedelta(seconds=settings.settle_quiet_min_s),
        cap,
    )
    commands += [
        _command(
            "change.settle",
            f"cmd_settle_{_id_part(change.change_id)}_{minute}",
            change.project_id,
            now,
            {"reason": f"quiet in {change.status} since {format_timestamp(change.updated_at)}"},
            change_id=change.change_id,
        )
        for change in list(quiet)[:cap]
    ]
    commands += [
        _command(
            "index.purge",
            f"cmd_index_purge_{_id_part(project)}_{minute}",
            project,
            now,
            {"reason": "deleted"},
        )
        for project in list(world.deleted_projects_with_index_rows(cap))[:cap]
    ]
    return commands


def _command(
    command_type: str,
    command_id: str,
    project_id: str,
    now: datetime,
    payload: dict[str, Any],
    *,
    change_id: str | None = None,
) -> PlannedCommand:
    command = Command.create(
        command_id=command_id,
        command_type=command_type,
        project_id=project_id,
        change_id=change_id,
        created_at=now,
        payload=payload,
    )
    return PlannedCommand(COMMAND_TYPES[command_type].queue, command)


def _id_part(value: str) -> str:
    """``value`` if it fits a command ID as is; else a digest of it, still stable per value.
    Identifiers are at most 128 characters of the command ID's alphabet
    (:data:`~rhumbatron.protocol.values.Identifier`), so a digest is for state written
    before they were checked."""
    if _SAFE_ID_PART.fullmatch(value):
        return value
    return "h" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:32]


@dataclass
class HousekeepingReport:
    """What one tick's housekeeping did, counted per command type."""

    at: datetime
    daily: bool
    release_sweep: bool
    command_ids: list[str] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    failed_ids: list[str] = field(default_factory=list)

    @property
    def total_sent(self) -> int:
        """Commands JetStream stored (not counting duplicates)."""
        return sum(self.sent.values())

    @property
    def total_duplicates(self) -> int:
        """Commands JetStream dropped as repeats of an earlier run of the same tick."""
        return sum(self.duplicates.values())

    @property
    def total_failed(self) -> int:
        """Commands that could not be sent; the next tick of their kind plans them again."""
        return sum(self.failed.values())


@dataclass
class Housekeeper:
    """Plans the tick's housekeeping and sends it. Build one per process; ``bus`` returns the
    command bus over the current NATS connection (the composition root's ``command_bus``)."""

    world: HousekeepingWorld
    settings: Settings
    clock: Clock
    bus: Callable[[], Awaitable[CommandBus]]

    async def run(self, now: datetime | None = None) -> HousekeepingReport:
        """Plan for ``now`` (default: the clock) and send every command. One command that
        cannot be sent is logged and counted as failed; the others still go."""
        plan = plan_housekeeping(
            self.world, self.settings, now if now is not None else self.clock.now()
        )
        report = HousekeepingReport(
            plan.at, plan.daily, plan.release_sweep, command_ids=plan.command_ids
        )
        if not plan.commands:
            return report  # most minutes: no connection needed
        try:
            bus = await self.bus()
        except RhumbatronError as exc:
            _log.warning(
                "housekeeping at %s could not reach the command bus: %s; its %d commands are "
                "planned again by the next tick of their kind",
                format_timestamp(plan.at),
                exc,
                len(plan.commands),
            )
            for planned in plan.commands:
                _count(report.failed, planned)
                report.failed_ids.append(planned.command.command_id)
            return report
        # Sent together: a server that stops answering costs one ack timeout for the whole
        # batch, not one per command (up to 41 of them) inside the sweep's time budget.
        results = await asyncio.gather(*(_send(bus, planned) for planned in plan.commands))
        for planned, result in zip(plan.commands, results, strict=True):
            if result is None:
                _count(report.failed, planned)
                report.failed_ids.append(planned.command.command_id)
            else:
                _count(report.duplicates if result.duplicate else report.sent, planned)
        return report


async def _send(bus: CommandBus, planned: PlannedCommand) -> SendResult | None:
    """Send one command; ``None`` (logged) if it could not be sent."""
    command = planned.command
    try:
        return await bus.send(planned.queue, command)
    except RhumbatronError as exc:
        # The next tick of this kind plans it again (a new tick key), so one failure neither
        # stops the rest of the batch nor needs a retry here.
        _log.warning(
            "housekeeping could not send %s %s to %s: %s; the next tick of its kind plans it again",
            command.command_type,
            command.command_id,
            planned.queue,
            exc,
        )
        return None


def _count(counts: dict[str, int], planned: PlannedCommand) -> None:
    kind = planned.command.command_type
    counts[kind] = counts.get(kind, 0) + 1
