"""Router nudge: reads one event stream soon after a publish moved it (async invoke).

Only wiring here; the logic is ``rhumbatron.entrypoints.router_nudge`` (the code layer).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from rhumbatron.entrypoints.router_nudge import handle
from rhumbatron.runtime.process import process_runtime

logger = Logger()  # service name and level from POWERTOOLS_SERVICE_NAME / POWERTOOLS_LOG_LEVEL


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return handle(event, context, runtime=process_runtime)
