"""The operator API behind API Gateway: :func:`handler` is Mangum over :func:`create_api`.

Built on the first invocation, from the process's runtime (the function hands in its
provider, :func:`rhumbatron.runtime.process.process_runtime`), and kept for the warm
container's life.
Mangum runs the app on ``asyncio.get_event_loop()``; that is set to the process's one loop
(:mod:`rhumbatron.core.event_loop`) first, so the API's NATS connection is the same one,
on the same loop, from one invocation to the next.

Each invocation first runs :func:`~rhumbatron.entrypoints._lambda.prepare` (connect once,
ensure the streams once, revive a connection a long freeze killed). When NATS does not
answer the request is still served: ``/health`` reports it and the routes that need NATS
answer 503.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rhumbatron.core import event_loop
from rhumbatron.entrypoints._lambda import flush_metrics, prepare
from rhumbatron.errors import RhumbatronError

if TYPE_CHECKING:
    from fastapi import FastAPI
    from mangum import Mangum

    from rhumbatron.api.ports import ApiRuntime

__all__ = ["handler"]

_log = logging.getLogger(__name__)


@dataclass
class _Adapter:
    """What a warm container keeps: the runtime the API was built on, the API, Mangum."""

    app: ApiRuntime | None = None
    api: FastAPI | None = None
    mangum: Mangum | None = None


_adapter = _Adapter()


def _mangum(app: ApiRuntime) -> tuple[FastAPI, Mangum]:
    # Rebuilt when the runtime was replaced (reset_for_tests): a Mangum over a closed
    # runtime would answer from closed files.
    if _adapter.app is not app or _adapter.api is None or _adapter.mangum is None:
        from mangum import Mangum

        from rhumbatron.api.app import create_api
        from rhumbatron.api.auth import authenticator_from_settings

        api = create_api(
            app, authenticator_from_settings(app.settings, app.clock), manage_runtime=False
        )
        # lifespan="off": Mangum would run startup and shutdown around every invocation.
        _adapter.app, _adapter.api, _adapter.mangum = app, api, Mangum(api, lifespan="off")
    return _adapter.api, _adapter.mangum


def handler(
    event: dict[str, Any], context: Any, *, runtime: Callable[[], ApiRuntime]
) -> dict[str, Any]:
    """The Lambda entry point (API Gateway HTTP API or REST API proxy events), over the
    runtime ``runtime`` gives."""
    asyncio.set_event_loop(event_loop.get_loop())
    app = runtime()
    api, mangum = _mangum(app)
    try:
        event_loop.run(prepare(app))
        api.state.streams_ready = True
    except RhumbatronError as exc:
        _log.warning("NATS not ready for this request: %s", exc)
    try:
        return mangum(event, context)
    finally:
        flush_metrics(app)
