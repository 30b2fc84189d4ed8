"""Powertools' Logger and Tracer for ``functions/<role>/app.py``, wired to the package.

**Logs.** The package logs through the standard library (``logging.getLogger(__name__)`` in
every module): a library does not build Powertools loggers. :func:`lambda_logger` builds the
function's Powertools ``Logger`` and, in Lambda, hands its handler and JSON formatter to the
``rhumbatron`` logger (Powertools' ``copy_config_to_registered_loggers``), so every log line of
the package comes out as the same JSON document as the function's own, with the keys
``inject_lambda_context`` adds (``function_name``, ``function_request_id``, ``cold_start`` …)
and ``name``, the module that logged. The handler also gets the package's
:class:`~rhumbatron.core.log_context.CorrelationIdFilter`: a line logged while a command or an
event is worked on carries its ``correlation_id`` (the command's ID, the event's
``correlationId``), bound by the code that knows it, per task; other lines carry the one the
function's ``correlation_id_path`` took from the event, if any. Off Lambda (tests, the CLI,
``make demo``, ``rhumbatron invoke`` and ``sam local invoke``) the package's logs stay plain
text through the root logger.

**Traces.** :func:`lambda_tracer` is Powertools' ``Tracer``, built at the first invocation
and only where tracing is on: building one imports the X-Ray SDK and botocore (about 200 ms),
which would come out of every cold start's import budget (``tests/unit/test_import_hygiene``),
and off Lambda (``POWERTOOLS_TRACE_DISABLED``, no ``LAMBDA_TASK_ROOT``, or ``AWS_SAM_LOCAL``,
Powertools' own rule) there is no X-Ray daemon to send to: the handler then runs as it is.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rhumbatron.core.log_context import CorrelationIdFilter

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger, Tracer

__all__ = [
    "TRACED_MODULES",
    "LazyTracer",
    "lambda_logger",
    "lambda_tracer",
    "route_package_logs",
    "tracing_on",
]

PACKAGE_LOGGER = "rhumbatron"

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])

_TRUE = frozenset({"1", "y", "yes", "t", "true", "on"})


def _on_lambda() -> bool:
    # Set by Lambda; `sam local invoke` and `rhumbatron invoke` set it too, with AWS_SAM_LOCAL.
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME")) and not os.environ.get("AWS_SAM_LOCAL")


def lambda_logger(**options: Any) -> Logger:
    """The function's Powertools ``Logger`` (``options`` as ``Logger`` takes them; service and
    level from ``POWERTOOLS_SERVICE_NAME`` / ``POWERTOOLS_LOG_LEVEL``); in Lambda the package's
    log lines go out through it (:func:`route_package_logs`)."""
    from aws_lambda_powertools import Logger

    logger = Logger(**options)
    if _on_lambda():
        route_package_logs(logger)
    return logger


def route_package_logs(logger: Logger, package: str = PACKAGE_LOGGER) -> None:
    """Make every ``package.*`` stdlib logger write through ``logger``'s handler and JSON
    formatter, at its level, with the correlation ID bound by the package.

    The ``package`` logger gets the handler and stops propagating (Lambda's runtime puts a
    plain-text handler on the root logger: each line would come out twice); the modules'
    loggers, created later by lazy imports too, propagate to it.
    """
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    handler = logger.registered_handler
    if not any(isinstance(f, CorrelationIdFilter) for f in handler.filters):
        handler.addFilter(CorrelationIdFilter())
    if logger.name.split(".")[0] == package:
        return  # the function's logger is the package's own: its modules propagate to it
    logging.getLogger(package)  # registered, so that the copy finds it
    copy_config_to_registered_loggers(source_logger=logger, include={package})


def tracing_on() -> bool:
    """Whether Powertools' Tracer would trace here: in Lambda, not under ``sam local``, and
    ``POWERTOOLS_TRACE_DISABLED`` not true."""
    if os.environ.get("POWERTOOLS_TRACE_DISABLED", "false").strip().lower() in _TRUE:
        return False
    return bool(os.environ.get("LAMBDA_TASK_ROOT")) and not os.environ.get("AWS_SAM_LOCAL")


#: What the X-Ray SDK instruments: the AWS calls (S3, Secrets Manager, Lambda, Step
#: Functions), not SQLite: patching sqlite3 makes every statement a subsegment, about 100×
#: its cost, on every hot path.
TRACED_MODULES = ("botocore",)


class LazyTracer:
    """Powertools' ``Tracer`` (``options`` as it takes them; it patches
    :data:`TRACED_MODULES` unless told otherwise), built at the first invocation that
    traces; see the module docstring."""

    def __init__(self, **options: Any) -> None:
        self._options = {"patch_modules": TRACED_MODULES, **options}
        self._tracer: Tracer | None = None

    @property
    def built(self) -> bool:
        """Whether the Powertools ``Tracer`` (and the X-Ray SDK) was built in this process."""
        return self._tracer is not None

    def tracer(self) -> Tracer:
        """The Powertools ``Tracer``, built on first use."""
        if self._tracer is None:
            from aws_lambda_powertools import Tracer

            self._tracer = Tracer(**self._options)
        return self._tracer

    def capture_lambda_handler(self, handler: HandlerT) -> HandlerT:
        """``Tracer.capture_lambda_handler`` over ``handler``, decided at each invocation: a
        ``## <handler>`` subsegment with the cold start and the error, where tracing is on;
        the bare handler where it is off. Never the response: an API answer can hold a
        secret shown once (a new webhook's or agent's) and every tenant's records, and
        anyone allowed to read traces would read them."""
        traced: Callable[..., Any] | None = None

        @functools.wraps(handler)
        def invoke(event: Any, context: Any) -> Any:
            nonlocal traced
            if not tracing_on():
                return handler(event, context)
            if traced is None:
                traced = self.tracer().capture_lambda_handler(handler, capture_response=False)
            return traced(event, context)

        invoke.traced_by = self  # type: ignore[attr-defined]
        return invoke  # type: ignore[return-value]


def lambda_tracer(**options: Any) -> LazyTracer:
    """The function's tracer: :class:`LazyTracer` (service from ``POWERTOOLS_SERVICE_NAME``)."""
    return LazyTracer(**options)
