"""``rhumbatron doctor``: what a deployment (or the local stack) needs, checked one by one,
each failing check with what to do about it.

Checks, in order: the state directory (it exists or can be made, takes a write, and its
journal mode is safe on its filesystem); the settings (the retention windows nest — the
settings would not load otherwise — and the ceilings carry the volume sized for); NATS
(reachable); durability (every node syncs every write, when demanded); the streams (each
exists with the settings' retention, duplicate window and replicas); S3 (the archive bucket
answers); the credentials (the API's tokens or JWT settings, the S3 credentials, Clef-flash's
key). A check that cannot run because an earlier one failed (the streams without NATS) says
so. Nothing is changed: ``rhumbatron streams`` creates or reconciles the streams.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rhumbatron.core.settings import Settings
from rhumbatron.errors import NatsUnavailableError, RhumbatronError, UnsafeStorageError

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = ["DoctorCheck", "DoctorHost", "diagnose"]

CheckStatus = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class DoctorCheck:
    """One check: ``ok``, ``warn`` (works, with a caveat) or ``fail`` (and ``fix``)."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


class DoctorHost(Protocol):
    """What the checks read of the runtime."""

    @property
    def settings(self) -> Settings: ...

    async def nats(self) -> NATS: ...

    def s3(self) -> Any: ...


async def diagnose(app: DoctorHost) -> list[DoctorCheck]:
    """Every check, in order (see the module)."""
    settings = app.settings
    checks = [_state_directory(settings), *_sizing(settings)]
    nc: NATS | None = None
    try:
        nc = await app.nats()
        checks.append(DoctorCheck("nats", "ok", f"connected to {settings.nats_url}"))
    except (NatsUnavailableError, RhumbatronError) as exc:
        checks.append(
            DoctorCheck(
                "nats",
                "fail",
                str(exc),
                "start nats-server, or set RHUMBATRON_NATS_URL to a server that answers",
            )
        )
    checks.append(await asyncio.to_thread(_durability, settings))
    checks += await _streams(settings, nc)
    checks.append(await asyncio.to_thread(_archive_bucket, app))
    checks += _credentials(settings)
    return checks


def _state_directory(settings: Settings) -> DoctorCheck:
    from rhumbatron.actors.storage import check_journal_mode

    state = settings.state_dir
    fix = "set RHUMBATRON_STATE_DIR to a directory this process can write"
    try:
        state.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=state, prefix=".doctor-"):
            pass
    except OSError as exc:
        return DoctorCheck("state directory", "fail", f"{state}: {exc}", fix)
    try:
        check_journal_mode(settings)
    except UnsafeStorageError as exc:
        return DoctorCheck(
            "state directory", "fail", str(exc), "set RHUMBATRON_JOURNAL_MODE=DELETE"
        )
    return DoctorCheck(
        "state directory", "ok", f"{state} is writable ({settings.journal_mode} journal)"
    )


def _sizing(settings: Settings) -> list[DoctorCheck]:
    from rhumbatron.router.capacity import sizing_warnings

    retention = DoctorCheck(
        "retention windows",
        "ok",
        "every window nests as the retention rules need (the settings load only then)",
    )
    warnings = sizing_warnings(settings)
    if not warnings:
        sized = DoctorCheck(
            "ceilings",
            "ok",
            f"carry the {settings.expected_events_per_day:,} events a day sized for",
        )
        return [retention, sized]
    fix = "raise the settings each warning names, or RHUMBATRON_EXPECTED_EVENTS_PER_DAY's drain"
    return [retention, DoctorCheck("ceilings", "warn", "; ".join(warnings), fix)]


def _durability(settings: Settings) -> DoctorCheck:
    from rhumbatron.messaging.durability import check_durability

    if not settings.require_durable_jetstream:
        return DoctorCheck(
            "durability",
            "ok",
            "not demanded (RHUMBATRON_REQUIRE_DURABLE_JETSTREAM off: the embedded default)",
        )
    try:
        verified = check_durability(settings)
    except UnsafeStorageError as exc:
        fix = "run every node with sync_interval: always, and list every node's monitor"
        return DoctorCheck("durability", "fail", str(exc), fix)
    return DoctorCheck("durability", "ok", f"every write synced on {', '.join(sorted(verified))}")


async def _streams(settings: Settings, nc: NATS | None) -> list[DoctorCheck]:
    from nats.js.errors import NotFoundError

    from rhumbatron.messaging.streams import wanted_streams

    if nc is None:
        return [DoctorCheck("streams", "fail", "not checked: NATS cannot be reached", "")]
    js = nc.jetstream()
    missing: list[str] = []
    drifted: list[str] = []
    for wanted in wanted_streams(settings):
        name = str(wanted.name)
        try:
            config = (await js.stream_info(name)).config
        except NotFoundError:
            missing.append(name)
            continue
        for field, want in (
            ("max_age", wanted.max_age),
            ("duplicate_window", wanted.duplicate_window),
            ("num_replicas", wanted.num_replicas or 1),
        ):
            have = getattr(config, field) or (1 if field == "num_replicas" else 0)
            if round(float(have), 3) != round(float(want or 0), 3):
                drifted.append(f"{name} {field} {have:g} (settings: {want:g})")
    fix = "run `rhumbatron streams` (it creates and reconciles them)"
    if missing:
        return [DoctorCheck("streams", "fail", f"missing: {', '.join(missing)}", fix)]
    if drifted:
        return [DoctorCheck("streams", "warn", "; ".join(drifted), fix)]
    count = len(wanted_streams(settings))
    return [DoctorCheck("streams", "ok", f"all {count} exist with the settings' limits")]


def _archive_bucket(app: DoctorHost) -> DoctorCheck:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket = app.settings.evidence_bucket
    try:
        app.s3().head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        fix = (
            f"create the bucket {bucket}, or set RHUMBATRON_EVIDENCE_BUCKET to one that exists"
            if code in ("404", "NoSuchBucket", "NotFound")
            else "give this role s3:ListBucket on the bucket (HeadBucket), or check the region"
        )
        return DoctorCheck("archive bucket", "fail", f"{bucket}: {code} {exc}", fix)
    except BotoCoreError as exc:
        fix = "check RHUMBATRON_S3_ENDPOINT_URL (locally) or the network path to S3"
        return DoctorCheck("archive bucket", "fail", f"{bucket}: {exc}", fix)
    return DoctorCheck("archive bucket", "ok", f"{bucket} answers")


def _credentials(settings: Settings) -> list[DoctorCheck]:
    import boto3

    checks: list[DoctorCheck] = []
    if settings.api_auth_mode == "static" and not settings.api_tokens:
        checks.append(
            DoctorCheck(
                "api tokens",
                "warn",
                "no RHUMBATRON_API_TOKENS: the operator API refuses every request (401)",
                "set RHUMBATRON_API_TOKENS, or RHUMBATRON_API_AUTH_MODE=jwt in the cloud",
            )
        )
    else:
        checks.append(DoctorCheck("api tokens", "ok", f"{settings.api_auth_mode} mode"))
    if settings.s3_endpoint_url is None and boto3.Session().get_credentials() is None:
        checks.append(
            DoctorCheck(
                "aws credentials",
                "fail",
                "no AWS credentials for S3",
                "run with a role, or set AWS_PROFILE / the AWS_ACCESS_KEY_ID pair",
            )
        )
    else:
        where = settings.s3_endpoint_url or "AWS"
        checks.append(DoctorCheck("aws credentials", "ok", f"S3 at {where}"))
    if settings.clef_flash_api_key or settings.clef_flash_api_key_secret_arn:
        checks.append(DoctorCheck("clef-flash key", "ok", "set"))
    else:
        checks.append(
            DoctorCheck(
                "clef-flash key",
                "warn",
                "none: Clef-flash abstains on every ambiguous overlap (the first claimant wakes)",
                "set RHUMBATRON_CLEF_FLASH_API_KEY (or its secret's ARN in the cloud)",
            )
        )
    return checks
