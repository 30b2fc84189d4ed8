"""The Lambda roles' ports onto the process's runtime: what each role reads, and nothing else.

The composition root's :class:`~rhumbatron.runtime.bootstrap.Rhumbatron` satisfies every one;
``functions/<role>/app.py`` hands the role a provider of it
(:func:`~rhumbatron.runtime.process.process_runtime`), which the role calls once its event is
valid. The roles sit below the composition root and never import it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from rhumbatron.queues.context import QueueContext
from rhumbatron.reactions.schedule_firing import ScheduleContext
from rhumbatron.router.ports import NudgedRouter

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.actors.publisher import PublishReport, ScanReport
    from rhumbatron.causal.store import CausalStore
    from rhumbatron.core.clock import Clock
    from rhumbatron.core.settings import Settings
    from rhumbatron.lifecycle.housekeeping import Housekeeper
    from rhumbatron.lifecycle.workflows import LifecycleWorkflows
    from rhumbatron.messaging.queue_consumer import CommandHandler
    from rhumbatron.messaging.streams import StreamReport
    from rhumbatron.metrics import MetricsSink
    from rhumbatron.product.database import ProductDatabase
    from rhumbatron.reactions.webhook_retries import WebhookRetrier
    from rhumbatron.router.reports import SweepReport
    from rhumbatron.workflows.engine import WorkflowEngine

__all__ = [
    "NudgeRuntime",
    "PublisherRuntime",
    "QueueWorkerRuntime",
    "RoleRuntime",
    "RuntimeProvider",
    "SweepRuntime",
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

    def router(self) -> NudgedRouter: ...


class QueueHandlers(Protocol):
    """The handler of each lifecycle queue."""

    def handler(self, queue: str) -> CommandHandler: ...


class QueueWorkerRuntime(RoleRuntime, QueueContext, Protocol):
    """A queue worker's: the queue runtime, the lifecycle's handlers and, for the dead-letter
    queue, what its consumer reads."""

    def lifecycle(self) -> QueueHandlers: ...


class SweepingRouter(Protocol):
    """The event router's sweep tick."""

    async def sweep(
        self, *, now: datetime | None = None, should_stop: Callable[[], bool] | None = None
    ) -> SweepReport: ...


class SweepLifecycle(Protocol):
    """The lifecycle's parts a sweep tick runs: housekeeping, the workflow engine (resumed
    locally) and the causal store (the day's Clef-flash calls)."""

    @property
    def housekeeper(self) -> Housekeeper: ...

    @property
    def engine(self) -> WorkflowEngine: ...

    @property
    def causal_store(self) -> CausalStore: ...


class SweepRuntime(RoleRuntime, QueueContext, ScheduleContext, Protocol):
    """The sweep's: the router's tick, the dead-letter queue, the lifecycle's housekeeping,
    the time events and the webhook retry pass."""

    def router(self) -> SweepingRouter: ...

    def lifecycle(self) -> SweepLifecycle: ...

    def webhook_retrier(self) -> WebhookRetrier: ...


class WorkflowDefinitions(Protocol):
    """The lifecycle's workflow definitions."""

    @property
    def workflows(self) -> LifecycleWorkflows: ...


class WorkflowStepRuntime(Protocol):
    """The Step Functions task's: the workflow definitions, and nothing of NATS."""

    def lifecycle(self) -> WorkflowDefinitions: ...
