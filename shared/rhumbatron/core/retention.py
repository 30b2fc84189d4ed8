"""Every window of the settings checked against the others, once, at start-up.

The spec states the rule for the event log (seed 002, "Delivery semantics"): retention must
exceed the maximum tolerated lag plus the replay window (DECISIONS: of the two readings, this
stricter sum is the one checked). The other windows must nest around it:

* the largest tolerated lag is at least the sweep's round of the eight streams, and the event
  streams keep events longer than that lag plus the replay window;
* ``processed_events`` claims and published outbox rows outlive the events on the stream, and
  published rows the reconciliation window too;
* the JetStream duplicate window fits inside both streams' max ages, yet covers the outbox
  publisher's whole backoff and an operator Retry's resend;
* the archive keeps its objects for the whole replay window;
* the command stream keeps a command for as long as it may wait: behind a lagging consumer,
  then every delivery held and redelivered, with the retry delays between;
* the ack waits beat the in-progress marks and the fetch timeout.

:func:`retention_misfits` lists every rule the settings break, each naming the settings it
reads by their ``RHUMBATRON_*`` names with their values and what to change;
:func:`check_retention` raises them all at once. ``Settings`` calls it from its validator, so
:func:`~rhumbatron.core.settings.load_settings` refuses before anything opens a file.

No rule here ties a record's lifetime to the stream's: the spec lets an expired log row break
browsing (a view, a replay) but never provenance, which records embed (S2-046, S2-047).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from rhumbatron.errors import RetentionMisfitError
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS, QueueConsumer

__all__ = [
    "SWEEP_ROUND_S",
    "RetentionMisfit",
    "RetentionWindows",
    "check_retention",
    "command_wait_s",
    "publish_resend_span_s",
    "retention_misfits",
]

_DAY_S = 86_400.0
#: The sweep ticks once a minute and visits one of the eight event streams a tick, so a
#: sweep-only consumer (audit archive, analytics) is normally this far behind. Not a setting:
#: the tick is the schedule in template.yaml and the count is EVENT_STREAM_COUNT.
SWEEP_ROUND_S = EVENT_STREAM_COUNT * 60.0
#: Queues served by the integration handler, which may ask for its own redelivery delay
#: (more work, a conflict review) instead of the table's retry delay.
_INTEGRATION_MODULE = "integration"


def _env(field: str) -> str:
    return f"RHUMBATRON_{field.upper()}"


def _duration(seconds: float) -> str:
    """A span for the reader: ``90 s``, ``8 min``, ``26 h``, ``5.5 days``."""
    for unit, size in (("days", _DAY_S), ("h", 3_600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _num(value: float) -> str:
    """A setting's value as an operator would type it: ``86400``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _at_least(value: float) -> str:
    """``value`` rounded up to two decimals, so that the number suggested is enough."""
    return _num(math.ceil(value * 100) / 100)


class RetentionWindows(Protocol):
    """The settings the fit reads (``Settings`` is one): each window and cap by its field name,
    so that the kernel's settings can run the check without this module importing them."""

    @property
    def api_retry_resend_after_s(self) -> float: ...

    @property
    def archive_max_age_days(self) -> float: ...

    @property
    def command_ack_wait_s(self) -> float: ...

    @property
    def command_in_progress_s(self) -> float: ...

    @property
    def command_max_hold_s(self) -> float: ...

    @property
    def command_stream_max_age_days(self) -> float: ...

    @property
    def duplicate_window_s(self) -> float: ...

    @property
    def event_stream_max_age_days(self) -> float: ...

    @property
    def max_consumer_lag_s(self) -> float: ...

    @property
    def outbox_backoff_initial_s(self) -> float: ...

    @property
    def outbox_backoff_jitter(self) -> float: ...

    @property
    def outbox_backoff_max_s(self) -> float: ...

    @property
    def outbox_max_attempts(self) -> int: ...

    @property
    def outbox_published_retention_days(self) -> float: ...

    @property
    def reconcile_window_s(self) -> float: ...

    @property
    def processed_events_retention_days(self) -> float: ...

    @property
    def publish_ack_timeout_s(self) -> float: ...

    @property
    def queue_retry_delay_s(self) -> Mapping[str, float]: ...

    @property
    def replay_window_days(self) -> float: ...

    @property
    def router_ack_wait_s(self) -> float: ...

    @property
    def router_fetch_timeout_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RetentionMisfit:
    """One rule the settings break.

    ``values`` holds every setting the rule reads, ``(field, value)``, in the order the message
    names them; ``why`` says what would go wrong and ``fix`` what to change.
    """

    rule: str
    values: tuple[tuple[str, object], ...]
    why: str
    fix: str

    @property
    def env_names(self) -> tuple[str, ...]:
        """The ``RHUMBATRON_*`` variables of the settings involved."""
        return tuple(_env(field) for field, _ in self.values)

    def __str__(self) -> str:
        named = ", ".join(f"{field}={value!r} ({_env(field)})" for field, value in self.values)
        return f"{self.rule} [{named}]: {self.why}; {self.fix}"


def check_retention(
    settings: RetentionWindows, *, queues: Mapping[str, QueueConsumer] | None = None
) -> None:
    """Raise :class:`RetentionMisfitError` listing every rule ``settings`` break, if any."""
    misfits = retention_misfits(settings, queues=queues)
    if misfits:
        raise RetentionMisfitError(misfits)


def retention_misfits(
    settings: RetentionWindows, *, queues: Mapping[str, QueueConsumer] | None = None
) -> tuple[RetentionMisfit, ...]:
    """Every rule ``settings`` break, in a fixed order; empty when the windows fit.

    ``queues`` is the queue table the command-stream rule reads (``QUEUE_CONSUMERS``).
    """
    if queues is None:
        queues = QUEUE_CONSUMERS
    return tuple(_misfits(settings, queues))


def publish_resend_span_s(settings: RetentionWindows) -> float:
    """The longest time from an outbox row's first send to its last resend.

    Each failed attempt waits out its ack timeout, then a backoff of ``initial · 2^(n-1)``
    capped at the maximum, stretched by the whole jitter; the last attempt has no backoff after.
    A first send that JetStream stored but did not acknowledge in time is resent this late at
    most, under the same ``Nats-Msg-Id``.
    """
    span = 0.0
    delay = settings.outbox_backoff_initial_s
    stretch = 1 + settings.outbox_backoff_jitter
    resends = settings.outbox_max_attempts - 1
    # Double until the cap, then the rest are all at the cap: no loop over a huge attempt count.
    while resends > 0 and delay < settings.outbox_backoff_max_s:
        span += settings.publish_ack_timeout_s + delay * stretch
        delay *= 2
        resends -= 1
    capped = settings.publish_ack_timeout_s + settings.outbox_backoff_max_s * stretch
    return span + resends * capped


def command_wait_s(settings: RetentionWindows, row: QueueConsumer) -> float:
    """The longest a command may stay on the command stream in ``row``'s queue.

    It may wait ``max_consumer_lag_s`` behind a lagging consumer; then each of its deliveries
    may be held ``command_max_hold_s`` (in-progress marks) and come back ``command_ack_wait_s``
    after the last mark, with the longest retry delay between deliveries.
    """
    delivery_s = settings.command_max_hold_s + settings.command_ack_wait_s
    return (
        settings.max_consumer_lag_s
        + row.max_deliveries * delivery_s
        + row.retries * _retry_delay(settings, row)[0]
    )


def _retry_delay(settings: RetentionWindows, row: QueueConsumer) -> tuple[float, str | None]:
    """The longest delay between two deliveries, and the setting that decides it (None: the
    table row)."""
    override = settings.queue_retry_delay_s.get(row.queue)
    delay, source = (
        (row.retry_delay_s, None) if override is None else (override, "queue_retry_delay_s")
    )
    if row.consumer_module == _INTEGRATION_MODULE:
        for field in ("integration_more_work_delay_s", "conflict_review_delay_s"):
            asked = float(getattr(settings, field))
            if asked > delay:
                delay, source = asked, field
    return delay, source


def _misfits(
    settings: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    for rule in _RULES:
        yield from rule(settings, queues)


def _sweep_round(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.max_consumer_lag_s < SWEEP_ROUND_S:
        yield RetentionMisfit(
            "the largest tolerated consumer lag covers the sweep's round of the streams",
            (("max_consumer_lag_s", s.max_consumer_lag_s),),
            f"the sweep visits each event stream once every {_duration(SWEEP_ROUND_S)}, so a "
            "healthy sweep-only consumer (audit archive, analytics) is that far behind",
            f"raise {_env('max_consumer_lag_s')} to at least {_num(SWEEP_ROUND_S)}",
        )


def _event_stream_covers_lag_and_replay(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    event_s = s.event_stream_max_age_days * _DAY_S
    replay_s = s.replay_window_days * _DAY_S
    # The spec's word is "exceed": at equality the oldest event a replay needs is the one
    # JetStream is deleting.
    needed_s = s.max_consumer_lag_s + replay_s
    if event_s <= needed_s:
        yield RetentionMisfit(
            "the event stream keeps events longer than the largest consumer lag plus the "
            "replay window",
            (
                ("event_stream_max_age_days", s.event_stream_max_age_days),
                ("max_consumer_lag_s", s.max_consumer_lag_s),
                ("replay_window_days", s.replay_window_days),
            ),
            f"a consumer {_duration(s.max_consumer_lag_s)} behind that rewinds "
            f"{_duration(replay_s)} needs events {_duration(needed_s)} old, and the stream keeps "
            f"them {_duration(event_s)}",
            f"raise {_env('event_stream_max_age_days')} above {_at_least(needed_s / _DAY_S)}, "
            f"or lower {_env('max_consumer_lag_s')} or {_env('replay_window_days')}",
        )


def _claims_outlive_stream(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.processed_events_retention_days < s.event_stream_max_age_days:
        yield RetentionMisfit(
            "processed_events claims are kept at least as long as the event stream keeps events",
            (
                ("processed_events_retention_days", s.processed_events_retention_days),
                ("event_stream_max_age_days", s.event_stream_max_age_days),
            ),
            "a redelivery of an event still on its stream would find no claim and apply the "
            "event a second time",
            f"raise {_env('processed_events_retention_days')} to at least "
            f"{_num(s.event_stream_max_age_days)}, or lower {_env('event_stream_max_age_days')}",
        )


def _published_rows_outlive_stream(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.outbox_published_retention_days < s.event_stream_max_age_days:
        yield RetentionMisfit(
            "published outbox rows are kept at least as long as the event stream keeps their "
            "events",
            (
                ("outbox_published_retention_days", s.outbox_published_retention_days),
                ("event_stream_max_age_days", s.event_stream_max_age_days),
            ),
            "a row's UNIQUE event ID is what makes a retried write of the same Event a no-op; "
            "deleted while the event is still on its stream, a late retry publishes it again",
            f"raise {_env('outbox_published_retention_days')} to at least "
            f"{_num(s.event_stream_max_age_days)}, or lower {_env('event_stream_max_age_days')}",
        )
    window_days = s.reconcile_window_s / _DAY_S
    if s.outbox_published_retention_days < window_days:
        yield RetentionMisfit(
            "published outbox rows are kept at least as long as reconciliation looks back",
            (
                ("outbox_published_retention_days", s.outbox_published_retention_days),
                ("reconcile_window_days", window_days),
            ),
            "reconciliation proves the log holds every row the outbox marked published; a row "
            "pruned inside the window is an event nothing can prove or re-publish",
            f"raise {_env('outbox_published_retention_days')} to at least "
            f"{_num(window_days)}, or lower {_env('reconcile_window_days')}",
        )


def _duplicate_window_within_stream_ages(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    event_s = s.event_stream_max_age_days * _DAY_S
    command_s = s.command_stream_max_age_days * _DAY_S
    exceeded = [
        (field, days)
        for field, days, age_s in (
            ("event_stream_max_age_days", s.event_stream_max_age_days, event_s),
            ("command_stream_max_age_days", s.command_stream_max_age_days, command_s),
        )
        if s.duplicate_window_s > age_s
    ]
    if exceeded:
        shortest_s = min(days for _, days in exceeded) * _DAY_S
        raise_ages = " or ".join(_env(field) for field, _ in exceeded)
        yield RetentionMisfit(
            "the JetStream duplicate window is no longer than the streams keep messages",
            (("duplicate_window_s", s.duplicate_window_s), *exceeded),
            "JetStream refuses a stream whose duplicate window exceeds its max age, and a "
            "dedupe of messages already gone promises nothing",
            f"lower {_env('duplicate_window_s')} to at most {_num(shortest_s)}, "
            f"or raise {raise_ages}",
        )


def _duplicate_window_covers_resends(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    span_s = publish_resend_span_s(s)
    if s.duplicate_window_s < span_s:
        yield RetentionMisfit(
            "the JetStream duplicate window covers the outbox publisher's retries",
            (
                ("duplicate_window_s", s.duplicate_window_s),
                ("outbox_max_attempts", s.outbox_max_attempts),
                ("outbox_backoff_initial_s", s.outbox_backoff_initial_s),
                ("outbox_backoff_max_s", s.outbox_backoff_max_s),
                ("outbox_backoff_jitter", s.outbox_backoff_jitter),
                ("publish_ack_timeout_s", s.publish_ack_timeout_s),
            ),
            f"a row's last resend may come {_duration(span_s)} after its first send (each "
            "attempt's ack timeout, then its backoff with the whole jitter), and a first send "
            "that was stored but not acknowledged must still make that resend a duplicate",
            f"raise {_env('duplicate_window_s')} to at least {_at_least(span_s)}, or lower "
            f"{_env('outbox_max_attempts')} or {_env('outbox_backoff_max_s')}",
        )


def _retry_resend_inside_duplicate_window(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.api_retry_resend_after_s >= s.duplicate_window_s:
        yield RetentionMisfit(
            "an operator Retry left unsent is resent inside the duplicate window",
            (
                ("api_retry_resend_after_s", s.api_retry_resend_after_s),
                ("duplicate_window_s", s.duplicate_window_s),
            ),
            "a Retry reservation whose process died is sent again once it is that old, and "
            "only while JetStream would still drop a repeat: as set, it is never sent",
            f"lower {_env('api_retry_resend_after_s')} below {_num(s.duplicate_window_s)}, "
            f"or raise {_env('duplicate_window_s')}",
        )


def _archive_covers_replay(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.archive_max_age_days < s.replay_window_days:
        yield RetentionMisfit(
            "the archive keeps objects at least as long as the replay window",
            (
                ("archive_max_age_days", s.archive_max_age_days),
                ("replay_window_days", s.replay_window_days),
            ),
            "a replay from the archive needs the objects of the whole window",
            f"raise {_env('archive_max_age_days')} to at least {_num(s.replay_window_days)} (and "
            f"the bucket's lifecycle rule with it), or lower {_env('replay_window_days')}",
        )


def _command_stream_covers_waits(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    command_s = s.command_stream_max_age_days * _DAY_S
    if queues:
        row = max(queues.values(), key=lambda r: command_wait_s(s, r))
        wait_s = command_wait_s(s, row)
        if command_s < wait_s:
            delay_s, delay_source = _retry_delay(s, row)
            delay_values: tuple[tuple[str, object], ...] = ()
            if delay_source is not None:
                delay_values = ((delay_source, getattr(s, delay_source)),)
            yield RetentionMisfit(
                "the command stream keeps a command as long as it may wait",
                (
                    ("command_stream_max_age_days", s.command_stream_max_age_days),
                    ("max_consumer_lag_s", s.max_consumer_lag_s),
                    ("command_max_hold_s", s.command_max_hold_s),
                    ("command_ack_wait_s", s.command_ack_wait_s),
                    *delay_values,
                ),
                f"a command on {row.queue} may wait {_duration(wait_s)}: "
                "the largest consumer lag, then "
                f"{row.max_deliveries} deliveries (QUEUE_CONSUMERS: {row.retries} retries), each "
                "held and redelivered an ack wait after its last in-progress mark, "
                f"{_duration(delay_s)} apart; the stream would delete it unhandled",
                f"raise {_env('command_stream_max_age_days')} to at least "
                f"{_at_least(wait_s / _DAY_S)}, or lower {_env('max_consumer_lag_s')} or "
                f"{_env('command_max_hold_s')}",
            )


def _in_progress_marks_beat_ack_wait(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    # The ack waits are windows too: listed with the rest so one start-up names every misfit.
    if s.command_in_progress_s >= s.command_ack_wait_s:
        yield RetentionMisfit(
            "a running command's in-progress marks come more often than its ack wait",
            (
                ("command_in_progress_s", s.command_in_progress_s),
                ("command_ack_wait_s", s.command_ack_wait_s),
            ),
            "a running handler's message would be redelivered between two in-progress marks",
            f"lower {_env('command_in_progress_s')} below {_num(s.command_ack_wait_s)}, or raise "
            f"{_env('command_ack_wait_s')}",
        )


def _router_ack_wait_beats_fetch(
    s: RetentionWindows, queues: Mapping[str, QueueConsumer]
) -> Iterator[RetentionMisfit]:
    if s.router_ack_wait_s <= s.router_fetch_timeout_s:
        yield RetentionMisfit(
            "the router's ack wait is longer than one fetch",
            (
                ("router_ack_wait_s", s.router_ack_wait_s),
                ("router_fetch_timeout_s", s.router_fetch_timeout_s),
            ),
            "a fetched batch would be redelivered before its records could be handled",
            f"raise {_env('router_ack_wait_s')} above {_num(s.router_fetch_timeout_s)}, or lower "
            f"{_env('router_fetch_timeout_s')}",
        )


#: Every rule, in the order a start-up names their misfits.
_RULES: tuple[
    Callable[[RetentionWindows, Mapping[str, QueueConsumer]], Iterator[RetentionMisfit]], ...
] = (
    _sweep_round,
    _event_stream_covers_lag_and_replay,
    _claims_outlive_stream,
    _published_rows_outlive_stream,
    _duplicate_window_within_stream_ages,
    _duplicate_window_covers_resends,
    _retry_resend_inside_duplicate_window,
    _archive_covers_replay,
    _command_stream_covers_waits,
    _in_progress_marks_beat_ack_wait,
    _router_ack_wait_beats_fetch,
)
