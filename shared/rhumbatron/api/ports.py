"""The operator API's port onto the process's runtime: what its routes, dependencies and
Lambda adapter read. The composition root's :class:`~rhumbatron.runtime.bootstrap.Rhumbatron`
satisfies it; the API sits below the composition root and never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rhumbatron.lifecycle.context import LifecycleWithWorld
from rhumbatron.operator.outbox import OutboxContext

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.actors.project_root import ProjectRoot
    from rhumbatron.agents.registry import AgentRegistry
    from rhumbatron.lifecycle.commands import LifecycleSender
    from rhumbatron.lifecycle.requests import AgentCallbacks, ChangeRequests
    from rhumbatron.lifecycle.world import LifecycleWorld
    from rhumbatron.messaging.streams import StreamReport
    from rhumbatron.operator.log_repair import RepairStep
    from rhumbatron.operator.reconciliation import ReconciliationReport
    from rhumbatron.router.event_router import EventRouter
    from rhumbatron.workflows.engine import OperableWorkflowEngine

__all__ = ["ApiLifecycle", "ApiRuntime"]


class ApiLifecycle(Protocol):
    """The lifecycle's parts the routes call: what agents and callers ask for, the sender of
    lifecycle commands, the agent registry, and the reads across a project's actors."""

    @property
    def callbacks(self) -> AgentCallbacks: ...

    @property
    def requests(self) -> ChangeRequests: ...

    @property
    def sender(self) -> LifecycleSender: ...

    @property
    def registry(self) -> AgentRegistry: ...

    @property
    def world(self) -> LifecycleWorld: ...

    @property
    def engine(self) -> OperableWorkflowEngine: ...


class ApiRuntime(LifecycleWithWorld, OutboxContext, Protocol):
    """Everything the API reads of the process: the lifecycle's and the operator's ports,
    the event router (replays, lags, an event's lookup), the NATS connection and the
    streams, and closing it all (a local API that owns its runtime)."""

    #: The streams were ensured (the Lambda adapter's ``prepare``).
    streams_ready: bool

    def project_root(self, project_id: str) -> ProjectRoot: ...

    def lifecycle(self) -> ApiLifecycle: ...

    def router(self) -> EventRouter: ...

    async def nats(self) -> NATS: ...

    async def ensure_streams(self) -> StreamReport: ...

    async def reconcile(
        self, stream_indexes: Sequence[int] | None = None
    ) -> ReconciliationReport: ...

    async def repair_log(
        self, report: ReconciliationReport, *, dry_run: bool
    ) -> list[RepairStep]: ...

    async def close(self) -> None: ...
