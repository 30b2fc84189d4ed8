"""The dashboard's data: the CloudWatch dashboard's panels, read from the local stack.

Each panel is read where the cloud's metric comes from: consumer lag from JetStream
(:meth:`~rhumbatron.router.event_router.EventRouter.consumer_lags`), the outbox backlog from
every actor file, published rows included
(:meth:`~rhumbatron.runtime.bootstrap.Rhumbatron.outbox_backlog`), dead letters from the
product database, commands per queue from the COMMANDS stream's consumers, Clef-flash calls
from the causal store, throughput from the event streams and the ``EVENT_METRICS`` rows, the
capacity report from the settings and the streams' rates
(:func:`~rhumbatron.router.capacity.capacity_report`), and the roles' ticks from
:class:`~rhumbatron_dev.dashboard.stats.LocalRunStats`.

A panel whose source does not answer (NATS down) carries ``{"error": ...}`` instead of its
data; the other panels still show.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from rhumbatron.core.clock import utc_day
from rhumbatron.errors import RhumbatronError
from rhumbatron.messaging.streams import COMMAND_STREAM, command_subject
from rhumbatron.metrics.platform_metrics import MetricBinding
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_index, event_stream_name
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, consumer_name

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron
    from rhumbatron_dev.dashboard.stats import LocalRunStats

__all__ = ["FEED_DEFAULT", "FEED_MAX", "collect_summary", "project_feed", "project_ids"]

_log = logging.getLogger(__name__)

#: Events the feed shows unless asked, and at most.
FEED_DEFAULT = 25
FEED_MAX = 200
#: Closed dead letters listed after the open ones (the latest closed first).
_RECENTLY_CLOSED = 10
#: Open letters listed at most (the counts still count every one).
_OPEN_LISTED = 100

_T = TypeVar("_T")


async def collect_summary(app: Rhumbatron, stats: LocalRunStats | None) -> dict[str, Any]:
    """Every panel's data as JSON-able values (see the module docstring)."""
    now = app.clock.now()
    # The product and actor files are read on the event loop, as the API's routes read
    # them: one connection per file serves the process, and no transaction awaits inside.
    backlog = _read(lambda: app.outbox_backlog(every_actor=True))
    return {
        "at": now.isoformat(),
        "lags": await _panel(lambda: _lags(app, now)),
        "outbox": backlog,
        "capacity": await _panel(lambda: _capacity(app)),
        "deadLetters": _read(lambda: _dead_letters(app)),
        "commands": await _panel(lambda: _commands(app, stats)),
        "publishErrors": _publish_errors(stats, backlog),
        "clefFlash": _read(lambda: _clef_flash(app, now)),
        "throughput": await _panel(lambda: _throughput(app, stats, now)),
        "roles": stats.to_wire() if stats is not None else {},
        "routerNudges": stats.router_nudges if stats is not None else None,
    }


async def _capacity(app: Rhumbatron) -> dict[str, object]:
    """The capacity report (``rhumbatron capacity``), the observed rate from the streams."""
    from rhumbatron.router.capacity import capacity_report

    return (await capacity_report(app.settings, await app.nats())).as_json()


async def _panel(read: Callable[[], Awaitable[_T]]) -> _T | dict[str, str]:
    """One panel's data, or ``{"error": ...}`` when its source does not answer: one
    panel's outage must not blank the page."""
    from nats.errors import Error as NatsError

    try:
        return await read()
    except (RhumbatronError, NatsError, TimeoutError, sqlite3.Error, OSError) as exc:
        return _unavailable(exc)


def _read(read: Callable[[], _T]) -> _T | dict[str, str]:
    """:func:`_panel` for a panel read from files."""
    try:
        return read()
    except (RhumbatronError, sqlite3.Error, OSError) as exc:
        return _unavailable(exc)


def _unavailable(exc: BaseException) -> dict[str, str]:
    _log.info("dashboard panel unavailable: %s", exc)
    return {"error": f"{type(exc).__name__}: {exc}"}


def next_sweep_visit(stream_index: int, now: datetime) -> datetime:
    """The first sweep tick after ``now`` that visits event stream ``stream_index`` (the
    tick at minute ``m`` of the day sweeps stream ``m mod 8``)."""
    tick = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while (tick.hour * 60 + tick.minute) % EVENT_STREAM_COUNT != stream_index:
        tick += timedelta(minutes=1)
    return tick


async def _lags(app: Rhumbatron, now: datetime) -> dict[str, Any]:
    lags = await app.router().consumer_lags()
    waiting: dict[str, int] = {}
    for lag in lags:
        if lag.num_pending:
            waiting[lag.stream] = waiting.get(lag.stream, 0) + lag.num_pending
    rows = [
        {
            "stream": lag.stream,
            "consumer": lag.consumer,
            "numPending": lag.num_pending,
            "numAckPending": lag.num_ack_pending,
            "exists": lag.exists,
        }
        for lag in lags
    ]
    return {
        "rows": rows,
        # Why a stream's records wait: a nudge applies a stream's events as they are
        # published; whatever is left (the archiver's and analytics' batches, a nudge that
        # found its stream's turn taken) waits for the stream's sweep tick, every 8 minutes.
        "waiting": [
            {
                "stream": stream,
                "pending": pending,
                "nextSweepAt": next_sweep_visit(event_stream_index(stream), now).isoformat(),
            }
            for stream, pending in sorted(waiting.items())
        ],
        "totalPending": sum(lag.num_pending for lag in lags),
        "totalAckPending": sum(lag.num_ack_pending for lag in lags),
    }


def _dead_letters(app: Rhumbatron) -> dict[str, Any]:
    from rhumbatron.api.schemas import DeadLetterSummary
    from rhumbatron.product.dead_letters import DeadLetter

    db = app.product().connection
    counts = [
        {"queue": row[0], "kind": row[1], "count": int(row[2])}
        for row in db.execute(
            # A poison event has no queue: the subscription that gave up stands in for it.
            "SELECT COALESCE(queue, consumer, '-'), kind, COUNT(*) FROM dead_letters "
            "WHERE status = 'open' GROUP BY 1, 2 ORDER BY 1, 2"
        )
    ]
    rows = db.execute(
        "SELECT * FROM dead_letters WHERE status = 'open' ORDER BY created_at_s, "
        "dead_letter_id LIMIT ?",
        (_OPEN_LISTED,),
    ).fetchall()
    rows += db.execute(
        "SELECT * FROM dead_letters WHERE status = 'closed' ORDER BY closed_at_s DESC, "
        "dead_letter_id LIMIT ?",
        (_RECENTLY_CLOSED,),
    ).fetchall()
    letters = [
        DeadLetterSummary.of(DeadLetter.from_row(row)).model_dump(mode="json", by_alias=True)
        for row in rows
    ]
    return {
        "open": sum(c["count"] for c in counts),
        "openByQueueAndKind": counts,
        "letters": letters,
    }


async def _commands(app: Rhumbatron, stats: LocalRunStats | None) -> dict[str, Any]:
    """Per queue: what JetStream delivered to its consumer (redeliveries included), what
    waits, and what the local consumer handled by outcome."""
    from nats.js.errors import NotFoundError

    js = (await app.nats()).jetstream()
    stored = (await js.stream_info(COMMAND_STREAM, subjects_filter="cmd.>")).state
    subjects = stored.subjects or {}
    queues: dict[str, dict[str, Any]] = {}
    for queue in QUEUE_CONSUMERS:
        entry: dict[str, Any] = {
            "stored": int(subjects.get(command_subject(queue), 0)),
            "handled": (stats.handled.get(queue, {}) if stats is not None else {}),
        }
        try:
            info = await js.consumer_info(COMMAND_STREAM, consumer_name(queue))
        except NotFoundError:
            # No consumer polled this queue yet: nothing was delivered.
            entry.update(deliveries=0, numPending=entry["stored"], numAckPending=0, redelivered=0)
        else:
            entry.update(
                deliveries=info.delivered.consumer_seq if info.delivered else 0,
                numPending=info.num_pending or 0,
                numAckPending=info.num_ack_pending or 0,
                redelivered=info.num_redelivered or 0,
            )
        queues[queue] = entry
    return {"queues": queues, "streamLastSeq": stored.last_seq, "streamMessages": stored.messages}


def _publish_errors(stats: LocalRunStats | None, backlog: object) -> dict[str, Any]:
    failed_rows = backlog.get("failed") if isinstance(backlog, dict) else None
    if stats is None:
        return {"total": None, "byKind": {}, "last": None, "failedRows": failed_rows}
    return {
        "total": sum(stats.publish_errors.values()),
        "byKind": dict(stats.publish_errors),
        "last": stats.last_publish_error,
        "failedRows": failed_rows,
    }


def _clef_flash(app: Rhumbatron, now: datetime) -> dict[str, Any]:
    """Today's (UTC) model calls per cap scope, and today's decisions by verdict and source
    (most decisions ask no model: no key, a cached answer, the cap reached)."""
    db = app.lifecycle().causal_store.connection
    day = utc_day(now)
    by_scope = {
        str(row[0]): int(row[1])
        for row in db.execute(
            "SELECT scope, calls FROM clef_flash_calls WHERE day = ? ORDER BY scope", (day,)
        )
    }
    midnight = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    decisions = [
        {"verdict": row[0], "source": row[1], "count": int(row[2])}
        for row in db.execute(
            "SELECT verdict, source, COUNT(*) FROM clef_flash_decisions WHERE decided_at_s >= ? "
            "GROUP BY 1, 2 ORDER BY 1, 2",
            (midnight,),
        )
    ]
    return {
        "day": day,
        "calls": sum(by_scope.values()),
        "callsByScope": by_scope,
        "capPerDay": app.settings.clef_flash_max_calls_per_day,
        "decisions": decisions,
    }


async def _throughput(
    app: Rhumbatron, stats: LocalRunStats | None, now: datetime
) -> dict[str, Any]:
    """Events per minute as the publisher sent them, each stream's size, and the analytics
    projector's ``EVENT_METRICS`` of the last hour by name."""
    js = (await app.nats()).jetstream()
    streams = {}
    for index in range(EVENT_STREAM_COUNT):
        name = event_stream_name(index)
        state = (await js.stream_info(name)).state
        streams[name] = {"messages": state.messages, "lastSeq": state.last_seq}
    hour_ago = now.timestamp() - 3600
    event_metrics = {
        str(row[0]): int(row[1])
        for row in app.product().connection.execute(
            "SELECT name, COUNT(*) FROM platform_metrics WHERE binding = ? AND recorded_at_s >= ? "
            "GROUP BY name ORDER BY name",
            (MetricBinding.EVENT_METRICS.value, hour_ago),
        )
    }
    per_minute = stats.events_per_minute() if stats is not None else []
    return {
        "eventsPerMinute": per_minute,
        "lastMinute": per_minute[-1]["events"] if per_minute else None,
        "publishedTotal": stats.published_total if stats is not None else None,
        "streamTotal": sum(s["lastSeq"] for s in streams.values()),
        "streams": streams,
        "eventMetricsLastHour": event_metrics,
    }


# -- the feed ---------------------------------------------------------------------------------


def project_ids(app: Rhumbatron) -> list[str]:
    """Projects that have a view (the projector applied at least one of their events)."""
    projector = app.router().projector
    return sorted(
        project_id
        for stream in range(EVENT_STREAM_COUNT)
        for project_id in projector.views(stream).project_ids()
    )


def project_feed(
    app: Rhumbatron, project_id: str | None, limit: int = FEED_DEFAULT
) -> dict[str, Any]:
    """The newest ``limit`` events of ``project_id`` (the first project with a view when
    None), newest first, with the list of projects to pick from.

    Raises :class:`~rhumbatron.operator.ProjectNotFoundError` for a project without a view:
    a mistyped ID must not create a view file.
    """
    from rhumbatron.errors import ProjectNotFoundError

    projects = project_ids(app)
    if project_id is None:
        if not projects:
            return {"projects": [], "projectId": None, "view": None, "items": []}
        project_id = projects[0]
    if project_id not in projects:
        raise ProjectNotFoundError(
            f"no project {project_id!r} has a view yet; projects with one: "
            f"{', '.join(projects) or 'none'}"
        )
    snapshot = app.router().projector.view(project_id).snapshot(latest=limit)
    items = snapshot.pop("latestEvents")
    return {"projects": projects, "projectId": project_id, "view": snapshot, "items": items}
