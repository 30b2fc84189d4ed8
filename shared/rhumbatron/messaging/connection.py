"""Opening a NATS connection, with "unreachable" as its own error.

A publisher must tell "no server answered" (no attempt counts: rows stay pending) from
"a server refused" (an attempt counts). :class:`NatsUnavailableError` is the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rhumbatron.errors import NatsUnavailableError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.runtime.settings import Settings

__all__ = ["connect_nats"]


async def connect_nats(settings: Settings, *, name: str = "rhumbatron") -> NATS:
    """Connect to ``settings.nats_url``; raise :class:`NatsUnavailableError` if nobody answers.

    The client reconnects by itself after a server restart (RELIABILITY F15), and buffers
    nothing while disconnected: a publish during an outage must fail fast, not pile up.
    """
    import nats
    from nats.errors import NoServersError

    try:
        return await nats.connect(
            settings.nats_url,
            name=name,
            connect_timeout=settings.nats_connect_timeout_s,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            pending_size=0,
        )
    except (NoServersError, OSError, TimeoutError) as exc:
        raise NatsUnavailableError(
            f"no NATS server answered at {settings.nats_url} ({exc.__class__.__name__}: {exc}); "
            "check RHUMBATRON_NATS_URL and that nats-server is running"
        ) from exc
