"""``rhumbatron doctor`` (issue #20): each check of what a deployment needs, against a real
nats-server and moto's S3 server, and what it says to do when one fails; the command's output
and exit status as an operator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.operator.doctor import diagnose
from rhumbatron.runtime.bootstrap import bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(
    tmp_path: Path, nats_server: NatsServerProcess, s3_server: S3ServerProcess
) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        s3_endpoint_url=s3_server.endpoint_url,
        # Its own bucket: moto's server outlives the test.
        evidence_bucket=f"doctor-{uuid.uuid4().hex[:12]}",
        api_tokens={"doctor-token-aaaaaaaaaaaa": {"tenant": "*", "scopes": ["audit:read"]}},
    )


def _bucket(settings: Settings) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    s3.create_bucket(Bucket=settings.evidence_bucket)


async def test_a_ready_stack_passes_every_check_and_a_missing_piece_is_named_with_its_fix(
    settings: Settings,
) -> None:
    # GIVEN a stack whose streams do not exist yet and whose archive bucket is missing
    app = bootstrap(settings)
    try:
        checks = {check.name: check for check in await diagnose(app)}
        # THEN those two fail, each with what to do; the rest pass (Clef-flash: a warning)
        assert {name: c.status for name, c in checks.items() if c.status != "ok"} == {
            "streams": "fail",
            "archive bucket": "fail",
            "clef-flash key": "warn",
        }
        assert checks["streams"].fix == "run `rhumbatron streams` (it creates and reconciles them)"
        assert checks["streams"].detail.startswith("missing: EVENTS_00")
        assert f"create the bucket {settings.evidence_bucket}" in checks["archive bucket"].fix
        # WHEN the streams and the bucket are made
        await app.ensure_streams()
        _bucket(settings)
        after = {check.name: check.status for check in await diagnose(app)}
        # THEN every check passes but the missing Clef-flash key
        assert [name for name, status in after.items() if status != "ok"] == ["clef-flash key"]
    finally:
        await app.close()


async def test_a_stream_whose_limits_drifted_from_the_settings_is_a_warning(
    settings: Settings,
) -> None:
    app = bootstrap(settings)
    try:
        await app.ensure_streams()
    finally:
        await app.close()
    # GIVEN the settings now keep events 3 days, while the streams keep them 7
    shorter = settings.model_copy(update={"event_stream_max_age_days": 3})
    app = bootstrap(shorter)
    try:
        [streams] = [c for c in await diagnose(app) if c.name == "streams"]
    finally:
        await app.close()
    assert streams.status == "warn"
    assert "EVENTS_00 max_age 604800 (settings: 259200)" in streams.detail


def test_the_command_prints_each_check_and_exits_1_when_one_failed(
    settings: Settings, nats_server: NatsServerProcess
) -> None:
    # GIVEN NATS stopped
    nats_server.stop()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHUMBATRON_")}
    env |= {
        "RHUMBATRON_STATE_DIR": str(settings.state_dir),
        "RHUMBATRON_NATS_URL": settings.nats_url,
        "RHUMBATRON_NATS_CONNECT_TIMEOUT_S": "0.5",
        "RHUMBATRON_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
        "RHUMBATRON_EVIDENCE_BUCKET": settings.evidence_bucket,
    }
    run = [sys.executable, "-m", "rhumbatron.cli", "doctor"]
    # WHEN the doctor runs, as a table and as JSON
    table = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=False)
    as_json = subprocess.run(
        [*run, "--json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    # THEN it exits 1, naming NATS as failed with what to do, and the streams as unchecked
    assert table.returncode == as_json.returncode == 1, table.stderr
    assert "FAIL  nats: " in table.stdout
    assert "      fix: start nats-server, or set RHUMBATRON_NATS_URL" in table.stdout
    checks = {c["name"]: c for c in json.loads(as_json.stdout)}
    assert checks["streams"]["detail"] == "not checked: NATS cannot be reached"
    assert checks["state directory"]["status"] == "ok"
