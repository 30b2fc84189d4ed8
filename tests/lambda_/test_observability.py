"""Powertools end to end in the functions: every handler traced, tracing built only where it
is on, and the package's log lines as the function's JSON with the Lambda context and the
correlation ID (:mod:`rhumbatron.entrypoints.observability`)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Tracer

from rhumbatron.core.log_context import correlated
from rhumbatron.entrypoints.observability import (
    TRACED_MODULES,
    LazyTracer,
    lambda_tracer,
    route_package_logs,
)

from .support import FUNCTIONS, FakeLambdaContext, load_app

ROLES = sorted(p.parent.name for p in FUNCTIONS.glob("*/app.py"))


@pytest.mark.parametrize("role", ROLES)
def test_every_function_handler_is_wrapped_by_its_tracer(role: str) -> None:
    # GIVEN a function's handler module, loaded as Lambda loads it
    module = load_app(role)
    # WHEN its handler is inspected
    # THEN it is the one its LazyTracer's capture_lambda_handler returned
    assert isinstance(module.tracer, LazyTracer)
    assert getattr(module.lambda_handler, "traced_by", None) is module.tracer
    # AND no X-Ray SDK was built to load it
    assert not module.tracer.built


@dataclass
class _Subsegment:
    annotations: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def put_annotation(self, key: str, value: Any) -> None:
        self.annotations[key] = value

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        self.metadata[key] = value


@dataclass
class _Provider:
    """An X-Ray provider that keeps its subsegments (Powertools' ``provider=`` option)."""

    opened: list[tuple[str, _Subsegment]] = field(default_factory=list)

    @contextmanager
    def in_subsegment(self, name: str, **_: Any) -> Iterator[_Subsegment]:
        subsegment = _Subsegment()
        self.opened.append((name, subsegment))
        yield subsegment

    patched: list[tuple[str, ...]] = field(default_factory=list)

    def patch(self, modules: Any) -> None:
        self.patched.append(tuple(modules))

    def patch_all(self) -> None:
        self.patched.append(("<all>",))


@pytest.fixture
def provider() -> Iterator[_Provider]:
    provider = _Provider()
    yield provider
    Tracer._reset_config()  # Powertools keeps a Tracer's options class-wide


def test_a_handler_is_traced_in_lambda_and_runs_bare_elsewhere(
    provider: _Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a handler wrapped by a lazy tracer
    tracer = LazyTracer(provider=provider, auto_patch=False, service="test")

    @tracer.capture_lambda_handler
    def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"echo": event["n"]}

    # WHEN it runs off Lambda, and in Lambda with tracing disabled
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    assert lambda_handler({"n": 1}, FakeLambdaContext()) == {"echo": 1}
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    assert lambda_handler({"n": 2}, FakeLambdaContext()) == {"echo": 2}
    # THEN no tracer was built and nothing was traced
    assert not tracer.built
    assert provider.opened == []

    # WHEN it runs in Lambda with tracing on
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED")
    assert lambda_handler({"n": 3}, FakeLambdaContext()) == {"echo": 3}
    # THEN the invocation is one "## lambda_handler" subsegment with its cold start, and
    #   not its response (an API answer can hold a secret shown once)
    ((name, subsegment),) = provider.opened
    assert name == "## lambda_handler"
    assert subsegment.annotations == {"ColdStart": True, "Service": "test"}
    assert subsegment.metadata == {}


def test_a_functions_tracer_instruments_the_aws_calls_and_never_sqlite(
    provider: _Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a function's tracer as app.py builds it, in Lambda with tracing on
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED", raising=False)
    tracer = lambda_tracer(provider=provider, service="test")
    # WHEN it is built
    tracer.tracer()
    # THEN it patched botocore only: SQLite statements stay uninstrumented (a subsegment per
    #   statement costs about 100 times the statement on every hot path)
    assert provider.patched == [TRACED_MODULES] == [("botocore",)]


@pytest.fixture
def package_logger() -> Iterator[logging.Logger]:
    """The ``rhumbatron`` logger, restored after the test (routing it changes it for the
    process, as it would for a Lambda container)."""
    package = logging.getLogger("rhumbatron")
    saved = (list(package.handlers), package.propagate, package.level)
    yield package
    package.handlers[:], package.propagate = saved[0], saved[1]
    package.setLevel(saved[2])


def test_a_package_log_line_is_the_functions_json_with_the_context_and_correlation_id(
    package_logger: logging.Logger,
) -> None:
    # GIVEN a function's logger, routed to the package's loggers as in Lambda
    stream = io.StringIO()
    logger = Logger(service="obs-test", logger_handler=logging.StreamHandler(stream))
    route_package_logs(logger)
    deep = logging.getLogger("rhumbatron.router.somewhere_deep")  # created after the routing
    context = FakeLambdaContext(function_name="SweepFunction")

    @logger.inject_lambda_context
    def lambda_handler(event: dict[str, Any], context: Any) -> None:
        with correlated("corr-42"):
            deep.warning("record %s will retry", "evt-1")
        deep.info("between records")

    # WHEN the handler runs, and a deep module logs while an event is worked on and after
    lambda_handler({}, context)

    # THEN each line is one JSON document with the Lambda context and the module's name
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    for line in (first, second):
        assert line["function_name"] == "SweepFunction"
        assert line["function_request_id"] == context.aws_request_id
        assert line["service"] == "obs-test"
        assert line["name"] == "rhumbatron.router.somewhere_deep"
    assert (first["level"], first["message"]) == ("WARNING", "record evt-1 will retry")
    # AND the correlation ID of the event in hand, only while it is in hand
    assert first["correlation_id"] == "corr-42"
    assert second.get("correlation_id") is None
