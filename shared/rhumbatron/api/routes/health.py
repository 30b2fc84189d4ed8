"""``GET /health``: whether this process can serve. No token needed."""

import logging

from fastapi import APIRouter, Response

from rhumbatron.api.dependencies import Runtime
from rhumbatron.api.schemas import Health
from rhumbatron.errors import RhumbatronError

__all__ = ["router"]

_log = logging.getLogger(__name__)

router = APIRouter()


@router.get(
    "/health",
    response_model=Health,
    summary="Whether this process can serve",
    responses={
        503: {
            "model": Health,
            "description": "NATS or the product database is down.",
            "headers": {
                "Retry-After": {
                    "description": "Seconds to wait before asking again.",
                    "required": True,
                    "schema": {"type": "integer"},
                }
            },
        }
    },
)
async def health(runtime: Runtime, response: Response) -> Health:
    """No token needed. 200 when NATS is connected and the product database is readable,
    503 (with the same body) otherwise."""
    try:
        nats_ok = (await runtime.nats()).is_connected
    except RhumbatronError as exc:
        _log.info("health: NATS: %s", exc)
        nats_ok = False
    try:
        runtime.product().connection.execute("SELECT 1 FROM dead_letters LIMIT 1").fetchall()
        db_ok = True
    except Exception as exc:  # any failure to read is the answer, not an error
        _log.info("health: product database: %s", exc)
        db_ok = False
    ok = nats_ok and db_ok
    if not ok:
        response.status_code = 503
        response.headers["Retry-After"] = str(runtime.settings.api_retry_after_s)
    return Health(status="ok" if ok else "unavailable", nats=nats_ok, product_database=db_ok)
