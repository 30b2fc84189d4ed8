"""The operator API's routes, one module per resource, each a module-level ``router``.

:data:`ROUTERS` is what :func:`~rhumbatron.api.app.create_api` includes, in this order (the
order of the OpenAPI document's operations). The routes are ``async def`` on purpose, and
call the product database on the event loop (see :mod:`rhumbatron.api.app`).
"""

from fastapi import APIRouter

from rhumbatron.api.routes import (
    agents,
    audit,
    changes,
    commands,
    consumers,
    dead_letters,
    health,
    outbox,
    projects,
    replays,
    schedules,
    subscriptions,
    tasks,
    workflows,
)

__all__ = ["ROUTERS"]

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    dead_letters.router,
    commands.router,
    projects.router,
    changes.router,
    tasks.router,
    agents.router,
    replays.router,
    subscriptions.router,
    schedules.router,
    consumers.router,
    outbox.router,
    workflows.router,
    audit.router,
)
