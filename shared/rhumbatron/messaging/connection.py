"""Opening a NATS connection, with "unreachable" as its own error.

A publisher must tell "no server answered" (no attempt counts: rows stay pending) from
"a server refused" (an attempt counts). :class:`NatsUnavailableError` is the first.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rhumbatron.errors import NatsUnavailableError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.runtime.settings import Settings

__all__ = ["connect_nats"]


async def connect_nats(settings: Settings, *, name: str = "rhumbatron") -> NATS:
    """Connect to ``settings.nats_url``; raise :class:`NatsUnavailableError` if nobody answers.

    Once connected, the client reconnects by itself after a server restart (RELIABILITY F15)
    and buffers nothing while disconnected: a publish during an outage fails fast instead of
    piling up. The *first* connect is bounded: nats-py retries it for as long as it may
    reconnect later (for ever), so without a bound an unreachable server would hang the caller.
    """
    from nats.aio.client import Client
    from nats.errors import NoServersError

    nc = Client()
    bound_s = 2 * settings.nats_connect_timeout_s
    try:
        await asyncio.wait_for(
            nc.connect(
                # Several seeds, comma-separated, for a cluster; the client also learns the
                # other members from the server it reaches.
                servers=[url.strip() for url in settings.nats_url.split(",") if url.strip()],
                name=name,
                # nats-py annotates these as int, but uses them as asyncio timeouts (floats).
                connect_timeout=settings.nats_connect_timeout_s,  # type: ignore[arg-type]
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,  # type: ignore[arg-type]
                pending_size=0,
            ),
            timeout=bound_s,
        )
    except (TimeoutError, NoServersError, OSError) as exc:
        await nc.close()
        raise NatsUnavailableError(
            f"no NATS server answered at {settings.nats_url} within {bound_s:g} s "
            f"({type(exc).__name__}); check RHUMBATRON_NATS_URL and that nats-server is running"
        ) from exc
    return nc
