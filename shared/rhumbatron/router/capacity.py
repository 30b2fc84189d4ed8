"""The sweep's ceilings: how many events a day the router's bounded jobs can keep up with.

At the spec's values the sweep is a hard ceiling: one ``audit-archiver`` batch of at most 100
records a minute archives at most 144,000 events a day, and a 5,000-row daily prune alone
cannot keep ``processed_events`` bounded above about a thousand events a day (each event leaves
up to one claim row per subscription); above that, ``expected_events_per_day`` makes every
other tick prune too (:func:`tick_prune_rows`). :func:`ceilings` computes them from the settings;
:func:`capacity_warnings` compares them with the rate the streams actually carry, and the
router logs the warnings at its first sweep in a process and every hour after
(``docs/operations.md``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic.alias_generators import to_camel

from rhumbatron.core.settings import Settings
from rhumbatron.messaging.event_log import Subscription
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT
from rhumbatron.router.ticks import drain_plan, in_fetches

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nats.aio.client import Client as NATS

__all__ = [
    "DRAIN_AT_SHARE",
    "CapacityReport",
    "Ceilings",
    "capacity_report",
    "capacity_warnings",
    "ceilings",
    "drain_mode",
    "observed_events_per_day",
    "report_for",
    "sizing_warnings",
    "stream_events_per_day",
    "tick_prune_rows",
]

_MINUTES_PER_DAY = 1_440


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Events per day (all 8 streams together) each bounded job can handle at most."""

    archive_events_per_day: int
    analytics_events_per_day: int
    sweep_apply_events_per_day: int
    #: With nudges off, a run makes at most ``router_apply_calls_per_run`` apply calls (one
    #: project's events of one fetch each): events of many projects are held at this.
    sweep_apply_calls_per_day: int
    reactions_events_per_day: int
    prune_events_per_day: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def tick_prune_rows(settings: Settings, observed_per_day: float | None = None) -> int:
    """Rows of each growing table an ordinary sweep tick prunes: 0 while the daily prune's
    cap covers a day's claim rows (the spec's numbers, at the default sizing), else a chunk
    that deletes twice the inflow over the day's ticks.

    The inflow is the larger of ``expected_events_per_day`` and the rate the streams were
    observed to carry, times one claim row per subscription (an upper bound: the causal
    router claims only the Events its rules act on).
    """
    per_day = max(settings.expected_events_per_day, observed_per_day or 0.0) * len(Subscription)
    if per_day <= settings.processed_events_prune_cap:
        return 0
    return math.ceil(2 * per_day / _MINUTES_PER_DAY)


def _sweep_only_ceilings(settings: Settings) -> dict[str, int]:
    """What the archiver, analytics and reactions carry a day on the sweep's cadence alone.

    Every tick visits one stream, so the day's 1,440 ticks are the budget of all 8 streams
    together. Analytics skips the daily tick and the release-sweep ticks (1 in
    ``release_sweep_every_min``).
    """
    ticks = _MINUTES_PER_DAY
    analytics_ticks = ticks - ticks // settings.release_sweep_every_min - 1
    # What a tick really fetches: batches above the fetch cap go in several fetches.
    archive = math.prod(
        in_fetches(settings, settings.archive_batches_per_tick, settings.archive_batch_size)
    )
    analytics = math.prod(
        in_fetches(settings, settings.analytics_batches_per_tick, settings.analytics_batch_size)
    )
    return {
        "archive_events_per_day": ticks * archive,
        "analytics_events_per_day": analytics_ticks * analytics,
        # One reactions batch per stream on every tick (its own stream's and the others').
        "reactions_events_per_day": ticks * EVENT_STREAM_COUNT * settings.router_fetch_max_records,
    }


def ceilings(settings: Settings, observed_per_day: float | None = None) -> Ceilings:
    """The ceilings the settings allow (the prune's for ``observed_per_day`` too: its chunks
    grow with the rate the streams were seen to carry).

    The archiver, analytics and reactions carry what their sweep cadence allows
    (:func:`_sweep_only_ceilings`), or, in drain mode (:func:`drain_mode`), what every tick
    draining every stream allows: 1,440 ticks × 8 streams × ``router_drain_max_fetches``
    fetches (the nudges drain besides). The projector and the causal router also run on
    every nudge; their sweep ceiling is what holds with nudges off. The prune deletes its
    daily cap and its tick chunks of claim rows a day, and every event leaves up to one row
    per subscription.
    """
    ticks = _MINUTES_PER_DAY
    carried = _sweep_only_ceilings(settings)
    if drain_mode(settings, observed_per_day):
        # Every tick drains every stream: what one stream's drain fetches, 8 × 1,440 a day.
        name_of = {
            Subscription.AUDIT_ARCHIVER: "archive_events_per_day",
            Subscription.ANALYTICS_PROJECTOR: "analytics_events_per_day",
            Subscription.REACTIONS: "reactions_events_per_day",
        }
        carried = {
            name_of[subscription]: ticks * EVENT_STREAM_COUNT * fetches * batch
            for subscription, fetches, batch in drain_plan(settings)
        }
    return Ceilings(
        archive_events_per_day=carried["archive_events_per_day"],
        analytics_events_per_day=carried["analytics_events_per_day"],
        sweep_apply_events_per_day=ticks
        * settings.router_consumes_per_run
        * settings.router_fetch_max_records,
        sweep_apply_calls_per_day=ticks * settings.router_apply_calls_per_run,
        reactions_events_per_day=carried["reactions_events_per_day"],
        prune_events_per_day=(
            settings.processed_events_prune_cap
            + (ticks - 1) * tick_prune_rows(settings, observed_per_day)
        )
        // len(Subscription),
    )


#: Where each ceiling is raised, for the warnings.
_ADVICE = {
    "archive_events_per_day": "RHUMBATRON_ARCHIVE_BATCH_SIZE or "
    "RHUMBATRON_ARCHIVE_BATCHES_PER_TICK",
    "analytics_events_per_day": "RHUMBATRON_ANALYTICS_BATCH_SIZE or "
    "RHUMBATRON_ANALYTICS_BATCHES_PER_TICK",
    "sweep_apply_events_per_day": "RHUMBATRON_ROUTER_CONSUMES_PER_RUN (or keep nudges on)",
    "sweep_apply_calls_per_day": "RHUMBATRON_ROUTER_APPLY_CALLS_PER_RUN (or keep nudges on; "
    "it binds when each fetch holds the events of many projects)",
    "reactions_events_per_day": "RHUMBATRON_ROUTER_FETCH_MAX_RECORDS (at most the spec's "
    "100: above it a storm waits on the streams)",
    "prune_events_per_day": "RHUMBATRON_EXPECTED_EVENTS_PER_DAY (or "
    "RHUMBATRON_PROCESSED_EVENTS_PRUNE_CAP)",
}

#: The share of a ceiling the observed rate may reach before the sweep warns.
WARN_AT_SHARE = 0.8
#: The share of the sweep-only ceilings (archive, analytics, reactions) above which those
#: subscriptions also drain on nudges and on every stream at each tick (drain mode).
DRAIN_AT_SHARE = 0.5


def drain_mode(settings: Settings, observed_per_day: float | None = None) -> bool:
    """Whether the archiver, analytics and reactions run as drain loops: as
    ``router_drain_mode`` says, or, by default, when the volume the deployment is sized for
    (or the rate observed, when higher) passes half of what their sweep-only cadence carries
    a day. At the spec's default sizing it is off, and the cadences are the spec's."""
    if settings.router_drain_mode is not None:
        return settings.router_drain_mode
    sweep_only = _sweep_only_ceilings(settings)
    volume = max(settings.expected_events_per_day, observed_per_day or 0.0)
    return volume > DRAIN_AT_SHARE * min(sweep_only.values())


#: The ceilings of the sweep's own projector and causal runs: while publishes nudge the
#: router, the nudges apply the events and these do not bind.
_SWEEP_APPLY_CEILINGS = ("sweep_apply_events_per_day", "sweep_apply_calls_per_day")


def _binding(limits: dict[str, int], *, nudged: bool) -> dict[str, int]:
    """``limits`` without the ones that do not bind: the projector's sweep-only ones while
    publishes nudge the router."""
    return {k: v for k, v in limits.items() if not (nudged and k in _SWEEP_APPLY_CEILINGS)}


def capacity_warnings(
    settings: Settings, observed_per_day: float, *, nudged: bool = False
) -> list[str]:
    """One warning per binding ceiling the observed rate has passed 80 % of, naming the
    setting to raise (see :func:`_binding`). Not the prune's: the sweep sizes its chunks for
    the observed rate (twice it, :func:`tick_prune_rows`), so it keeps up at any rate."""
    limits = _binding(ceilings(settings, observed_per_day).as_dict(), nudged=nudged)
    del limits["prune_events_per_day"]
    return [
        f"the streams carry about {observed_per_day:,.0f} events a day, over "
        f"{WARN_AT_SHARE:.0%} of {name} ({limit:,}): raise {_ADVICE[name]} "
        "(see docs/operations.md)"
        for name, limit in limits.items()
        if observed_per_day > WARN_AT_SHARE * limit
    ]


def sizing_warnings(settings: Settings, *, nudged: bool = False) -> list[str]:
    """One warning per binding ceiling below ``expected_events_per_day``: what the deployment
    is sized for but cannot carry (logged when the router starts)."""
    expected = settings.expected_events_per_day
    return [
        f"sized for {expected:,} events a day (RHUMBATRON_EXPECTED_EVENTS_PER_DAY) but "
        f"{name} is {limit:,}: raise {_ADVICE[name]} (see docs/operations.md)"
        for name, limit in _binding(ceilings(settings).as_dict(), nudged=nudged).items()
        if limit < expected
    ]


async def observed_events_per_day(nc: NATS, *, min_span_s: float = 60.0) -> float:
    """The event rate the streams carry, from each stream's first and last message times.

    A stream holds up to 7 days; its messages over the span they cover is its rate. A
    stream spanning under ``min_span_s`` (``router_rate_min_span_s``, a minute) tells too
    little and is left out. (nats.py's ``StreamState`` drops the timestamps, so this reads
    the stream-info API's JSON.)
    """
    from rhumbatron.protocol.ids import event_stream_name

    total = 0.0
    for index in range(EVENT_STREAM_COUNT):
        reply = await nc.request(f"$JS.API.STREAM.INFO.{event_stream_name(index)}", b"", timeout=2)
        state = json.loads(reply.data).get("state", {})
        total += stream_events_per_day(state, min_span_s=min_span_s)
    return total


def stream_events_per_day(state: Mapping[str, Any], *, min_span_s: float = 60.0) -> float:
    """The events a day one stream carries, from the ``state`` of its stream-info answer:
    its messages over the span between its first and last message; 0 for a stream with no
    message or spanning under ``min_span_s`` (too little to tell)."""
    first, last, messages = state.get("first_ts"), state.get("last_ts"), state.get("messages")
    if not messages or not first or not last:
        return 0.0
    # JetStream writes RFC 3339 with nanoseconds and a Z: fromisoformat reads both (Python
    # 3.11+, cutting the fraction to microseconds).
    span_s = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    return messages * 86_400 / span_s if span_s >= min_span_s else 0.0


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """What ``GET /capacity`` and ``rhumbatron capacity`` show: the ceilings the settings
    allow, the volume sized for and the one observed, the prune's chunk, and the warnings."""

    expected_events_per_day: int
    observed_events_per_day: float | None
    tick_prune_rows: int
    ceilings: Ceilings
    warnings: list[str]
    #: Whether the archiver, analytics and reactions drain (:func:`drain_mode`).
    drain_mode: bool = False
    #: Whether publishes nudge the router (a router-nudge function is named): then the
    #: projector's sweep-only ceilings do not bind.
    nudged: bool = False

    @property
    def used_percent(self) -> float | None:
        """The share of its tightest binding ceiling the measured rate uses, in percent; None
        when no rate was measured. The prune's is left out (it follows the rate), and so are
        the projector's sweep-only ones while publishes nudge the router."""
        if self.observed_events_per_day is None:
            return None
        limits = _binding(self.ceilings.as_dict(), nudged=self.nudged)
        del limits["prune_events_per_day"]
        return 100 * self.observed_events_per_day / min(limits.values())

    def as_json(self) -> dict[str, object]:
        return {
            "expectedEventsPerDay": self.expected_events_per_day,
            "observedEventsPerDay": (
                None
                if self.observed_events_per_day is None
                else round(self.observed_events_per_day)
            ),
            "tickPruneRows": self.tick_prune_rows,
            "drainMode": self.drain_mode,
            "ceilings": {to_camel(name): limit for name, limit in self.ceilings.as_dict().items()},
            "warnings": list(self.warnings),
        }


async def capacity_report(
    settings: Settings, nc: NATS | None, *, nudged: bool | None = None
) -> CapacityReport:
    """The capacity report; the observed rate is read from the streams when ``nc`` is given
    (None: the settings alone, as when NATS cannot be reached). ``nudged`` says whether
    publishes nudge the router (the router knows: :meth:`EventRouter.nudged_lately`); by
    default, whether these settings name a router-nudge function."""
    if nudged is None:
        nudged = settings.router_nudge_function is not None
    observed = (
        None
        if nc is None
        else await observed_events_per_day(nc, min_span_s=settings.router_rate_min_span_s)
    )
    return report_for(settings, observed, nudged=nudged)


def report_for(settings: Settings, observed: float | None, *, nudged: bool) -> CapacityReport:
    """The capacity report at the ``observed`` rate (None: not read), with the warnings of
    the sizing and of that rate."""
    warnings = sizing_warnings(settings, nudged=nudged)
    if observed is not None:
        warnings += capacity_warnings(settings, observed, nudged=nudged)
    return CapacityReport(
        expected_events_per_day=settings.expected_events_per_day,
        observed_events_per_day=observed,
        tick_prune_rows=tick_prune_rows(settings, observed),
        ceilings=ceilings(settings, observed),
        warnings=warnings,
        drain_mode=drain_mode(settings, observed),
        nudged=nudged,
    )
