"""Integration: the integration, verification and release queues' consumer.

Only wiring here; the logic is ``rhumbatron.entrypoints.queue_worker`` (the code layer).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from rhumbatron.entrypoints.observability import lambda_logger, lambda_tracer
from rhumbatron.entrypoints.queue_worker import handle
from rhumbatron.runtime.process import process_runtime

logger = lambda_logger()  # Powertools' Logger: in Lambda, the package's lines too, as JSON
tracer = lambda_tracer()  # Powertools' Tracer, built at the first invocation tracing is on
# The queues this function polls (its schedule in template.yaml names the same).
QUEUES = ("integration", "verification", "release")


@tracer.capture_lambda_handler
@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, context, runtime=process_runtime, serves=QUEUES)
