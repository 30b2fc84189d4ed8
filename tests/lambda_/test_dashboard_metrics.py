"""The CloudWatch dashboard and alarms of template.yaml watch metrics the functions emit.

A CloudWatch metric is its namespace, its name and exactly its set of dimension names: a
graph or an alarm that names one dimension more or fewer than the code emits watches a
metric nobody writes, stays empty, and says nothing. So template.yaml is read with the local
invoker's loader (:func:`rhumbatron_dev.local.invoke.load_template`), and every metric the
dashboard body and the alarms name — in explicit metric rows, SEARCH expressions, Metrics
Insights queries and single-metric alarms — is collected with its dimension names. Then the
functions run as Lambda runs them (their ``app.py``, the template's environment with
``RHUMBATRON_METRICS_EMF`` on, a real nats-server) through a short life of a deployment: a
Clef-flash call, a provision on the integration queue, a letter on the dead-letter queue,
project events the publisher may not send (their stream is not among its producer
bindings), a router nudge that projects an Event, then a sweep tick. The CloudWatch EMF
lines they print are parsed, and every named metric must be among them with exactly its
dimension names. (The alarms on the services' own metrics — AWS/Lambda, AWS/States … — are
Lambda's and Step Functions' to emit; tests/lambda_/test_template_hardening.py checks every
alarm's topic and runbook.)
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from project_roots import ensure_project_roots
from rhumbatron.causal.clef_flash import ClefFlash
from rhumbatron.causal.store import CausalStore
from rhumbatron.core.clock import SystemClock, utc_day
from rhumbatron.core.settings import load_settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.messaging.commands import LAST_ERROR_HEADER, ORIGIN_QUEUE_HEADER
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.metrics import (
    CAPACITY_USED_METRIC,
    CLEF_FLASH_CALLS_TODAY_METRIC,
    COMMANDS_HANDLED_METRIC,
    DEAD_LETTERS_OPEN_METRIC,
    LOG_GAP_METRIC,
    PUBLISH_ERRORS_METRIC,
    SWEEP_HEARTBEAT_METRIC,
)
from rhumbatron.protocol.envelopes import Command, Event
from rhumbatron.protocol.ids import (
    EVENT_STREAM_COUNT,
    event_stream_name,
    event_stream_subject,
    stream_index,
)
from rhumbatron.protocol.queue_consumers import DEAD_LETTER_QUEUE
from rhumbatron.router.freshness import EVENT_FRESHNESS_METRIC
from rhumbatron.runtime import process
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.invoke import Template, load_template
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import ROOT, FakeLambdaContext, load_app, sample_event

pytestmark = pytest.mark.integration

TEMPLATE = ROOT / "template.yaml"
NAMESPACE = "Rhumbatron"
#: Added by the EMF sink to every line (rhumbatron.metrics.emf.EmfSink).
SINK_DIMENSIONS = {"binding": "METRICS", "service": "rhumbatron"}
#: The stream the publisher is not bound to: the project events on it fail at once.
UNBOUND_STREAM = 7
#: The stream a router nudge reads (not the sweep's).
NUDGED_STREAM = 3
#: A queue function's whole time (Timeout 900 in template.yaml).
FULL_TIME_MS = 900_000
#: An ordinary tick (no maintenance, no release sweep).
SWEEP_AT = "2026-01-01T10:01:00Z"
#: The stream the tick at SWEEP_AT sweeps (minute of the day 601 mod 8): one of its events is
#: lost from the log, so the tick's check of the replicas records a gap.
SWEPT_STREAM = 1
CALLER = Caller(tenant_id="acme", actor="agent:test", correlation_id="corr-1")


# -- what the template names -------------------------------------------------------------------


@dataclass(frozen=True)
class NamedMetric:
    """One metric a dashboard widget or an alarm names, and where."""

    namespace: str
    name: str
    dimensions: frozenset[str]
    #: Dimension values the template fixes (explicit rows and single-metric alarms).
    values: tuple[tuple[str, str], ...]
    where: str


_SEARCH = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\"', '(\w+)', (\d+)\)")
_INSIGHTS = re.compile(r"SELECT (MAX|MIN|SUM|AVG|COUNT)\((\w+)\) FROM SCHEMA\(([^)]*)\)")
_SUB = re.compile(r"\$\{([^}]*)\}")


def _resolve_sub(template: Template, text: str) -> str:
    """A ``!Sub`` string with every variable replaced: parameters by their Default,
    resources by their logical ID (``X.Arn`` by ``arn:X``), ``${!x}`` by ``${x}``."""
    parameters = template.document.get("Parameters") or {}
    pseudo = {"AWS::Region": "eu-west-1", "AWS::StackName": "rhumbatron"}

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("!"):
            return "${" + name[1:] + "}"
        if name in pseudo:
            return pseudo[name]
        if name in parameters:
            return str(parameters[name]["Default"])
        resource, _, attribute = name.partition(".")
        assert resource in template.resources, f"!Sub names {name!r}, which is not in the stack"
        return f"arn:{resource}" if attribute == "Arn" else resource

    return _SUB.sub(value, text)


def _dashboard(template: Template) -> dict[str, Any]:
    (dashboard,) = (
        r for r in template.resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"
    )
    body: dict[str, Any] = json.loads(
        _resolve_sub(template, dashboard["Properties"]["DashboardBody"]["Fn::Sub"])
    )
    return body


def _schema(text: str) -> tuple[str, frozenset[str]]:
    """``Namespace, dim, dim`` of a SEARCH schema or a Metrics Insights SCHEMA()."""
    namespace, *dimensions = (part.strip().strip('"') for part in text.split(","))
    return namespace, frozenset(dimensions)


def _row_metric(row: list[Any], where: str) -> NamedMetric:
    """An explicit metric row: namespace, name, dimension name/value pairs, options."""
    fields = [item for item in row if not isinstance(item, dict)]
    assert "." not in fields and ".." not in fields, (
        f"{where}: spell the metric row out ({row}); the '.' shorthand hides its dimensions"
    )
    namespace, name, *pairs = fields
    assert len(pairs) % 2 == 0, f"{where}: dimension names and values must pair up: {row}"
    values = tuple(zip(pairs[::2], pairs[1::2], strict=True))
    return NamedMetric(namespace, name, frozenset(pairs[::2]), values, where)


def dashboard_metrics(template: Template) -> list[NamedMetric]:
    """Every metric the dashboard's metric widgets name."""
    named = []
    for widget in _dashboard(template)["widgets"]:
        if widget["type"] != "metric":
            continue
        where = f"dashboard widget {widget['properties']['title']!r}"
        for row in widget["properties"]["metrics"]:
            expression = row[0].get("expression") if isinstance(row[0], dict) else None
            if expression is None:
                named.append(_row_metric(row, where))
                continue
            search = _SEARCH.fullmatch(expression)
            assert search, f"{where}: teach this test to read {expression!r}"
            namespace, dimensions = _schema(search.group(1))
            named.append(NamedMetric(namespace, search.group(2), dimensions, (), where))
    return named


def _alarms(template: Template) -> dict[str, Mapping[str, Any]]:
    return {
        logical_id: resource["Properties"]
        for logical_id, resource in template.resources.items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }


def _stat_metric(metric: Mapping[str, Any], where: str) -> NamedMetric:
    """An alarm's own metric, or a MetricStat's: Namespace, MetricName, Dimensions."""
    values = tuple((item["Name"], item["Value"]) for item in metric.get("Dimensions", []))
    dimensions = frozenset(name for name, _ in values)
    return NamedMetric(metric["Namespace"], metric["MetricName"], dimensions, values, where)


def alarm_metrics(template: Template) -> list[NamedMetric]:
    """Every metric an alarm watches: its own, its MetricStats', its Insights queries'."""
    named = []
    for logical_id, props in _alarms(template).items():
        where = f"alarm {logical_id}"
        if "MetricName" in props:
            named.append(_stat_metric(props, where))
            continue
        for query in props["Metrics"]:
            if "MetricStat" in query:
                named.append(_stat_metric(query["MetricStat"]["Metric"], where))
            elif query["Expression"].startswith("SELECT"):
                insights = _INSIGHTS.fullmatch(query["Expression"])
                assert insights, f"{where}: teach this test to read {query['Expression']!r}"
                namespace, dimensions = _schema(insights.group(3))
                named.append(NamedMetric(namespace, insights.group(2), dimensions, (), where))
    return named


# -- what the functions emit -------------------------------------------------------------------


@dataclass(frozen=True)
class Emitted:
    """The EMF lines the functions printed, and the summaries they returned."""

    documents: list[dict[str, Any]]
    summaries: dict[str, dict[str, Any]]
    #: The Clef-flash calls the run made on the UTC day the sweep counted.
    clef_flash_calls: int

    def series(self) -> dict[tuple[str, str, frozenset[str]], list[dict[str, Any]]]:
        """Every emitted (namespace, metric, dimension names), with the lines that carry it."""
        found: dict[tuple[str, str, frozenset[str]], list[dict[str, Any]]] = {}
        for document in self.documents:
            for directive in document["_aws"]["CloudWatchMetrics"]:
                for dimension_set in directive["Dimensions"]:
                    for metric in directive["Metrics"]:
                        key = (directive["Namespace"], metric["Name"], frozenset(dimension_set))
                        found.setdefault(key, []).append(document)
        return found

    def values(self, name: str, **dimensions: str) -> list[float]:
        """Every value of ``name`` printed on a line with these dimension values."""
        return [
            value
            for document in self.documents
            if name in document and all(document.get(k) == v for k, v in dimensions.items())
            for value in document[name]
        ]


def _emf_documents(stdout: str) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in stdout.splitlines()
        if line.startswith("{") and '"_aws"' in line
    ]


def _project_on_stream(index: int) -> str:
    while True:
        project_id = f"proj-{uuid.uuid4().hex[:8]}"
        if stream_index(project_id) == index:
            return project_id


def _command(command_type: str, payload: dict[str, Any], project_id: str) -> Command:
    return Command.create(
        command_id=f"cmd_{uuid.uuid4().hex}",
        command_type=command_type,
        project_id=project_id,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        payload=payload,
    )


def _messages_api(request: httpx2.Request) -> httpx2.Response:
    """The Anthropic Messages API answering with the forced decide_wake tool call."""
    model = json.loads(request.content)["model"]
    tool_use = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "decide_wake",
        "input": {"decision": "wake", "probability": 0.9, "reason": "overlap"},
    }
    return httpx2.Response(
        200,
        json={
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [tool_use],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 20},
        },
    )


def _prefix_event() -> Event:
    """An intent.declared that overlaps an agent's ``src/auth/login.py`` by prefix only."""
    return Event.parse(
        {
            "eventId": f"evt_{uuid.uuid4().hex}",
            "eventType": "intent.declared",
            "eventVersion": 1,
            "tenantId": "acme",
            "projectId": "acme-web",
            "changeId": "chg-1",
            "taskId": "tsk-2",
            "actor": "agent:other",
            "resource": "src/auth/",
            "correlationId": "corr-1",
            "timestamp": "2026-01-01T00:00:00Z",
            "payload": {"intentId": "i-1", "agentId": "other", "paths": ["src/auth/"]},
        }
    )


def _ask_clef_flash(state_dir: Path) -> None:
    """One Clef-flash model call, counted in the causal store the sweep reads."""
    settings = load_settings(
        state_dir=state_dir,
        nats_url="nats://127.0.0.1:1",
        clef_flash_api_key="sk-ant-test",
        anthropic_base_url="https://anthropic.test",
    )
    store = CausalStore(settings)
    http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(_messages_api))
    clef = ClefFlash(settings, store, SystemClock(), http_client=http_client)

    async def ask() -> None:
        try:
            decision = await clef.decide(_prefix_event(), "agent-1", ("src/auth/login.py",))
            assert decision.source == "model"
        finally:
            await clef.close()

    try:
        asyncio.run(ask())
    finally:
        store.close()


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emitted]:
    """One short life of a deployment, every role run through its function's ``app.py``."""
    root = tmp_path_factory.mktemp("dashboard")
    server = NatsServerProcess(store_dir=root / "nats")
    server.start()
    unbound = _project_on_stream(UNBOUND_STREAM)
    provisioned = _project_on_stream(UNBOUND_STREAM)
    nudged = _project_on_stream(NUDGED_STREAM)
    bound = [index for index in range(EVENT_STREAM_COUNT) if index != UNBOUND_STREAM]
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "RHUMBATRON_STATE_DIR": str(root / "state"),
            "RHUMBATRON_JOURNAL_MODE": "DELETE",
            "RHUMBATRON_NETWORK_FILESYSTEM": "true",
            "RHUMBATRON_NATS_URL": server.url,
            "RHUMBATRON_NATS_MONITOR_URLS": f"http://127.0.0.1:{server.http_port}",
            "RHUMBATRON_METRICS_EMF": "true",
            "RHUMBATRON_ARCHIVE_EXPIRY_PASS": "false",
            "RHUMBATRON_EVIDENCE_BUCKET": "evidence-unused",
            "RHUMBATRON_PRODUCER_BINDINGS": json.dumps(bound),
            "POWERTOOLS_SERVICE_NAME": "dashboard-test",
        }.items():
            env.setenv(name, value)
        settings = load_settings()
        process.reset_for_tests()
        try:
            # GIVEN a Clef-flash call, a provision waiting on integration, a command that
            # failed on integration waiting on the dead-letter queue, a project's event on
            # the stream the publisher is not bound to, and an Event waiting on the stream
            # the router will be nudged for
            day_before = utc_day(datetime.now(UTC))
            _ask_clef_flash(settings.state_dir)
            app = bootstrap(settings)

            async def arrange() -> None:
                await app.ensure_streams()
                bus = await app.command_bus()
                provision = {"name": "Acme web", "tenantId": "acme"}
                await bus.send("integration", _command("project.provision", provision, provisioned))
                failed = _command("change.settle", {"reason": "task_failed"}, unbound)
                headers = {ORIGIN_QUEUE_HEADER: "integration", LAST_ERROR_HEADER: "boom"}
                await bus.send(DEAD_LETTER_QUEUE, failed, headers=headers)
                app.project_root(unbound).create_project(CALLER, name="Unbound")
                woke = FactContext(CALLER, nudged, datetime.now(UTC)).fact(
                    "agent.woke", {"agentId": "agent-1"}, change_id="chg-1"
                )
                ensure_project_roots(app, [woke])
                js = (await app.nats()).jetstream()
                await js.publish(
                    event_stream_subject(NUDGED_STREAM),
                    woke.to_json(),
                    headers={"Nats-Msg-Id": woke.event_id},
                )
                # ... and three events on the swept stream, the middle one then lost
                swept = _project_on_stream(SWEPT_STREAM)
                facts = [
                    FactContext(CALLER, swept, datetime.now(UTC)).fact(
                        "agent.woke", {"agentId": f"agent-{n}"}, change_id="chg-1", key=f"w-{n}"
                    )
                    for n in range(3)
                ]
                ensure_project_roots(app, facts)
                for fact in facts:
                    ack = await js.publish(
                        event_stream_subject(SWEPT_STREAM),
                        fact.to_json(),
                        headers={"Nats-Msg-Id": fact.event_id},
                    )
                await js.delete_msg(event_stream_name(SWEPT_STREAM), ack.seq - 1)
                await app.close()

            asyncio.run(arrange())

            # WHEN the integration, outbox publisher, router nudge and sweep functions run
            summaries: dict[str, dict[str, Any]] = {}
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                summaries["integration"] = load_app("integration").lambda_handler(
                    sample_event("integration_schedule.json"), FakeLambdaContext(FULL_TIME_MS)
                )
                summaries["publisher"] = load_app("outbox_publisher").lambda_handler(
                    sample_event("outbox_publisher_schedule.json"), FakeLambdaContext()
                )
                summaries["nudge"] = load_app("router_nudge").lambda_handler(
                    {"streamIndex": NUDGED_STREAM}, FakeLambdaContext()
                )
                tick = {**sample_event("sweep_schedule.json"), "scheduledTime": SWEEP_AT}
                summaries["sweep"] = load_app("sweep").lambda_handler(tick, FakeLambdaContext())
            # The sweep counts the calls of the UTC day it runs in: a run across midnight
            # (rare) made its call on the day before.
            calls = 1 if utc_day(datetime.now(UTC)) == day_before else 0
            yield Emitted(_emf_documents(printed.getvalue()), summaries, calls)
        finally:
            process.reset_for_tests()
            server.stop()


# -- the tests ---------------------------------------------------------------------------------


def test_every_metric_the_dashboard_names_is_one_the_functions_emit(
    emitted: Emitted,
) -> None:
    # GIVEN the dashboard's metrics of our namespace (AWS/Lambda's are Lambda's own)
    named = [m for m in dashboard_metrics(load_template(TEMPLATE)) if m.namespace != "AWS/Lambda"]
    assert named

    # WHEN they are looked up among what the functions printed
    series = emitted.series()

    # THEN each was printed with exactly its dimension names, and the values the dashboard
    # fixes are the ones printed
    for metric in named:
        key = (metric.namespace, metric.name, metric.dimensions)
        assert key in series, (
            f"{metric.where} names {metric.name} with dimensions {sorted(metric.dimensions)}, "
            f"which no function emits; emitted: "
            f"{sorted(sorted(k[2]) for k in series if k[1] == metric.name)}"
        )
        for name, value in metric.values:
            assert {doc[name] for doc in series[key]} == {value}, (metric.where, name)


def test_every_metric_an_alarm_watches_is_one_the_functions_emit(emitted: Emitted) -> None:
    # GIVEN the alarms' metrics of our namespace (AWS/Lambda's, AWS/States' … are the
    # services' own)
    every = alarm_metrics(load_template(TEMPLATE))
    assert {m.where for m in every} == {f"alarm {a}" for a in _alarms(load_template(TEMPLATE))}
    named = [m for m in every if m.namespace == NAMESPACE]
    assert named

    # WHEN they are looked up among what the functions printed
    series = emitted.series()

    # THEN each was printed with exactly its dimension names and fixed values
    for metric in named:
        key = (metric.namespace, metric.name, metric.dimensions)
        assert key in series, (
            f"{metric.where} watches {metric.name} with dimensions "
            f"{sorted(metric.dimensions)}, which no function emits"
        )
        for name, value in metric.values:
            assert {doc[name] for doc in series[key]} == {value}, (metric.where, name)


def test_the_emitted_metrics_count_what_happened(emitted: Emitted) -> None:
    # GIVEN the run above: one provision handled, one letter drained into dead_letters, the
    # unbound project's rows failed, one Clef-flash call, one sweep tick
    failed_rows = emitted.summaries["publisher"]["totals"]["failed"]
    assert failed_rows >= 2  # the unbound project's and the provisioned one's project.created

    # THEN commands per queue: the provision on integration, the letter on dead-letter
    assert emitted.values(COMMANDS_HANDLED_METRIC, queue="integration", outcome="done") == [1.0]
    assert emitted.values(COMMANDS_HANDLED_METRIC, queue=DEAD_LETTER_QUEUE, outcome="done") == [1.0]
    # AND publish errors: the rows the publisher gave up, as the outbox backlog then shows
    assert emitted.values(PUBLISH_ERRORS_METRIC, kind="rows_failed") == [float(failed_rows)]
    assert emitted.values("outbox_failed") == [float(failed_rows)]
    # AND open dead letters per queue and kind: the one letter, and a zero for every other
    # pair that can have letters
    assert emitted.values(DEAD_LETTERS_OPEN_METRIC, queue="integration", kind="command") == [1.0]
    for subscription in Subscription:
        assert emitted.values(
            DEAD_LETTERS_OPEN_METRIC, queue=subscription.value, kind="poison_event"
        ) == [0.0]
    assert emitted.summaries["sweep"]["dead_letters_open"] == 1
    # AND the day's Clef-flash calls, and one heartbeat for the one tick
    calls = float(emitted.clef_flash_calls)
    assert emitted.values(CLEF_FLASH_CALLS_TODAY_METRIC) == [calls]
    assert emitted.values(SWEEP_HEARTBEAT_METRIC) == [1.0]
    # AND the one event lost from the swept stream's only replica
    assert emitted.values(LOG_GAP_METRIC) == [1.0]
    # AND the capacity check of the process's first tick: the share of the tightest ceiling
    #   the streams' measured rate uses, as `rhumbatron capacity` would compute it
    (used,) = emitted.values(CAPACITY_USED_METRIC)
    assert used >= 0.0
    # AND the freshness of the one batch the nudge projected, for its stream
    (freshness,) = emitted.values(EVENT_FRESHNESS_METRIC, stream=event_stream_name(NUDGED_STREAM))
    assert 0.0 <= freshness < 60.0
    assert emitted.summaries["nudge"]["totals"]["applied"] >= 1
    # AND the lag of every consumer
    assert len(emitted.values("consumer_num_pending")) == EVENT_STREAM_COUNT * len(Subscription)


def test_every_function_that_records_a_watched_metric_prints_it_as_emf() -> None:
    # GIVEN the functions that record what the dashboard and the alarms watch: the sweep
    # (lag, backlog, letters, Clef-flash calls, heartbeat), the publisher (publish errors)
    # and the queue functions (commands per queue)
    template = load_template(TEMPLATE)
    recording = {
        "SweepFunction",
        "OutboxPublisherFunction",
        "AgentWakeupsFunction",
        "IntegrationFunction",
        "IndexingFunction",
        "DeadLetterFunction",
    }
    # THEN each prints its points as EMF lines: without them CloudWatch never sees one
    for logical_id in recording:
        environment = template.function(logical_id).environment
        assert environment.get("RHUMBATRON_METRICS_EMF") == "true", logical_id


def test_the_dashboard_shows_errors_throttles_and_duration_of_every_function() -> None:
    # GIVEN the template's functions and the dashboard's Lambda metrics
    template = load_template(TEMPLATE)
    lambda_rows = [m for m in dashboard_metrics(template) if m.namespace == "AWS/Lambda"]
    # THEN each of Errors, Throttles and Duration is shown for every function, by name
    for name in ("Errors", "Throttles", "Duration"):
        shown = {dict(m.values)["FunctionName"] for m in lambda_rows if m.name == name}
        assert shown == set(template.function_ids()), name
    assert all(m.dimensions == {"FunctionName"} for m in lambda_rows)


def test_the_alarms_fire_as_their_runbooks_say() -> None:
    # GIVEN the six alarms on the functions' own metrics
    template = load_template(TEMPLATE)
    alarms = _alarms(template)
    ours = {a for a, props in alarms.items() if props.get("Namespace") == NAMESPACE}
    ours |= {a for a, props in alarms.items() if "Metrics" in props}
    assert ours == {
        "DeadLettersOpenAlarm",
        "ConsumerLagAlarm",
        "OutboxFailedRowsAlarm",
        "LogGapAlarm",
        "CapacityAlarm",
        "SweepHeartbeatAlarm",
    }
    # THEN the capacity alarm fires at the warnings' 80 % of a ceiling, on the hourly point
    capacity = alarms["CapacityAlarm"]
    assert (
        capacity["ComparisonOperator"],
        capacity["Threshold"],
        capacity["Period"],
        capacity["TreatMissingData"],
    ) == ("GreaterThanOrEqualToThreshold", 80, 3600, "notBreaching")
    # THEN lag above its threshold for 5 one-minute periods
    lag = alarms["ConsumerLagAlarm"]
    assert lag["Threshold"] == {"Ref": "ConsumerLagAlarmThreshold"}
    assert (lag["Metrics"][0]["Period"], lag["EvaluationPeriods"], lag["DatapointsToAlarm"]) == (
        60,
        5,
        5,
    )
    # AND a heartbeat missing for 5 minutes is a breach, not an absence of news
    heartbeat = alarms["SweepHeartbeatAlarm"]
    assert heartbeat["TreatMissingData"] == "breaching"
    assert (heartbeat["Statistic"], heartbeat["ComparisonOperator"], heartbeat["Threshold"]) == (
        "SampleCount",
        "LessThanThreshold",
        1,
    )
    assert heartbeat["Period"] * heartbeat["EvaluationPeriods"] == 300
    # AND any failed outbox row, any event a replica lost, and open letters at the
    # threshold, fire; a minute without a gap point is no gap
    assert alarms["OutboxFailedRowsAlarm"]["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    gap = alarms["LogGapAlarm"]
    assert (gap["ComparisonOperator"], gap["Threshold"], gap["TreatMissingData"]) == (
        "GreaterThanOrEqualToThreshold",
        1,
        "notBreaching",
    )
    assert alarms["DeadLettersOpenAlarm"]["Threshold"] == {"Ref": "DeadLetterAlarmThreshold"}
    # (Every alarm's topic and runbook: tests/lambda_/test_template_hardening.py.)
