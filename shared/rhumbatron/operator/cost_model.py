"""What a million events cost on AWS, from what the code does per event and the list prices.

A first-order model (issue #17): the measured work per event (SQLite commits per role, Lambda
time, S3 PUTs) times the unit prices, plus the fixed cost of the 3-node NATS cluster spread
over the day's events. It covers both EFS throughput modes:

* **Elastic** bills every read and write by the data moved, each operation at no less than
  32 KiB. A SQLite commit on EFS is several metered operations (the WAL's pages, its fsync,
  the lock and shared-memory traffic); ``efs_ops_per_commit`` says how many.
* **Provisioned** bills a fixed throughput per month instead, but a file system caps its
  write operations a second (``efs_max_write_iops``): the model says how many it needs.

The prices are the us-east-1 list prices the model was written with (:class:`Prices`, each a
field to change); the work per event is measured (``docs/performance.md``: SQLite commits per
event by role at 500 events/s; pipeline CPU per event). ``docs/operations.md`` shows the table
:func:`cost_table` prints, and a test holds the two to each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "CostBreakdown",
    "EfsMode",
    "Prices",
    "Workload",
    "cost_per_million",
    "cost_table",
    "efs_write_iops",
]

_SECONDS_PER_MONTH = 730 * 3_600
_DAYS_PER_MONTH = 730 / 24
_KIB = 1_024
_GB = 1_000_000_000


class EfsMode(StrEnum):
    ELASTIC = "elastic"
    PROVISIONED = "provisioned"


@dataclass(frozen=True, slots=True)
class Prices:
    """AWS list prices, us-east-1, as the model assumes them (USD)."""

    lambda_gb_second: float = 0.0000133334  # arm64
    lambda_request: float = 0.20 / 1_000_000
    efs_elastic_read_gb: float = 0.03
    efs_elastic_write_gb: float = 0.06
    efs_min_operation_bytes: int = 32 * _KIB
    efs_provisioned_mibps_month: float = 6.00
    efs_storage_gb_month: float = 0.30
    s3_put: float = 0.005 / 1_000
    s3_storage_gb_month: float = 0.023
    ec2_m7g_large_hour: float = 0.0816
    gp3_gb_month: float = 0.08
    gp3_iops_month: float = 0.005  # above the 3,000 included
    gp3_mibps_month: float = 0.040  # above the 125 MiB/s included


@dataclass(frozen=True, slots=True)
class Workload:
    """What the code does per event, measured (``docs/performance.md``), and the
    deployment's shape."""

    #: SQLite commits per event by role. The actor's own transaction is the write itself;
    #: the publisher commits once per publish_due; the projector once per fetch; the
    #: archiver, analytics and reactions once per fetch of 100 in drain mode.
    commits_per_event: dict[str, float] = field(
        default_factory=lambda: {
            "actor": 1.02,
            "publisher": 0.83,
            "projector": 0.05,
            "archiver": 0.01,
            "analytics": 0.01,
            "reactions": 0.01,
            "product": 0.002,
        }
    )
    #: Metered EFS operations per commit (WAL pages, fsync, locks, shared memory): about
    #: 7.6 operations of 32 KiB makes the issue's $1.4 × 10⁻⁵ per commit on Elastic.
    efs_write_ops_per_commit: float = 5.0
    efs_read_ops_per_commit: float = 5.0
    #: Lambda time per event over every role (publisher, router, queues), at the memory size.
    lambda_ms_per_event: float = 2.75
    lambda_memory_gb: float = 0.5
    #: Lambda invocations per event (alarm fires, nudges; the schedules are negligible).
    lambda_invocations_per_event: float = 1.2
    #: The archive writes one object per fetch of 100 events.
    s3_puts_per_event: float = 0.01
    #: Bytes an event keeps on EFS (outbox row, views, claims) and in S3 (the archive).
    efs_bytes_per_event: int = 3 * _KIB
    s3_bytes_per_event: int = 1 * _KIB
    #: How long each is kept: the outbox's 7 days, the claims' 14; the archive's 365.
    efs_days_kept: float = 14.0
    s3_days_kept: float = 365.0
    #: The write IOPS one EFS file system allows in the Provisioned mode's General Purpose
    #: performance mode (Elastic allows more).
    efs_max_write_iops: int = 7_000
    #: Peak rate over the day's average the IOPS are sized for.
    peak_over_average: float = 3.0

    @property
    def commits_beside_the_actor(self) -> float:
        """Commits per event of every role but the actor's own transaction."""
        return sum(v for role, v in self.commits_per_event.items() if role != "actor")


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """USD per million events at ``events_per_day``, by item."""

    events_per_day: int
    efs_mode: EfsMode
    items: dict[str, float]
    #: EFS write operations a second at the peak, and whether the mode allows them.
    efs_write_iops_at_peak: float
    efs_iops_fit: bool

    @property
    def total(self) -> float:
        return sum(self.items.values())


def efs_write_iops(workload: Workload, events_per_day: int) -> float:
    """EFS write operations a second at the peak rate."""
    per_second = events_per_day / 86_400 * workload.peak_over_average
    commits = sum(workload.commits_per_event.values())
    return per_second * commits * workload.efs_write_ops_per_commit


def _nats_cluster_month(prices: Prices, events_per_day: int) -> float:
    """Three m7g.large nodes and their gp3 volumes, sized by the tier of infra's Sizing."""
    large = events_per_day > 10_000_000
    volume_gib, iops, mibps = (1_500, 10_000, 250) if large else (250, 3_000, 125)
    per_node = (
        prices.ec2_m7g_large_hour * 730
        + volume_gib * prices.gp3_gb_month
        + max(0, iops - 3_000) * prices.gp3_iops_month
        + max(0, mibps - 125) * prices.gp3_mibps_month
    )
    return 3 * per_node


def cost_per_million(
    events_per_day: int,
    efs_mode: EfsMode = EfsMode.ELASTIC,
    workload: Workload | None = None,
    prices: Prices | None = None,
) -> CostBreakdown:
    """USD per million events at ``events_per_day``, by item."""
    workload = workload or Workload()
    prices = prices or Prices()
    million = 1_000_000
    commits = sum(workload.commits_per_event.values()) * million
    op_gb = prices.efs_min_operation_bytes / _GB
    events_per_month = events_per_day * _DAYS_PER_MONTH
    items: dict[str, float] = {}
    iops = efs_write_iops(workload, events_per_day)
    if efs_mode is EfsMode.ELASTIC:
        items["efs_io"] = (
            commits
            * op_gb
            * (
                workload.efs_write_ops_per_commit * prices.efs_elastic_write_gb
                + workload.efs_read_ops_per_commit * prices.efs_elastic_read_gb
            )
        )
        fits = True
    else:
        # Throughput for the peak's operations (each at least the minimum size).
        mibps = iops * prices.efs_min_operation_bytes / (1_024 * 1_024)
        items["efs_io"] = mibps * prices.efs_provisioned_mibps_month / events_per_month * million
        fits = iops <= workload.efs_max_write_iops
    stored_gb = events_per_day * workload.efs_days_kept * workload.efs_bytes_per_event / _GB
    items["efs_storage"] = stored_gb * prices.efs_storage_gb_month / events_per_month * million
    items["lambda_compute"] = (
        workload.lambda_ms_per_event / 1_000 * workload.lambda_memory_gb * prices.lambda_gb_second
    ) * million
    items["lambda_requests"] = (
        workload.lambda_invocations_per_event * prices.lambda_request * million
    )
    items["s3_puts"] = workload.s3_puts_per_event * prices.s3_put * million
    archived_gb = events_per_day * workload.s3_days_kept * workload.s3_bytes_per_event / _GB
    items["s3_storage"] = archived_gb * prices.s3_storage_gb_month / events_per_month * million
    items["nats_cluster"] = _nats_cluster_month(prices, events_per_day) / events_per_month * million
    return CostBreakdown(events_per_day, efs_mode, items, iops, fits)


def cost_table(workload: Workload | None = None, prices: Prices | None = None) -> str:
    """The Markdown table ``docs/operations.md`` shows: USD per million events at 10⁶, 10⁷
    and 10⁸ a day in both EFS modes, with the largest item and the EFS IOPS at the peak."""
    lines = [
        "| events a day | EFS mode | $ per million events | largest item "
        "| EFS write IOPS at peak |",
        "|---|---|---|---|---|",
    ]
    for per_day in (1_000_000, 10_000_000, 100_000_000):
        for mode in EfsMode:
            cost = cost_per_million(per_day, mode, workload, prices)
            largest = max(cost.items, key=cost.items.__getitem__)
            share = cost.items[largest] / cost.total
            fit = "" if cost.efs_iops_fit else " (over the mode's limit)"
            lines.append(
                f"| {per_day:,} | {mode.value} | {cost.total:.2f} | {largest} "
                f"({share:.0%}) | {cost.efs_write_iops_at_peak:,.0f}{fit} |"
            )
    return "\n".join(lines)
