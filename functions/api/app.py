"""API: the operator API (FastAPI through Mangum) behind the HTTP API and its JWT authorizer.

Only wiring here; the logic is ``rhumbatron.api.lambda_handler`` (the code layer).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from rhumbatron.api.lambda_handler import handler
from rhumbatron.runtime.process import process_runtime

logger = Logger()  # service name and level from POWERTOOLS_SERVICE_NAME / POWERTOOLS_LOG_LEVEL


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handler(event, context, runtime=process_runtime)
