"""The lifecycle's parts, wired once per process by the composition root.

:meth:`Rhumbatron.lifecycle() <rhumbatron.runtime.bootstrap.Rhumbatron.lifecycle>` builds a
:class:`Lifecycle` lazily: the causal rules (with Clef-flash and the command cap), the
integration module, the workflow engine (in-process locally, Step Functions in the cloud), the
indexer, the agent runtimes (scripted and webhook), and the handler of every queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rhumbatron.agents.registry import AgentRegistry
from rhumbatron.agents.webhook import WebhookAgentRuntime
from rhumbatron.causal.clef_flash import ClefFlash
from rhumbatron.causal.command_cap import CommandCap
from rhumbatron.causal.routing import RoutedEvent, RuleBasedRouting
from rhumbatron.causal.store import CausalStore
from rhumbatron.causal.world import ShardWorld
from rhumbatron.indexing import Indexer
from rhumbatron.lifecycle.apps import LocalApps
from rhumbatron.lifecycle.commands import LifecycleSender
from rhumbatron.lifecycle.context import LifecycleContext
from rhumbatron.lifecycle.effects import LifecycleEffects
from rhumbatron.lifecycle.forks import ForkStore
from rhumbatron.lifecycle.housekeeping import Housekeeper
from rhumbatron.lifecycle.integration import IntegrationModule
from rhumbatron.lifecycle.requests import AgentCallbacks, ChangeRequests
from rhumbatron.lifecycle.scripted_agent import AgentRuntimes, ScriptedAgentRuntime, ScriptLibrary
from rhumbatron.lifecycle.workflows import LifecycleWorkflows
from rhumbatron.lifecycle.world import LifecycleWorld
from rhumbatron.metrics import MetricsRecorder
from rhumbatron.queues.context import QueueContext
from rhumbatron.queues.wake_consumer import WakeConsumer
from rhumbatron.workflows.engine import OperableWorkflowEngine

if TYPE_CHECKING:
    from rhumbatron.actors.directory import ActorDirectory
    from rhumbatron.messaging.queue_consumer import CommandHandler
    from rhumbatron.messaging.secrets import SecretCache

__all__ = ["Lifecycle", "LifecycleHost"]


class LifecycleHost(LifecycleContext, QueueContext, Protocol):
    """What the lifecycle is built from: the lifecycle's and the queue handlers' ports, and
    the actor directory (its worlds read every project's actors)."""

    actors: ActorDirectory

    @property
    def secrets(self) -> SecretCache: ...


@dataclass
class Lifecycle:
    """Every lifecycle part of one process (see the module docstring)."""

    app: LifecycleHost
    #: Scripts the scripted agent plays (the demo loads samplefiles/lifecycle.json).
    scripts: ScriptLibrary = field(default_factory=lambda: ScriptLibrary({}))
    #: The local app provisioner's failures (the demo's dead-letter round trip).
    failing_apps: dict[str, int] = field(default_factory=dict)
    #: A Clef-flash HTTP client override (tests answer like the API through it).
    clef_flash_http: Any = None
    routed: list[RoutedEvent] = field(default_factory=list)

    @property
    def _state(self) -> Path:
        return self.app.settings.state_dir

    @cached_property
    def causal_store(self) -> CausalStore:
        return CausalStore(self.app.settings)

    @cached_property
    def metrics(self) -> MetricsRecorder:
        return MetricsRecorder(self.app.product(), self.app.metrics_sink, self.app.clock)

    @cached_property
    def cap(self) -> CommandCap:
        return CommandCap(self.app.settings, self.causal_store, metrics=self.metrics)

    @cached_property
    def clef_flash(self) -> ClefFlash:
        settings = self.app.settings
        api_key: Callable[[], Awaitable[str | None]] | None = None
        arn = settings.clef_flash_api_key_secret_arn
        if settings.clef_flash_api_key is None and arn:
            # The cloud keeps the key in Secrets Manager: asked for at each question, kept
            # secret_max_age_s by the runtime's cache, so a rotated key applies while warm. A
            # read that fails keeps the key read before: a Secrets Manager blip must not make
            # routing fail (five failures dead-letter the event). With no key ever read, the
            # question is not asked: Clef-flash abstains and the agent wakes ("no API key").
            secrets = self.app.secrets

            async def api_key() -> str | None:
                return await secrets.read_or_last_async(
                    arn,
                    what="the Anthropic API key (RHUMBATRON_CLEF_FLASH_API_KEY_SECRET_ARN)",
                    timeout_s=settings.clef_flash_timeout_s,
                )

        return ClefFlash(
            settings,
            self.causal_store,
            self.app.clock,
            metrics=self.metrics,
            http_client=self.clef_flash_http,
            api_key=api_key,
        )

    @cached_property
    def world(self) -> LifecycleWorld:
        world = LifecycleWorld(self.app.actors, forks=self.forks)
        world.indexer = Indexer(self.app.settings, self.app.product(), self.app.clock, world)
        return world

    @property
    def indexer(self) -> Indexer:
        assert self.world.indexer is not None
        return self.world.indexer

    @cached_property
    def forks(self) -> ForkStore:
        return ForkStore(self._state / "forks")

    @cached_property
    def apps(self) -> LocalApps:
        return LocalApps(self._state / "apps", dict(self.failing_apps))

    @cached_property
    def workflows(self) -> LifecycleWorkflows:
        return LifecycleWorkflows(self.world, self.forks, self.apps)

    @cached_property
    def engine(self) -> OperableWorkflowEngine:
        settings = self.app.settings
        if settings.workflow_engine == "step_functions":
            import boto3

            from rhumbatron.workflows.step_functions import StepFunctionsEngine

            arns = {
                name: arn
                for name, arn in (
                    ("verification", settings.verification_state_machine_arn),
                    ("release", settings.release_state_machine_arn),
                )
                if arn
            }
            return StepFunctionsEngine(boto3.client("stepfunctions"), arns)
        from rhumbatron.workflows.in_process import InProcessEngine

        return InProcessEngine(
            self._state / "workflows.sqlite",
            settings,
            self.app.clock,
            self.workflows.definitions(),
        )

    @cached_property
    def sender(self) -> LifecycleSender:
        return LifecycleSender(self.app, self.cap, self.engine)

    @cached_property
    def integration(self) -> IntegrationModule:
        return IntegrationModule(
            self.app, self.world, self.sender, self.engine, self.forks, self.apps
        )

    @cached_property
    def routing(self) -> RuleBasedRouting:
        return RuleBasedRouting(
            world=ShardWorld(self.app.actors, self.app.settings.max_active_agents_per_change),
            bus=self.app.command_bus,
            clock=self.app.clock,
            clef_flash=self.clef_flash,
            cap=self.cap,
            effects=LifecycleEffects(self.integration),
            routed=self.routed,
        )

    @cached_property
    def registry(self) -> AgentRegistry:
        return AgentRegistry(self.app.product(), self.app.settings, self.app.clock)

    @cached_property
    def callbacks(self) -> AgentCallbacks:
        return AgentCallbacks(self.app, self.world)

    @cached_property
    def requests(self) -> ChangeRequests:
        return ChangeRequests(self.app, self.world)

    @cached_property
    def scripted(self) -> ScriptedAgentRuntime:
        return ScriptedAgentRuntime(self.callbacks, self.scripts)

    @cached_property
    def webhook(self) -> WebhookAgentRuntime:
        return WebhookAgentRuntime(
            self.registry, self.app.settings, self.app.clock, tenant_of=self.app.project_tenant
        )

    @cached_property
    def wake_consumer(self) -> WakeConsumer:
        runtimes = AgentRuntimes(
            self.registry, self.scripted, self.webhook, tenant_of=self.app.project_tenant
        )
        return WakeConsumer(self.app, runtimes, self.app.settings.max_active_agents_per_change)

    @cached_property
    def housekeeper(self) -> Housekeeper:
        return Housekeeper(self.world, self.app.settings, self.app.clock, self.app.command_bus)

    def handler(self, queue: str) -> CommandHandler:
        """The handler of ``queue`` (the dead-letter queue has its own consumer)."""
        handlers: dict[str, CommandHandler] = {
            "agent-wakeups": self.wake_consumer,
            "integration": self.integration,
            "verification": self.integration,
            "release": self.integration,
            "indexing": self.indexer,
        }
        try:
            return handlers[queue]
        except KeyError:
            raise ValueError(
                f"no lifecycle handler for queue {queue!r}; queues: {', '.join(handlers)}"
            ) from None

    async def close(self) -> None:
        if "clef_flash" in self.__dict__:
            await self.clef_flash.close()
        if "webhook" in self.__dict__:
            await self.webhook.aclose()
        if "engine" in self.__dict__:
            close = getattr(self.engine, "close", None)
            if close is not None:
                close()
        if "causal_store" in self.__dict__:
            self.causal_store.close()
