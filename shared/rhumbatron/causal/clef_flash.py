"""Clef-flash: should an Agent wake for a resource Event that overlaps its resources only by prefix?

The deterministic rules wake an Agent on an exact resource overlap and ignore no overlap; a
prefix-only overlap (the Event touches ``src/``, the Agent holds ``src/auth/login.py``) is the
one question they leave to a model. Clef-flash asks it as **one Claude Haiku call with a
forced tool call** (``tool_choice`` names ``decide_wake``), so the answer is always the tool's
structured input, never prose to parse.

The rules of the answer (spec "Causal routing", DECISIONS "Caps and causal routing"):

* the model says ``wake`` or ``skip`` with a probability; below
  :attr:`~rhumbatron.core.settings.Settings.clef_flash_threshold` (0.7) it **abstains**,
  and an abstention wakes the Agent. Exactly 0.7 does not abstain;
* no API key → abstain; an API error, a timeout, or an answer without the tool → abstain.
  A missed wake costs a stalled Agent, a needless one costs one relevance check in the wake
  consumer, so every doubt wakes;
* at most :attr:`~rhumbatron.core.settings.Settings.clef_flash_max_calls_per_day` (200)
  calls per UTC day, per deployment or per tenant
  (:attr:`~rhumbatron.core.settings.Settings.clef_flash_cap_scope`); the call is counted in
  SQLite **before** it is made, so concurrent routers cannot exceed the cap. Past it the Agent
  wakes without a question;
* every decision is recorded per ``(event_id, agent_id)`` in
  :class:`~rhumbatron.causal.store.CausalStore`: a replay of the same Event asks nothing and
  reuses the decision (source ``cached``). Each decision also yields a ``model_route`` data
  point for the ``METRICS`` binding, recorded through the caller's
  :class:`~rhumbatron.metrics.MetricsRecorder` when one is given and always returned on the
  decision (see :attr:`ClefFlashDecision.point`);
* a decision says whether the model was really asked (:attr:`ClefFlashDecision.asked_model`:
  a call was made and counted, whatever came back), also when it is reused from the store, so
  the router can record ``model.routed`` in the Agent's Change once per question even if its
  first attempt died after the call.

The ``anthropic`` SDK is imported at the first question, not at import time: a cold start of
a router that never meets a prefix overlap does not pay for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from rhumbatron.causal.store import CausalStore, StoredDecision, Verdict
from rhumbatron.core.clock import Clock, utc_day
from rhumbatron.core.settings import Settings
from rhumbatron.metrics.platform_metrics import DataPoint

if TYPE_CHECKING:
    import httpx2
    from anthropic import AsyncAnthropic
    from anthropic.types import Message, ToolParam

    from rhumbatron.metrics.recorder import MetricsRecorder
    from rhumbatron.protocol.envelopes import Event

__all__ = [
    "DECIDE_WAKE_TOOL",
    "DEPLOYMENT_SCOPE",
    "MODEL_ROUTE_METRIC",
    "ClefFlash",
    "ClefFlashDecision",
    "DecisionSource",
    "Verdict",
    "calls_on",
]

logger = logging.getLogger(__name__)

#: The metric each decision yields (a name the analytics projector also uses for Events).
MODEL_ROUTE_METRIC = "model_route"
#: The ``clef_flash_calls.scope`` of the deployment-wide cap.
DEPLOYMENT_SCOPE = "*"

#: Where a decision came from. ``model`` and ``low_confidence`` are fresh model answers (the
#: second one abstains); the others asked no model, or reused an earlier answer.
DecisionSource = Literal["model", "cached", "no_key", "cap_reached", "error", "low_confidence"]
#: The first sources of a decision for which a call was made (and counted): the model was
#: asked, whether it answered, answered unusably, or failed (``error``).
_ASKED_SOURCES = frozenset({"model", "low_confidence", "error"})

_TOOL_NAME = "decide_wake"

#: The one tool Clef-flash offers and forces. Its input is the whole answer.
DECIDE_WAKE_TOOL: ToolParam = {
    "name": _TOOL_NAME,
    "description": (
        "Decide whether the agent should wake up to re-check its work because of the event. "
        "Wake when the event's resource plausibly affects the agent's resources; skip when "
        "it clearly does not. Give your probability that the decision is right."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "decision": {"type": "string", "enum": ["wake", "skip"]},
            "probability": {"type": "number", "minimum": 0, "maximum": 1},
            "reason": {"type": "string", "description": "One short sentence."},
        },
        "required": ["decision", "probability", "reason"],
        "additionalProperties": False,
    },
}

_SYSTEM_PROMPT = (
    "You route events in a system where software agents work on overlapping files. An event "
    "touched a resource that overlaps an agent's resources only by path prefix. Decide with "
    "the decide_wake tool whether the agent must wake to re-check its work. A needless wake "
    "costs little; a missed one can make the agent's work conflict."
)


class _WakeAnswer(BaseModel):
    """The ``decide_wake`` tool input, validated: the model's output is untrusted input."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    decision: Literal["wake", "skip"]
    probability: float = Field(ge=0.0, le=1.0)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ClefFlashDecision:
    """Whether one Agent wakes for one Event, and why.

    ``verdict`` is ``wake`` or ``skip`` (the model was at least the threshold sure) or
    ``abstain`` (it was not, or it was not asked). ``probability`` is the model's, or None
    when no model answered. :attr:`wakes` is what the router acts on. ``asked_model``: a
    call to ``model`` was made for this decision (true on a reuse of such a decision too).
    """

    event_id: str
    agent_id: str
    verdict: Verdict
    probability: float | None
    reason: str
    source: DecisionSource
    model: str
    point: DataPoint
    asked_model: bool = False

    @property
    def wakes(self) -> bool:
        """True unless the model said skip with enough confidence: an abstention wakes."""
        return self.verdict != "skip"


class _AgentLike(Protocol):
    @property
    def agent_id(self) -> str: ...

    @property
    def resources(self) -> Sequence[str]: ...


class _QuestionLike(Protocol):
    """What :meth:`ClefFlash.ask` reads: the rules' ``ClefQuestion`` (event and agent)."""

    @property
    def event(self) -> Event: ...

    @property
    def agent(self) -> _AgentLike: ...


class _NoToolAnswer(ValueError):
    """The response held no valid ``decide_wake`` tool input (a refusal, a bad schema)."""


class ClefFlash:
    """Asks Claude Haiku whether an Agent wakes for a prefix-only overlap; see the module.

    ``http_client`` is an ``httpx2.AsyncClient`` handed to the SDK (tests pass one with a
    mock transport); None lets the SDK build its own. ``metrics``, when given, records each
    decision's ``model_route`` point (its own short transaction on the product file). The SDK
    client is built once, at the first question, and reused: one per warm Lambda.
    ``api_key``, when given, is asked for the key at each question instead of the settings'
    ``clef_flash_api_key`` (the cloud's key in Secrets Manager, kept a while by the runtime's
    cache): a rotated key reaches the next question, and the SDK client takes it over. It
    answers None when no key can be had (a read that failed with none kept before): the
    question is then not asked, as with no key at all.
    """

    def __init__(
        self,
        settings: Settings,
        store: CausalStore,
        clock: Clock,
        *,
        metrics: MetricsRecorder | None = None,
        http_client: httpx2.AsyncClient | None = None,
        api_key: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self._settings = settings
        self._api_key = api_key
        self._client_key: str | None = None
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._http_client = http_client
        self._client: AsyncAnthropic | None = None

    async def ask(self, question: _QuestionLike) -> ClefFlashDecision:
        """:meth:`decide` for a rules ``ClefQuestion`` (anything with ``event`` and ``agent``)."""
        return await self.decide(
            question.event, question.agent.agent_id, tuple(question.agent.resources)
        )

    async def decide(
        self, event: Event, agent_id: str, agent_resources: Sequence[str]
    ) -> ClefFlashDecision:
        """Whether ``agent_id`` (holding ``agent_resources``) wakes for ``event``.

        Never raises for the model's sake: no key, the cap, an API error or a timeout all
        end in a decision (abstain or cap_reached, both waking). A SQLite failure of the
        store does raise (:class:`~rhumbatron.errors.ActorError`): the router then retries
        the Event, and nothing was asked without being counted.
        """
        stored = self._store.decision(event.event_id, agent_id)
        if stored is not None:
            return self._finish(stored, source="cached")

        api_key = self._settings.clef_flash_api_key
        if self._api_key is not None:
            asked = await self._api_key()
            api_key = None if asked is None else SecretStr(asked.strip())
        if api_key is None or not api_key.get_secret_value():
            return self._keep(
                event,
                agent_id,
                verdict="abstain",
                probability=None,
                reason="no API key",
                source="no_key",
            )

        if not self._reserve_call(event, agent_id):
            return self._keep(
                event,
                agent_id,
                verdict="wake",
                probability=None,
                reason="daily Clef-flash cap reached",
                source="cap_reached",
            )
        return await self._ask_and_keep(event, agent_id, agent_resources, api_key)

    async def close(self) -> None:
        """Close the SDK client (and with it an ``http_client`` passed in)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        elif self._http_client is not None:
            # No question reached the SDK (no key, or never asked): close it ourselves.
            await self._http_client.aclose()
        self._http_client = None

    # -- internals --------------------------------------------------------------------------

    def _reserve_call(self, event: Event, agent_id: str) -> bool:
        """Count the call in the store before it is made; False (and a warning) past the
        daily cap, when the Agent wakes without a question."""
        now = self._clock.now()
        scope = self._scope(event)
        if not self._store.reserve_call(
            utc_day(now), scope, self._settings.clef_flash_max_calls_per_day
        ):
            logger.warning(
                "Clef-flash cap of %d calls per UTC day reached for scope %s on %s: waking "
                "agent %s for event %s without asking",
                self._settings.clef_flash_max_calls_per_day,
                scope,
                utc_day(now),
                agent_id,
                event.event_id,
            )
            return False
        return True

    async def _ask_and_keep(
        self, event: Event, agent_id: str, agent_resources: Sequence[str], api_key: SecretStr
    ) -> ClefFlashDecision:
        """Ask the model (the call is already counted) and keep its decision: an unusable
        answer or a failed call abstains."""
        import anthropic  # here, not at import time: see the module docstring

        try:
            answer = await self._ask_model(event, agent_id, agent_resources, api_key)
        except _NoToolAnswer as exc:
            logger.warning("Clef-flash answer unusable for event %s: %s", event.event_id, exc)
            return self._keep(
                event,
                agent_id,
                verdict="abstain",
                probability=None,
                reason=f"unusable answer: {exc}",
                source="error",
            )
        except anthropic.APIError as exc:
            # APIError covers connection errors, timeouts (APITimeoutError) and HTTP statuses;
            # anything else is a bug of ours and surfaces.
            logger.warning(
                "Clef-flash call for event %s, agent %s failed (%s: %s): abstaining, which wakes",
                event.event_id,
                agent_id,
                type(exc).__name__,
                exc,
            )
            return self._keep(
                event,
                agent_id,
                verdict="abstain",
                probability=None,
                reason=f"{type(exc).__name__}: {exc}"[:500],
                source="error",
            )
        return self._keep_answer(event, agent_id, answer)

    def _keep_answer(self, event: Event, agent_id: str, answer: _WakeAnswer) -> ClefFlashDecision:
        """The model's answer: its decision at or above the threshold, else an abstention."""
        if answer.probability < self._settings.clef_flash_threshold:
            return self._keep(
                event,
                agent_id,
                verdict="abstain",
                probability=answer.probability,
                reason=f"model said {answer.decision} below the threshold: {answer.reason}",
                source="low_confidence",
            )
        return self._keep(
            event,
            agent_id,
            verdict=answer.decision,
            probability=answer.probability,
            reason=answer.reason,
            source="model",
        )

    def _scope(self, event: Event) -> str:
        if self._settings.clef_flash_cap_scope == "tenant":
            return f"tenant:{event.tenant_id}"
        return DEPLOYMENT_SCOPE

    def _sdk(self, api_key: str) -> AsyncAnthropic:
        if self._client is not None and api_key != self._client_key:
            # A rotated key: a copy of the client with it, on the same HTTP connections.
            self._client = self._client.with_options(api_key=api_key)
            self._client_key = api_key
        if self._client is None:
            self._client_key = api_key
            from anthropic import AsyncAnthropic

            self._client = AsyncAnthropic(
                api_key=api_key,
                base_url=self._settings.anthropic_base_url,
                timeout=self._settings.clef_flash_timeout_s,
                # No SDK retries: the daily cap counts one call per question, and a retried
                # request would be an uncounted call. A failure abstains, which wakes.
                max_retries=0,
                http_client=self._http_client,
            )
        return self._client

    async def _ask_model(
        self, event: Event, agent_id: str, agent_resources: Sequence[str], api_key: SecretStr
    ) -> _WakeAnswer:
        client = self._sdk(api_key.get_secret_value())
        message = await client.messages.create(
            model=self._settings.clef_flash_model,
            max_tokens=self._settings.clef_flash_max_tokens,
            system=_SYSTEM_PROMPT,
            messages=[{"role": "user", "content": _prompt(event, agent_id, agent_resources)}],
            tools=[DECIDE_WAKE_TOOL],
            tool_choice={"type": "tool", "name": _TOOL_NAME},
        )
        return _answer(message)

    def _keep(
        self,
        event: Event,
        agent_id: str,
        *,
        verdict: Verdict,
        probability: float | None,
        reason: str,
        source: DecisionSource,
    ) -> ClefFlashDecision:
        stored = self._store.record_decision(
            StoredDecision(
                event_id=event.event_id,
                agent_id=agent_id,
                verdict=verdict,
                probability=probability,
                reason=reason,
                source=source,
                model=self._settings.clef_flash_model,
                tenant_id=event.tenant_id,
                decided_at_s=self._clock.now().timestamp(),
            )
        )
        # Another router may have recorded first: its decision is the one both act on.
        same = stored.source == source and stored.verdict == verdict
        return self._finish(stored, source=source if same else "cached", project=event.project_id)

    def _finish(
        self, stored: StoredDecision, *, source: DecisionSource, project: str | None = None
    ) -> ClefFlashDecision:
        point = DataPoint(
            name=MODEL_ROUTE_METRIC,
            dimensions={
                "route": "clef_flash",
                "verdict": stored.verdict,
                # The original source: a replay re-records the same point, which the
                # (binding, event_id, name) key then ignores, so each decision counts once.
                "source": stored.source,
                "model": stored.model,
            },
            # One decision per (event, agent): the pair is the point's idempotency key.
            event_id=f"{stored.event_id}#{stored.agent_id}",
            project_id=project,
        )
        if self._metrics is not None:
            self._metrics.record([point])
        return ClefFlashDecision(
            event_id=stored.event_id,
            agent_id=stored.agent_id,
            verdict=stored.verdict,
            probability=stored.probability,
            reason=stored.reason,
            source=source,
            model=stored.model,
            point=point,
            asked_model=stored.source in _ASKED_SOURCES,
        )


def calls_on(store: CausalStore, day: str) -> int:
    """Model calls counted on UTC ``day`` over every cap scope (the dashboards' calls per day:
    the sweep records it each tick as ``clef_flash_calls_today``)."""
    # In a transaction, for the store's lock: the process's threads share its connection, and
    # a bare read between another thread's BEGIN and COMMIT would count its uncommitted call.
    with store.transaction() as connection:
        row = connection.execute(
            "SELECT COALESCE(SUM(calls), 0) FROM clef_flash_calls WHERE day = ?", (day,)
        ).fetchone()
    return int(row[0])


def _prompt(event: Event, agent_id: str, agent_resources: Sequence[str]) -> str:
    # JSON, not prose: the resources are paths that may contain anything, and JSON quoting
    # keeps them from reading as instructions.
    return json.dumps(
        {
            "event": {
                "type": event.event_type,
                "resource": event.resource,
                "actor": event.actor,
                "change_id": event.change_id,
                "task_id": event.task_id,
                "payload": event.payload.model_dump(mode="json"),
            },
            "agent": {"agent_id": agent_id, "resources": list(agent_resources)},
            "question": "Should this agent wake up because of this event?",
        },
        sort_keys=True,
    )


def _answer(message: Message) -> _WakeAnswer:
    # Select by block type, not position: a response may begin with a thinking block.
    for block in message.content:
        if block.type == "tool_use" and block.name == _TOOL_NAME:
            try:
                return _WakeAnswer.model_validate(block.input)
            except ValidationError as exc:
                errors = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}"
                    for e in exc.errors(include_url=False)
                )
                raise _NoToolAnswer(f"decide_wake input invalid ({errors})") from None
    raise _NoToolAnswer(
        f"no {_TOOL_NAME} tool call in the response (stop_reason={message.stop_reason!r})"
    )
