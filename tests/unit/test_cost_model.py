"""The cost model (issue #17): USD per million events from the work per event and the list
prices, in both EFS throughput modes; ``docs/operations.md`` shows what it computes."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from rhumbatron.operator.cost_model import (
    EfsMode,
    Prices,
    Workload,
    cost_per_million,
    cost_table,
    efs_write_iops,
)

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_an_elastic_commit_costs_what_the_issue_measured() -> None:
    # about $1.4 × 10⁻⁵ a commit: its metered operations, each at least 32 KiB
    workload, prices = Workload(), Prices()
    per_commit = (
        prices.efs_min_operation_bytes
        / 1e9
        * (
            workload.efs_write_ops_per_commit * prices.efs_elastic_write_gb
            + workload.efs_read_ops_per_commit * prices.efs_elastic_read_gb
        )
    )
    assert per_commit == pytest.approx(1.4e-5, rel=0.1)
    # and EFS I/O per million events is that times the commits per event
    cost = cost_per_million(100_000_000, EfsMode.ELASTIC)
    commits = sum(workload.commits_per_event.values())
    assert cost.items["efs_io"] == pytest.approx(per_commit * commits * 1e6)


def test_every_item_scales_with_what_it_is_billed_for() -> None:
    base = cost_per_million(10_000_000)
    # twice the Lambda time: twice the compute, nothing else moves
    slower = cost_per_million(10_000_000, workload=Workload(lambda_ms_per_event=5.5))
    assert slower.items["lambda_compute"] == pytest.approx(2 * base.items["lambda_compute"])
    assert slower.items["efs_io"] == base.items["efs_io"]
    # the cluster is a fixed cost: per event it falls as the volume rises (within a tier)
    assert cost_per_million(1_000_000).items["nats_cluster"] == pytest.approx(
        10 * base.items["nats_cluster"]
    )
    # an archive object per 100 events: 10 PUTs per 1,000 at $0.005 per 1,000
    assert base.items["s3_puts"] == pytest.approx(0.05)
    assert math.isclose(base.total, sum(base.items.values()))


def test_provisioned_throughput_is_cheaper_at_volume_but_caps_the_write_iops() -> None:
    elastic = cost_per_million(100_000_000, EfsMode.ELASTIC)
    provisioned = cost_per_million(100_000_000, EfsMode.PROVISIONED)
    assert provisioned.total < elastic.total
    # the peak's write operations: 1,157 events a second × 3 × the commits × their writes
    iops = efs_write_iops(Workload(), 100_000_000)
    assert provisioned.efs_write_iops_at_peak == iops
    assert iops == pytest.approx(100_000_000 / 86_400 * 3 * 1.932 * 5, rel=0.01)
    assert not provisioned.efs_iops_fit  # one file system's 7,000 are not enough
    assert cost_per_million(1_000_000, EfsMode.PROVISIONED).efs_iops_fit


def test_fewer_publisher_commits_lower_the_cost() -> None:
    fewer = dict(Workload().commits_per_event, publisher=0.2)
    lean = dataclasses.replace(Workload(), commits_per_event=fewer)
    assert cost_per_million(10**8, workload=lean).total < cost_per_million(10**8).total
    assert lean.commits_beside_the_actor == pytest.approx(0.282)


def test_the_operations_page_shows_the_table_the_model_computes() -> None:
    assert cost_table() in OPERATIONS.read_text()
