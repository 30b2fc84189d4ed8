"""Clef-flash through the real ``anthropic`` SDK, answered by an httpx2 transport.

The SDK (anthropic>=2) talks through ``httpx2``; the transport below answers like the
Messages API (a ``message`` with a ``tool_use`` block, or an error body) and keeps every
request it received, so the tests can read what really went over the wire.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from rhumbatron.causal.clef_flash import (
    _SYSTEM_PROMPT,
    DECIDE_WAKE_TOOL,
    DEPLOYMENT_SCOPE,
    MODEL_ROUTE_METRIC,
    ClefFlash,
    ClefFlashDecision,
    calls_on,
)
from rhumbatron.causal.store import CausalStore, StoredDecision
from rhumbatron.core.clock import ManualClock, utc_day
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.metrics import MetricBinding, MetricsRecorder, RecordingSink, recent_points
from rhumbatron.product.database import ProductDatabase
from rhumbatron.protocol.envelopes import Event
from rhumbatron.runtime.product_schema import open_product_database

AGENT_RESOURCES = ("src/auth/login.py",)


def resource_event(n: int = 1, *, tenant: str = "acme", resource: str = "src/auth/") -> Event:
    """An intent.declared Event whose resource overlaps AGENT_RESOURCES by prefix only."""
    return Event.parse(
        {
            "eventId": f"evt_{n:032x}",
            "eventType": "intent.declared",
            "eventVersion": 1,
            "tenantId": tenant,
            "projectId": f"{tenant}-web",
            "changeId": "chg-1",
            "taskId": "tsk-2",
            "actor": "agent:other",
            "resource": resource,
            "correlationId": "corr-1",
            "timestamp": "2026-01-01T00:00:00Z",
            "payload": {"intentId": "i-1", "agentId": "other", "paths": [resource]},
        }
    )


def message_json(decision: str, probability: float, model: str) -> dict[str, Any]:
    """A Messages API response whose only content is the forced decide_wake tool call."""
    return {
        "id": "msg_01XyZ",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_01AbC",
                "name": "decide_wake",
                "input": {"decision": decision, "probability": probability, "reason": "r"},
            }
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 120, "output_tokens": 30},
    }


@dataclass
class FakeMessagesApi:
    """An httpx2 transport handler answering POST /v1/messages; records each request."""

    decision: str = "wake"
    probability: float = 0.9
    status: int = 200
    error_message: str = "Overloaded"
    raise_timeout: bool = False
    refuse: bool = False
    # When set, the response's content blocks instead of the one decide_wake call.
    content: list[dict[str, Any]] | None = None
    requests: list[httpx2.Request] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if self.raise_timeout:
            raise httpx2.ReadTimeout("read timed out", request=request)
        headers = {"request-id": f"req_{len(self.requests)}"}
        if self.status != 200:
            body = {"type": "error", "error": {"type": "api_error", "message": self.error_message}}
            return httpx2.Response(self.status, json=body, headers=headers)
        model = json.loads(request.content)["model"]
        body = message_json(self.decision, self.probability, model)
        if self.refuse:
            body["content"], body["stop_reason"] = [], "refusal"
        if self.content is not None:
            body["content"] = self.content
        return httpx2.Response(200, json=body, headers=headers)

    def body(self, index: int = -1) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.requests[index].content)
        return parsed


@dataclass
class Harness:
    api: FakeMessagesApi
    clock: ManualClock
    store: CausalStore
    product: ProductDatabase
    sink: RecordingSink
    clef: ClefFlash

    def decisions_recorded(self) -> int:
        return len(self.store.decisions())


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Builds a ClefFlash on the real SDK and a fake API; settings overridable per test."""
    opened: list[Harness] = []

    def build(**overrides: Any) -> Harness:
        values: dict[str, Any] = {
            "state_dir": tmp_path / f"state{len(opened)}",
            "nats_url": "nats://127.0.0.1:1",
            "clef_flash_api_key": "sk-ant-test",
            "anthropic_base_url": "https://anthropic.test",
        }
        values.update(overrides)
        settings: Settings = load_settings(**values)
        api = FakeMessagesApi()
        clock = ManualClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
        store = CausalStore(settings)
        product = open_product_database(settings)
        sink = RecordingSink()
        recorder = MetricsRecorder(product.connection, sink, clock)
        http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(api))
        clef = ClefFlash(settings, store, clock, metrics=recorder, http_client=http_client)
        harness = Harness(api, clock, store, product, sink, clef)
        opened.append(harness)
        return harness

    yield build
    for harness in opened:
        harness.store.close()
        harness.product.close()


async def decide(
    h: Harness, event: Event | None = None, agent: str = "agent-1"
) -> ClefFlashDecision:
    return await h.clef.decide(event or resource_event(), agent, AGENT_RESOURCES)


# -- the model's answer ------------------------------------------------------------------------


async def test_model_says_wake_with_high_probability_wakes(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN the model answers wake with 0.9
    h = make_harness()
    h.api.decision, h.api.probability = "wake", 0.9
    # WHEN Clef-flash decides
    decision = await decide(h)
    # THEN the agent wakes on the model's word
    assert (decision.verdict, decision.source, decision.wakes) == ("wake", "model", True)
    assert decision.probability == 0.9
    assert len(h.api.requests) == 1


async def test_model_says_skip_with_high_probability_skips(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.9
    decision = await decide(h)
    assert (decision.verdict, decision.source, decision.wakes) == ("skip", "model", False)


async def test_skip_below_the_threshold_abstains_and_wakes(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN the model says skip but is only 0.69 sure
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.69
    decision = await decide(h)
    # THEN Clef-flash abstains, and an abstention wakes
    assert (decision.verdict, decision.source, decision.wakes) == (
        "abstain",
        "low_confidence",
        True,
    )
    assert decision.probability == 0.69


async def test_skip_at_exactly_the_threshold_does_not_abstain(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN the model says skip at exactly 0.7 (DECISIONS: exactly 0.7 does not abstain)
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.7
    decision = await decide(h)
    assert (decision.verdict, decision.wakes) == ("skip", False)


def test_threshold_and_cap_defaults_are_the_specs() -> None:
    settings = load_settings(state_dir=Path("/nonexistent"))
    assert settings.clef_flash_threshold == 0.7
    assert settings.clef_flash_max_calls_per_day == 200
    assert settings.clef_flash_cap_scope == "deployment"
    assert settings.clef_flash_api_key is None
    assert "haiku" in settings.clef_flash_model


# -- failures abstain, and so wake -------------------------------------------------------------


async def test_api_error_abstains_without_retrying(make_harness: Callable[..., Harness]) -> None:
    # GIVEN the API answers 500
    h = make_harness()
    h.api.status = 500
    decision = await decide(h)
    # THEN it abstains (wakes), after exactly one request: no retry storm
    assert (decision.verdict, decision.source, decision.wakes) == ("abstain", "error", True)
    assert "InternalServerError" in decision.reason
    assert len(h.api.requests) == 1


async def test_overloaded_529_abstains(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    h.api.status = 529
    decision = await decide(h)
    assert (decision.verdict, decision.source) == ("abstain", "error")
    assert len(h.api.requests) == 1


async def test_timeout_abstains(make_harness: Callable[..., Harness]) -> None:
    # GIVEN the transport times out reading the response
    h = make_harness()
    h.api.raise_timeout = True
    decision = await decide(h)
    # THEN the SDK's APITimeoutError becomes an abstention
    assert (decision.verdict, decision.source, decision.wakes) == ("abstain", "error", True)
    assert "Timeout" in decision.reason
    assert len(h.api.requests) == 1


async def test_answer_without_the_tool_abstains(make_harness: Callable[..., Harness]) -> None:
    # GIVEN a refusal: a message with no tool_use block
    h = make_harness()
    h.api.refuse = True
    decision = await decide(h)
    assert (decision.verdict, decision.source, decision.wakes) == ("abstain", "error", True)
    assert "refusal" in decision.reason


def tool_call(tool_input: object) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_01", "name": "decide_wake", "input": tool_input}


@pytest.mark.parametrize(
    ("tool_input", "problem"),
    [
        (
            {"decision": "wake", "probability": 2, "reason": "r"},
            "probability: Input should be less than or equal to 1",
        ),
        ("yes", "input: Input should be a valid dictionary or instance of _WakeAnswer"),
        (
            {"decision": "maybe"},
            "decision: Input should be 'wake' or 'skip'; probability: Field required",
        ),
    ],
)
async def test_a_tool_call_with_a_bad_input_abstains_naming_each_field(
    make_harness: Callable[..., Harness], tool_input: dict[str, object], problem: str
) -> None:
    # GIVEN the model calls decide_wake with an input outside its schema
    h = make_harness()
    h.api.content = [tool_call(tool_input)]
    decision = await decide(h)
    # THEN Clef-flash abstains (wakes) and says which fields were wrong
    assert (decision.verdict, decision.source) == ("abstain", "error")
    assert decision.reason == f"unusable answer: decide_wake input invalid ({problem})"


async def test_the_tool_call_is_found_after_other_blocks(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a response that says something before it calls the tool
    h = make_harness()
    h.api.content = [
        {"type": "text", "text": "Let me think."},
        tool_call({"decision": "skip", "probability": 0.95, "reason": "unrelated"}),
    ]
    decision = await decide(h)
    assert (decision.verdict, decision.source, decision.reason) == ("skip", "model", "unrelated")


async def test_the_question_is_the_event_and_the_agent_as_sorted_json(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a resource fact that overlaps an agent's resources by prefix
    h = make_harness()
    event = resource_event()
    # WHEN Clef-flash asks the model
    await decide(h, event)
    # THEN the request carries the system prompt and one user message: the event and the
    # agent as JSON with sorted keys (paths quoted, never prose), within the timeout
    body = h.api.body()
    assert body["system"] == _SYSTEM_PROMPT
    question = {
        "agent": {"agent_id": "agent-1", "resources": list(AGENT_RESOURCES)},
        "event": {
            "actor": "agent:other",
            "change_id": "chg-1",
            "payload": {
                "agent_id": "other",
                "intent_id": "i-1",
                "paths": ["src/auth/"],
                "summary": "",
            },
            "resource": "src/auth/",
            "task_id": "tsk-2",
            "type": "intent.declared",
        },
        "question": "Should this agent wake up because of this event?",
    }
    assert body["messages"] == [{"role": "user", "content": json.dumps(question, sort_keys=True)}]
    timeout = h.api.requests[-1].extensions["timeout"]
    assert timeout["read"] == h.store.settings.clef_flash_timeout_s


async def test_no_api_key_abstains_without_any_http_call(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN no API key is configured
    h = make_harness(clef_flash_api_key=None)
    decision = await decide(h)
    # THEN it abstains (wakes) and nothing went over the wire, nor was a call counted
    assert (decision.verdict, decision.source, decision.wakes) == ("abstain", "no_key", True)
    assert h.api.requests == []
    assert h.store.calls(utc_day(h.clock.now()), DEPLOYMENT_SCOPE) == 0


# -- the request ---------------------------------------------------------------------------


async def test_request_forces_the_decide_wake_tool_on_the_configured_model(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(clef_flash_model="claude-haiku-test-model", clef_flash_max_tokens=300)
    await decide(h)
    request = h.api.requests[0]
    body = h.api.body()
    assert request.method == "POST"
    assert request.url == "https://anthropic.test/v1/messages"
    # anthropic>=2 sends the API key as a bearer token
    assert request.headers["authorization"] == "Bearer sk-ant-test"
    assert "anthropic-version" in request.headers
    assert body["model"] == "claude-haiku-test-model"
    assert body["max_tokens"] == 300
    assert body["tool_choice"] == {"type": "tool", "name": "decide_wake"}
    assert body["tools"] == [DECIDE_WAKE_TOOL]
    schema = body["tools"][0]["input_schema"]
    assert schema["properties"]["decision"]["enum"] == ["wake", "skip"]
    assert schema["properties"]["probability"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert set(schema["required"]) == {"decision", "probability", "reason"}
    # the question carries both sides of the overlap
    prompt = json.loads(body["messages"][0]["content"])
    assert prompt["event"]["resource"] == "src/auth/"
    assert prompt["agent"]["resources"] == list(AGENT_RESOURCES)
    # no sampling parameters (current Haiku models reject non-default ones)
    assert not {"temperature", "top_p", "top_k"} & set(body)


# -- the daily cap -------------------------------------------------------------------------


async def test_past_the_daily_cap_wakes_without_a_call_until_the_next_utc_day(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a cap of 3 calls per UTC day and a model that would say skip
    h = make_harness(clef_flash_max_calls_per_day=3)
    h.api.decision = "skip"
    h.clock.set(datetime(2026, 3, 1, 23, 0, tzinfo=UTC))
    # WHEN five distinct events are asked about on the same day
    decisions = [await decide(h, resource_event(n)) for n in range(1, 6)]
    # THEN three asked the model and two woke without asking
    assert [d.source for d in decisions] == ["model"] * 3 + ["cap_reached"] * 2
    assert [d.wakes for d in decisions] == [False] * 3 + [True] * 2
    assert len(h.api.requests) == 3
    assert h.store.calls("2026-03-01", DEPLOYMENT_SCOPE) == 3
    # WHEN the clock crosses midnight UTC
    h.clock.set(datetime(2026, 3, 2, 0, 0, 1, tzinfo=UTC))
    after = await decide(h, resource_event(6))
    # THEN the new day counts again
    assert after.source == "model"
    assert len(h.api.requests) == 4
    assert h.store.calls("2026-03-02", DEPLOYMENT_SCOPE) == 1


async def test_default_cap_allows_200_calls_then_wakes_without_asking(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    day = utc_day(h.clock.now())
    # GIVEN 199 calls already counted today (by this or another router)
    for _ in range(199):
        assert h.store.reserve_call(day, DEPLOYMENT_SCOPE, 200)
    # WHEN two more questions come
    last_allowed = await decide(h, resource_event(1))
    over = await decide(h, resource_event(2))
    # THEN the 200th is asked and the 201st is not
    assert (last_allowed.source, over.source) == ("model", "cap_reached")
    assert len(h.api.requests) == 1
    assert h.store.calls(day, DEPLOYMENT_SCOPE) == 200


async def test_a_failed_call_still_counts_toward_the_cap(
    make_harness: Callable[..., Harness],
) -> None:
    # The call is counted before it is made: a timeout spends its reservation.
    h = make_harness(clef_flash_max_calls_per_day=1)
    h.api.raise_timeout = True
    first = await decide(h, resource_event(1))
    second = await decide(h, resource_event(2))
    assert (first.source, second.source) == ("error", "cap_reached")
    assert len(h.api.requests) == 1


async def test_tenant_scope_gives_each_tenant_its_own_cap(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN the cap scoped per tenant, 1 call each
    h = make_harness(clef_flash_max_calls_per_day=1, clef_flash_cap_scope="tenant")
    # WHEN acme asks twice and globex once
    a1 = await decide(h, resource_event(1, tenant="acme"))
    a2 = await decide(h, resource_event(2, tenant="acme"))
    g1 = await decide(h, resource_event(3, tenant="globex"))
    # THEN acme's second is capped but globex still gets its call
    assert (a1.source, a2.source, g1.source) == ("model", "cap_reached", "model")
    day = utc_day(h.clock.now())
    assert h.store.calls(day, "tenant:acme") == 1
    assert h.store.calls(day, "tenant:globex") == 1
    assert h.store.calls(day, DEPLOYMENT_SCOPE) == 0


async def test_the_calls_of_a_day_are_summed_over_every_scope(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN one call for acme and one for globex, each in its own tenant scope
    h = make_harness(clef_flash_max_calls_per_day=5, clef_flash_cap_scope="tenant")
    await decide(h, resource_event(1, tenant="acme"))
    await decide(h, resource_event(2, tenant="globex"))
    # THEN the sweep's calls-per-day gauge counts both, and nothing on another day
    today = utc_day(h.clock.now())
    assert calls_on(h.store, today) == 2
    assert calls_on(h.store, "2026-02-28") == 0


async def test_deployment_scope_shares_one_cap_across_tenants(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(clef_flash_max_calls_per_day=1)
    a1 = await decide(h, resource_event(1, tenant="acme"))
    g1 = await decide(h, resource_event(2, tenant="globex"))
    assert (a1.source, g1.source) == ("model", "cap_reached")


async def test_two_routers_on_one_file_share_the_cap(make_harness: Callable[..., Harness]) -> None:
    # GIVEN two ClefFlash instances with their own stores on the same causal.sqlite
    h = make_harness(clef_flash_max_calls_per_day=2)
    other_store = CausalStore(h.store.settings)
    other_http = httpx2.AsyncClient(transport=httpx2.MockTransport(h.api))
    other = ClefFlash(h.store.settings, other_store, h.clock, http_client=other_http)
    try:
        # WHEN both ask about different events
        results = [
            await h.clef.decide(resource_event(1), "agent-1", AGENT_RESOURCES),
            await other.decide(resource_event(2), "agent-1", AGENT_RESOURCES),
            await other.decide(resource_event(3), "agent-1", AGENT_RESOURCES),
            await h.clef.decide(resource_event(4), "agent-1", AGENT_RESOURCES),
        ]
    finally:
        await other.close()
        other_store.close()
    # THEN only two calls were made between them
    assert [r.source for r in results] == ["model", "model", "cap_reached", "cap_reached"]
    assert len(h.api.requests) == 2


async def test_two_routers_asking_one_question_at_once_both_act_on_the_first_recorded(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN two routers on one causal.sqlite whose models answer otherwise: this one's says
    # skip, the other's wake
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.9
    other_api = FakeMessagesApi(decision="wake", probability=0.95)
    other_store = CausalStore(h.store.settings)
    other = ClefFlash(
        h.store.settings,
        other_store,
        h.clock,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(other_api)),
    )
    event = resource_event(9)
    the_others: list[ClefFlashDecision] = []

    async def answer_once_the_other_recorded(request: httpx2.Request) -> httpx2.Response:
        # WHEN the other router asks and records the same question while this one's call
        # is on the wire
        the_others.append(await other.decide(event, "agent-1", AGENT_RESOURCES))
        return h.api(request)

    this = ClefFlash(
        h.store.settings,
        h.store,
        h.clock,
        http_client=httpx2.AsyncClient(
            transport=httpx2.MockTransport(answer_once_the_other_recorded)
        ),
    )
    try:
        mine = await this.decide(event, "agent-1", AGENT_RESOURCES)
    finally:
        await this.close()
        await other.close()
        other_store.close()
    # THEN both act on the decision recorded first, the other's, kept once; this router's
    # says it is not its own model's answer
    assert (the_others[0].verdict, the_others[0].source) == ("wake", "model")
    assert (mine.verdict, mine.probability, mine.source) == ("wake", 0.95, "cached")
    assert mine.wakes
    assert len(h.store.decisions()) == 1
    assert len(h.api.requests) == len(other_api.requests) == 1


# -- recorded decisions --------------------------------------------------------------------


async def test_replay_of_the_same_event_reuses_the_decision_without_a_call(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a decided (event, agent)
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.95
    event = resource_event(7)
    first = await decide(h, event)
    # WHEN the same event is replayed, and the model would now answer otherwise
    h.api.decision = "wake"
    again = await decide(h, event)
    # THEN the stored decision is reused, with no second call
    assert (again.verdict, again.probability, again.source) == ("skip", 0.95, "cached")
    assert first.verdict == again.verdict
    assert len(h.api.requests) == 1
    # and another agent on the same event is a question of its own
    other_agent = await decide(h, event, agent="agent-2")
    assert other_agent.source == "model"
    assert len(h.api.requests) == 2


async def test_replay_of_an_error_abstention_does_not_ask_again(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    h.api.status = 500
    await decide(h)
    h.api.status = 200
    again = await decide(h)
    assert (again.verdict, again.source) == ("abstain", "cached")
    assert len(h.api.requests) == 1


async def test_decisions_and_model_route_points_are_recorded(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN three questions: a wake, a low-confidence abstention and a replay
    h = make_harness()
    h.api.probability = 0.9
    await decide(h, resource_event(1))
    h.api.probability = 0.5
    await decide(h, resource_event(2))
    await decide(h, resource_event(2))  # replay
    # THEN two decisions are stored
    stored = {d.event_id: d for d in h.store.decisions()}
    assert h.decisions_recorded() == 2
    assert stored[resource_event(1).event_id].verdict == "wake"
    assert stored[resource_event(2).event_id].source == "low_confidence"
    assert stored[resource_event(2).event_id].tenant_id == "acme"
    # AND two model_route METRICS rows, one per decision (the replay adds none)
    points = recent_points(h.product.connection, MODEL_ROUTE_METRIC)
    assert len(points) == 2
    assert {p.binding for p in points} == {MetricBinding.METRICS}
    by_event = {p.event_id: p for p in points}
    key = f"{resource_event(2).event_id}#agent-1"
    assert by_event[key].dimensions["verdict"] == "abstain"
    assert by_event[key].dimensions["source"] == "low_confidence"
    assert by_event[key].dimensions["route"] == "clef_flash"
    assert by_event[key].project_id == "acme-web"
    assert len(h.sink.points(MetricBinding.METRICS)) == 2


async def test_decision_carries_its_point_without_a_recorder(
    make_harness: Callable[..., Harness],
) -> None:
    # A caller without a MetricsRecorder gets the point to record in its own transaction.
    h = make_harness()
    http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(h.api))
    bare = ClefFlash(h.store.settings, h.store, h.clock, http_client=http_client)
    decision = await bare.decide(resource_event(9), "agent-1", AGENT_RESOURCES)
    await bare.close()
    assert decision.point.name == MODEL_ROUTE_METRIC
    assert decision.point.dimensions["verdict"] == "wake"
    assert recent_points(h.product.connection, MODEL_ROUTE_METRIC) == []


async def test_ask_takes_the_rules_clef_question(make_harness: Callable[..., Harness]) -> None:
    # The router hands Clef-flash what the rules planned: a ClefQuestion(event, agent).
    from rhumbatron.causal.rules import ActiveAgent, ClefQuestion

    h = make_harness()
    agent = ActiveAgent("agent-3", "chg-1", "tsk-3", AGENT_RESOURCES)
    decision = await h.clef.ask(ClefQuestion(resource_event(11), agent))
    assert (decision.agent_id, decision.source) == ("agent-3", "model")
    assert json.loads(h.api.body()["messages"][0]["content"])["agent"]["agent_id"] == "agent-3"


async def test_asking_again_returns_the_stored_decision_with_its_one_metric_point(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a decision the model made for (event, agent-1)
    h = make_harness()
    h.api.decision, h.api.probability = "skip", 0.9
    event = resource_event()
    first = await decide(h, event)
    # WHEN the same question comes again (a redelivered event)
    again = await decide(h, event)
    # THEN nothing is asked, and the answer is the stored one, marked cached
    assert len(h.api.requests) == 1
    assert (again.verdict, again.source, again.reason) == ("skip", "cached", "r")
    assert (again.event_id, again.agent_id, again.model) == (event.event_id, "agent-1", first.model)
    # AND its metric point is the first one's: same dimensions, same idempotency key
    assert again.point.dimensions == {
        "route": "clef_flash",
        "verdict": "skip",
        "source": "model",
        "model": h.store.settings.clef_flash_model,
    }
    assert again.point.event_id == first.point.event_id == f"{event.event_id}#agent-1"
    assert again.point.project_id is None
    assert first.point.project_id == "acme-web"


async def test_waking_without_asking_says_why(make_harness: Callable[..., Harness]) -> None:
    no_key = await decide(make_harness(clef_flash_api_key=None))
    capped = make_harness(clef_flash_max_calls_per_day=0)
    at_cap = await decide(capped)
    assert (no_key.source, no_key.reason) == ("no_key", "no API key")
    assert (at_cap.source, at_cap.reason) == ("cap_reached", "daily Clef-flash cap reached")


async def test_the_decisions_of_one_event_are_read_back_whole(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN decisions about two events, one each
    h = make_harness()
    first, second = resource_event(1), resource_event(2)
    await decide(h, first)
    h.clock.advance(seconds=1)
    await decide(h, second)
    # WHEN one event's decisions are read
    (stored,) = h.store.decisions(first.event_id)
    # THEN only its decision comes back, with every field it was written with
    assert (stored.event_id, stored.agent_id, stored.verdict) == (first.event_id, "agent-1", "wake")
    assert (stored.source, stored.model, stored.tenant_id) == (
        "model",
        h.store.settings.clef_flash_model,
        "acme",
    )
    assert stored.decided_at_s == datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
    assert [d.event_id for d in h.store.decisions()] == [first.event_id, second.event_id]


async def test_a_question_about_an_expired_claim_sends_its_expiry_as_json(
    make_harness: Callable[..., Harness],
) -> None:
    # GIVEN a claim.expired fact: its payload holds a datetime
    h = make_harness()
    expired = Event.parse(
        {
            **json.loads(resource_event().to_json()),
            "eventType": "claim.expired",
            "payload": {"claimId": "k1", "agentId": "other", "expiredAt": "2026-01-01T00:05:00Z"},
        }
    )
    # WHEN Clef-flash asks about it
    decision = await decide(h, expired)
    # THEN the question went out, with the expiry written as JSON text
    assert decision.source == "model"
    question = json.loads(h.api.body()["messages"][0]["content"])
    assert question["event"]["payload"]["expired_at"] == "2026-01-01T00:05:00Z"


async def test_closing_twice_is_harmless(make_harness: Callable[..., Harness]) -> None:
    # GIVEN a Clef-flash that has asked the model (its SDK client is open)
    h = make_harness()
    await decide(h)
    # WHEN it is closed twice (a warm process shuts down after an earlier close)
    await h.clef.close()
    await h.clef.close()


async def test_a_decision_without_a_tenant_reads_back_without_one(
    make_harness: Callable[..., Harness],
) -> None:
    # A row written before decisions carried their tenant reads back as no tenant, not "None".
    h = make_harness()
    h.store.record_decision(
        StoredDecision("evt_" + "1" * 32, "agent-1", "wake", 0.9, "r", "model", "m", None, 1.0)
    )
    (stored,) = h.store.decisions()
    assert stored.tenant_id is None


async def test_each_wake_without_the_models_word_is_logged_as_a_warning_saying_why(
    make_harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN three questions: past the daily cap, an unusable answer, and an API failure
    event = resource_event()
    capped = make_harness(clef_flash_max_calls_per_day=0)
    unusable = make_harness()
    unusable.api.refuse = True
    failing = make_harness()
    failing.api.status = 529
    # WHEN each is decided
    with caplog.at_level(logging.WARNING, logger="rhumbatron.causal.clef_flash"):
        for h in (capped, unusable, failing):
            await decide(h, event)
    # THEN each wake is one WARNING naming the event and why, the operator's trail
    day = utc_day(capped.clock.now())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0] == (
        f"Clef-flash cap of 0 calls per UTC day reached for scope {DEPLOYMENT_SCOPE} on {day}: "
        f"waking agent agent-1 for event {event.event_id} without asking"
    )
    assert warnings[1] == (
        f"Clef-flash answer unusable for event {event.event_id}: no decide_wake tool call in "
        "the response (stop_reason='refusal')"
    )
    # The SDK's own text of the error sits between its type and our ending; its wording is
    # the SDK's (it changed in anthropic 2.17), so only its status and message are pinned.
    assert re.fullmatch(
        re.escape(f"Clef-flash call for event {event.event_id}, agent agent-1 failed (")
        + r"OverloadedError: [^\n]*529[^\n]*Overloaded[^\n]*"
        + re.escape("): abstaining, which wakes"),
        warnings[2],
    ), warnings[2]
    assert len(warnings) == 3


async def test_a_long_api_error_is_kept_as_its_first_500_characters(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    h.api.status, h.api.error_message = 500, "x" * 2_000
    decision = await decide(h)
    assert decision.source == "error"
    assert len(decision.reason) == 500
    assert re.match(r"InternalServerError: (Error code: )?500 x", decision.reason), decision.reason
