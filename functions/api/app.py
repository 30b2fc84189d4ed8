"""API: the operator API (FastAPI through Mangum) behind the HTTP API and its JWT authorizer.

Only wiring here; the logic is ``rhumbatron.api.lambda_handler`` (the code layer).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from rhumbatron.api.lambda_handler import handler
from rhumbatron.entrypoints.observability import lambda_logger, lambda_tracer
from rhumbatron.runtime.process import process_runtime

logger = lambda_logger()  # Powertools' Logger: in Lambda, the package's lines too, as JSON
tracer = lambda_tracer()  # Powertools' Tracer, built at the first invocation tracing is on
# A request's correlation ID: its X-Correlation-Id header, else API Gateway's request ID.
CORRELATION_ID_PATH = 'headers."x-correlation-id" || requestContext.requestId'


@tracer.capture_lambda_handler
@logger.inject_lambda_context(correlation_id_path=CORRELATION_ID_PATH)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handler(event, context, runtime=process_runtime)
