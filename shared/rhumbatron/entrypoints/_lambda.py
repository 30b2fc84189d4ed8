"""What every Lambda role shares: the process's runtime, the deadline, the edge validation.

One warm Lambda container is one process, and whichever role it runs (outbox publisher,
router nudge, sweep) it keeps, between invocations, one runtime
(:mod:`rhumbatron.runtime.process`, handed to the role by its ``functions/<role>/app.py``):
its NATS connection on one event loop (:mod:`rhumbatron.core.event_loop`) — never
``asyncio.run`` per call, which would orphan the connection with the loop it was opened on —
and the knowledge that the streams were ensured, so only a cold start pays for it.

Lambda handlers are synchronous: each role's ``handle`` validates its event here
(:func:`validate_event`), then asks its provider for the runtime, takes a :func:`deadline`
from the context's remaining time, and runs one coroutine on the process's loop after
:func:`prepare`. What a role counts about its
run for the dashboards it records with :func:`record_metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from rhumbatron.errors import EnvelopeError, RhumbatronError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from rhumbatron.entrypoints.ports import RoleRuntime
    from rhumbatron.metrics import DataPoint, MetricsSink

__all__ = [
    "InvocationContext",
    "deadline",
    "flush_metrics",
    "prepare",
    "record_metrics",
    "stopper",
    "validate_event",
]

_log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=BaseModel)


class InvocationContext(Protocol):
    """The part of the Lambda context object the roles use."""

    def get_remaining_time_in_millis(self) -> int: ...


class MetricsHolder(Protocol):
    """A runtime with a metrics sink (every role's, the API's)."""

    @property
    def metrics_sink(self) -> MetricsSink: ...


# -- edge validation -------------------------------------------------------------------------


def validate_event(model: type[ModelT], event: object, *, role: str, shapes: str) -> ModelT:
    """Validate a Lambda event against ``model``.

    Raises :class:`EnvelopeError` naming every bad field with its value, the ``role`` whose
    event it was, and the ``shapes`` the role accepts.
    """
    if not isinstance(event, Mapping):
        raise EnvelopeError(
            f"{role} event must be a JSON object, got {type(event).__name__} "
            f"{event!r:.200}; {shapes}"
        )
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        problems = "; ".join(_describe(err, event) for err in exc.errors(include_url=False))
        raise EnvelopeError(f"invalid {role} event: {problems}; {shapes}") from None


def _describe(err: Any, event: Mapping[Any, Any]) -> str:
    # ``loc`` carries the alias (``streamIndex``), which is the key the event used.
    field = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"field {field!r} is missing"
    return f"field {field!r}={event.get(field, err.get('input'))!r}: {message}"


# -- the deadline ----------------------------------------------------------------------------


def deadline(context: InvocationContext | None, margin_s: float) -> float | None:
    """The ``time.monotonic()`` after which a role starts no more work, or None (no context).

    ``margin_s`` is the role's slowest ordinary unit of work: started just before the
    deadline, it still ends before Lambda kills the invocation mid-write.
    """
    if context is None:
        return None
    return time.monotonic() + context.get_remaining_time_in_millis() / 1000 - margin_s


def stopper(until: float | None) -> Callable[[], bool] | None:
    """A ``should_stop`` that turns true once ``until`` (a :func:`deadline`) has passed."""
    if until is None:
        return None
    return lambda: time.monotonic() >= until


# -- connecting ------------------------------------------------------------------------------


async def prepare(app: RoleRuntime) -> None:
    """Connect (once per process), ensure the streams (once), or revive a warm connection.

    A first connect that nobody answers fails within a bound (``connect_nats``), so an
    unreachable cluster ends the invocation with ``NatsUnavailableError`` instead of holding
    it until the Lambda's timeout.
    """
    nc = await app.nats()
    if not app.streams_ready:
        await app.ensure_streams()
        app.streams_ready = True
    else:
        await _revive(nc, app.settings.nats_connect_timeout_s)


async def _revive(nc: NATS, timeout_s: float) -> None:
    """A warm invocation after a long freeze: the server may have dropped the connection.

    While Lambda froze the process nothing read the socket. A round trip makes the client
    notice a dead connection now and reconnect, instead of the first publish or fetch
    finding it; then wait (bounded) for the reconnect. If it does not come, the work that
    follows reports the connection as unavailable.
    """
    try:
        await nc.flush(timeout=max(1, round(timeout_s)))
    except Exception as exc:  # a dead socket shows up as a timeout or a closed-connection error
        _log.info("NATS round trip failed after a freeze (%s); waiting for the reconnect", exc)
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    while not nc.is_connected and loop.time() < until:
        await asyncio.sleep(0.05)


# -- metrics ---------------------------------------------------------------------------------


def record_metrics(app: RoleRuntime, points: Sequence[DataPoint], *, what: str) -> None:
    """Record ``points`` as METRICS (rows in the product database, then EMF lines), after the
    work they count is done; ``what`` names them in the log.

    A failure to record (the product database busy past its timeout, EFS unwell) is logged,
    not raised: the commands are settled and the rows published, and an invocation that
    failed for its metrics would only be retried for nothing. The sweep records its own
    points strictly instead: its heartbeat missing is what the heartbeat alarm is for.
    """
    if not points:
        return
    from rhumbatron.metrics import MetricsRecorder

    try:
        MetricsRecorder(app.product(), app.metrics_sink, app.clock).record(points)
    except (RhumbatronError, sqlite3.Error, OSError) as exc:
        _log.warning("cannot record %s metrics: %s: %s", what, type(exc).__name__, exc)


def flush_metrics(app: MetricsHolder) -> None:
    """Send the EMF documents of what this invocation recorded (the end of every invocation).

    Lambda may freeze the process right after the handler returns, and a frozen process
    prints nothing: the sink's documents must be written before the return. A sink that
    cannot write (stdout closed) is logged, never raised over the invocation's own outcome.
    """
    try:
        app.metrics_sink.flush()
    except (OSError, ValueError) as exc:
        _log.warning("cannot write the EMF metrics: %s: %s", type(exc).__name__, exc)
