"""The Lambda roles' ports onto the process's runtime: what each role reads, and nothing else.

The composition root's :class:`~rhumbatron.runtime.bootstrap.Rhumbatron` satisfies every one;
``functions/<role>/app.py`` hands the role a provider of it
(:func:`~rhumbatron.runtime.process.process_runtime`), which the role calls once its event is
valid. The roles sit below the composition root and never import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from rhumbatron.queues.context import QueueContext

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.actors.publisher import PublishReport, ScanReport
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.lifecycle.housekeeping import HousekeepingReport
    from rhumbatron.lifecycle.workflows import LifecycleWorkflows
    from rhumbatron.messaging.queue_consumer import CommandHandler, PollReport
    from rhumbatron.messaging.streams import StreamReport
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.router.ports import TurnedRouter
    from rhumbatron.router.reports import SweepReport

__all__ = [
    "NudgeRuntime",
    "PublisherRuntime",
    "QueueWorkerRuntime",
    "RoleRuntime",
    "RuntimeProvider",
    "SweepRuntime",
    "SweepTick",
    "WorkflowStepRuntime",
]

RuntimeT_co = TypeVar("RuntimeT_co", covariant=True)


class RuntimeProvider(Protocol[RuntimeT_co]):
    """Gives the process's runtime (built on the first call, the same one after)."""

    def __call__(self) -> RuntimeT_co: ...


class RoleRuntime(Protocol):
    """What every role reads: the settings and clock, the NATS connection and the streams
    (:func:`~rhumbatron.entrypoints._lambda.prepare`), and where its metrics go."""

    settings: Settings
    clock: Clock
    streams_ready: bool

    @property
    def metrics_sink(self) -> MetricsSink: ...

    def product(self) -> ProductDatabase: ...

    async def nats(self) -> NATS: ...

    async def ensure_streams(self) -> StreamReport: ...


class PublisherRuntime(RoleRuntime, Protocol):
    """The outbox publisher's: one actor's alarm, or the every-minute scan."""

    async def fire_alarm(
        self, actor_key: str, *, should_stop: Callable[[], bool] | None = None
    ) -> PublishReport: ...

    async def fire_due_alarms(
        self, *, should_stop: Callable[[], bool] | None = None, rotate: bool = False
    ) -> ScanReport: ...


class NudgeRuntime(RoleRuntime, Protocol):
    """The router nudge's: the event router's nudge run."""

    def router(self) -> TurnedRouter: ...


class QueueHandlers(Protocol):
    """The handler of each lifecycle queue."""

    def handler(self, queue: str) -> CommandHandler: ...


class QueueWorkerRuntime(RoleRuntime, QueueContext, Protocol):
    """A queue worker's: the queue runtime, the lifecycle's handlers and, for the dead-letter
    queue, what its consumer reads."""

    def lifecycle(self) -> QueueHandlers: ...


@dataclass(frozen=True, slots=True)
class SweepTick:
    """What one sweep tick did: the router's tick, the dead-letter queue's poll, the letters
    closed, the housekeeping, the resumed workflows, the time events, the webhook retries,
    the tick's own figures, and the replicas of its stream that lost events."""

    router: SweepReport
    letters: PollReport
    letters_closed_as_ended: int
    housekeeping: HousekeepingReport
    workflows_resumed: list[str]
    schedules_fired: list[str]
    schedules_failed: dict[str, str]
    webhook_retries: dict[str, object]
    dead_letters_open: int
    clef_flash_calls_today: int
    out_of_time: bool
    #: Events each replica of the tick's stream lost inside its own sequence range, by node
    #: (only those that lost some; empty without RHUMBATRON_NATS_MONITOR_URLS).
    log_gaps: dict[str, int]
    #: Rows of the causal router's bookkeeping (decisions, daily counters) past retention.
    causal_rows_pruned: int = 0
    #: The scheduled full proof of the tick's stream, when this tick ran it: the events
    #: checked, whether a replica lacked some, the seconds and requests it took.
    log_proof: dict[str, object] | None = None


class SweepRuntime(RoleRuntime, Protocol):
    """The sweep's: one tick of the root's sweep job (the router's tick and the minute's
    housekeeping, :mod:`rhumbatron.runtime.sweep_tick`)."""

    async def sweep_tick(
        self, now: datetime, *, should_stop: Callable[[], bool] | None = None
    ) -> SweepTick: ...


class WorkflowDefinitions(Protocol):
    """The lifecycle's workflow definitions."""

    @property
    def workflows(self) -> LifecycleWorkflows: ...


class WorkflowStepRuntime(Protocol):
    """The Step Functions task's: the workflow definitions and where a step's metrics go,
    and nothing of NATS."""

    @property
    def metrics_sink(self) -> MetricsSink: ...

    def lifecycle(self) -> WorkflowDefinitions: ...
