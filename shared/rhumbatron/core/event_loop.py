"""One asyncio event loop per process, reused across warm Lambda invocations.

Lambda handlers are synchronous; the package is asyncio. ``asyncio.run`` per invocation would
create and close a loop every time, and the NATS connection (its reader task, ping timer and
reconnect logic) belongs to the loop it was opened on: closing that loop orphans the
connection, so every invocation would pay a fresh TCP + TLS + CONNECT. Instead every handler
calls :func:`run`, which drives one loop that lives as long as the process (the warm
container). Between invocations Lambda freezes the process with the loop idle; the next
:func:`run` resumes its tasks where they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["close", "get_loop", "run", "run_together"]

T = TypeVar("T")


class _ProcessLoop:
    """Holds the process's loop (a module-level singleton: one per Lambda container)."""

    loop: asyncio.AbstractEventLoop | None = None


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop, created on first use (and again only if it was closed)."""
    if _ProcessLoop.loop is None or _ProcessLoop.loop.is_closed():
        _ProcessLoop.loop = asyncio.new_event_loop()
    return _ProcessLoop.loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on the process's loop and return its result.

    For synchronous entry points only: from inside a coroutine, ``await`` instead. Raises
    :class:`RuntimeError` when called while an event loop is running in this thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop running here: the normal case for a Lambda handler
    else:
        coro.close()  # never awaited: close it so Python does not warn about it
        raise RuntimeError(
            "rhumbatron.core.event_loop.run() was called from inside a running event loop; "
            "it is for synchronous entry points (Lambda handlers): await the coroutine instead"
        )
    return get_loop().run_until_complete(coro)


def close() -> None:
    """Close the process's loop (tests and orderly shutdown); the next :func:`run` makes one."""
    loop, _ProcessLoop.loop = _ProcessLoop.loop, None
    if loop is not None and not loop.is_closed():
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def run_together(*coroutines: Coroutine[Any, Any, T]) -> list[T]:
    """Run ``coroutines`` side by side; their results in order.

    Unlike ``asyncio.gather``, when one fails the others are cancelled (and awaited) before
    the first error is raised: on a loop that outlives the invocation, a sibling left running
    would be frozen by Lambda mid-batch and resume, stale, in the next invocation.
    """
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coroutine) for coroutine in coroutines]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from failed
    return [task.result() for task in tasks]
