"""Every tunable of Rhumbatron, with the specification's value as its default.

Settings come from ``RHUMBATRON_*`` environment variables (the Lambda functions' environment
in ``template.yaml``) or from keyword arguments (tests). Each name carries its unit. A value
that cannot work raises :class:`~rhumbatron.errors.ConfigurationError` naming the setting.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from rhumbatron.errors import ConfigurationError
from rhumbatron.redaction import describe_input

__all__ = ["Settings", "load_settings"]


# -- API --- (the operator API, rhumbatron.api: token grants; its fields are in Settings) -----

#: The operator API's scopes: read dead letters; retry or dismiss them; send a command.
ApiScope = Literal[
    "dead-letters:read",
    "dead-letters:write",
    "commands:send",
    "projects:read",
    "projects:write",
    "changes:read",
    "changes:write",
    "agents:read",
    "agents:write",
    "replay:write",
    "consumers:read",
    "consumers:write",
    "audit:read",
]
#: A grant's tenant that sees every tenant's records (a platform operator: letters of
#: commands such as forks.sweep carry no tenant).
ANY_TENANT = "*"


class ApiTokenGrant(BaseModel):
    """What one static API token may do: act for ``tenant`` with ``scopes``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str = Field(min_length=1, max_length=64, description='A tenant ID, or "*" for all.')
    scopes: tuple[ApiScope, ...] = ()


# -- end of API ---------------------------------------------------------------------------------


class Settings(BaseSettings):
    """Rhumbatron's configuration. Defaults are the specification's numbers."""

    model_config = SettingsConfigDict(env_prefix="RHUMBATRON_", frozen=True, extra="forbid")

    # -- where state lives -------------------------------------------------------------------
    state_dir: Path = Field(
        default=Path(".rhumbatron/state"),
        description="Actor SQLite files. /mnt/state on EFS in the cloud.",
    )
    journal_mode: Literal["WAL", "DELETE"] = Field(
        default="WAL", description="SQLite journal mode. WAL cannot work on EFS/NFS: use DELETE."
    )
    network_filesystem: bool | None = Field(
        default=None,
        description="Whether state_dir is on a network filesystem; None detects it from mounts.",
    )
    sqlite_busy_timeout_ms: int = Field(default=5_000, ge=0)
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"

    # -- NATS / JetStream ---------------------------------------------------------------------
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="One NATS URL, or several comma-separated seeds of a cluster.",
    )
    nats_connect_timeout_s: float = Field(default=2.0, gt=0)
    nats_ping_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the client pings the server it is connected to; two pings "
        "unanswered and it reconnects to another node. A stalled server (a paused VM) keeps "
        "its TCP connection open: nats-py's default of 2 minutes would hold every request for "
        "up to 4.",
    )
    event_stream_max_age_days: float = Field(default=7, gt=0)
    command_stream_max_age_days: float = Field(default=14, gt=0)
    duplicate_window_s: float = Field(default=2 * 3600, gt=0)
    stream_replicas: int = Field(default=1, ge=1, le=5)
    require_durable_jetstream: bool = Field(
        default=False,
        description="Refuse to start unless streams have >= 3 replicas and sync_interval: always.",
    )
    nats_monitor_urls: str | None = Field(
        default=None,
        description="Every nats-server's monitoring URL (http://host:8222), comma-separated, "
        "one per node: the durability check reads each node's /varz (sync_interval).",
    )
    nats_tls_ca_secret_arn: str | None = Field(
        default=None,
        description="A Secrets Manager secret holding the PEM of the CA that signed the NATS "
        "servers' certificates (a private CA, infra/README.md); None trusts the default store.",
    )
    nats_credentials_secret_arn: str | None = Field(
        default=None,
        description="A Secrets Manager secret the client authenticates to NATS with (the cloud): "
        'JSON {"user", "password"}, {"token"}, {"nkey_seed"} or {"creds": "<.creds file>"}. '
        "None or empty connects without credentials.",
    )
    secret_max_age_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a secret read from Secrets Manager (the NATS credentials and CA, "
        "the Anthropic key) is kept before the next use reads it again: a rotated secret "
        "reaches a warm container within this age, without a cold start.",
    )

    # -- outbox publisher ---------------------------------------------------------------------
    publish_max_rows_per_project: int = Field(default=100, ge=1, le=1000)
    publish_ack_timeout_s: float = Field(default=5.0, gt=0)
    publish_unavailable_retry_s: float = Field(
        default=0.5,
        gt=0,
        le=1.0,
        description="While the log cannot take a write (no responders, no PubAck in time, a "
        "leader election or quorum loss), the publisher sends the same row again this often, "
        "counting no attempt: at least once a second, so the write stall after a leader loss "
        "is about the re-election time.",
    )
    publish_unavailable_wait_s: float = Field(
        default=30.0,
        ge=0,
        description="How long one publish run waits for a log that cannot take writes before "
        "it leaves the rows pending (attempts untouched) for the next fire. Below the "
        "publisher function's timeout (60 s in template.yaml).",
    )
    publish_concurrency: int = Field(
        default=16,
        ge=1,
        le=64,
        description="Actors published at once by one process (order is per actor, so safe). "
        "16 halves the commit-to-stream latency of 4 at 500 events/s (docs/performance.md).",
    )
    publish_batch_mode: Literal["auto", "atomic", "fast", "off"] = Field(
        default="auto",
        description="How a project's due rows go to JetStream. atomic: one all-or-nothing "
        "batch stored with one fsync (best where the server syncs every write); fast: a "
        "fast-ingest batch, each row stored as it arrives and nothing after a lost one "
        "(best where the server syncs periodically); off: one publish per row, each awaiting "
        "its PubAck. auto: atomic when require_durable_jetstream (sync_interval: always), "
        "else fast. Measured in docs/performance.md.",
    )
    reconcile_window_days: float | None = Field(
        default=None,
        gt=0,
        description="Days back that reconciliation proves the log holds every event the "
        "outbox published (rhumbatron reconcile); unset: the event stream's retention. "
        "Published outbox rows are kept at least this long.",
    )
    reconcile_proof_every_hours: float = Field(
        default=1.0,
        ge=0,
        le=24,
        description="How often the sweep runs the full proof (by event ID, on every replica) "
        "of each event stream, on the first tick of the stream in each such period, over "
        "the events published in the last two periods (one missed tick is still covered); "
        "0: only the cheap check every tick and the proof on demand.",
    )
    outbox_backoff_initial_s: float = Field(default=1.0, gt=0)
    outbox_backoff_max_s: float = Field(default=300.0, gt=0)
    outbox_backoff_jitter: float = Field(default=0.2, ge=0, lt=1)
    outbox_max_attempts: int = Field(default=10, ge=1)
    outbox_published_retention_days: float = Field(default=7, gt=0)
    outbox_prune_batch_rows: int = Field(default=1_000, ge=1)
    max_event_bytes: int = Field(default=1024 * 1024, ge=1024)
    producer_bindings: tuple[int, ...] | None = Field(
        default=None,
        description="Stream indexes this publisher may send to; None binds all eight.",
    )

    # -- actors -------------------------------------------------------------------------------
    alarm_max_fires_per_day: int = Field(default=2_000, ge=1)
    resource_shard_count: int = Field(default=16, ge=1, le=256)

    # -- event router -------------------------------------------------------------------------
    router_fetch_max_records: int = Field(
        default=100, ge=1, le=1000, description="Records one consume fetches (spec: at most 100)."
    )
    router_fetch_timeout_s: float = Field(
        default=2.0, gt=0, description="Bound on one no-wait pull; an empty stream answers at once."
    )
    router_consumes_per_run: int = Field(
        default=2, ge=1, description="Consumes per subscription in one nudge or sweep run."
    )
    router_nudge_turn_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How long a nudge run holds its stream's turn when the invocation names no "
            "deadline (the router-nudge function's timeout); a holder that dies frees it then."
        ),
    )
    router_apply_calls_per_run: int = Field(
        default=15, ge=1, description="ProjectView.apply_delta calls per run, per stream."
    )
    router_nak_delay_s: float = Field(default=30.0, ge=0, description="Redelivery after a nack.")
    router_ack_wait_s: float = Field(
        default=300.0, gt=0, description="An unacknowledged batch comes back after this."
    )
    router_max_ack_pending: int = Field(default=1_000, ge=1)
    router_max_failures: int = Field(
        default=5, ge=1, description="The failure that makes a poison event a dead letter."
    )
    router_nudge_function: str | None = Field(
        default=None,
        description="The router-nudge Lambda the publisher invokes asynchronously after a "
        "publish (the cloud); None nudges in process or not at all.",
    )
    router_drain_mode: bool | None = Field(
        default=None,
        description=(
            "Whether the archiver, analytics and reactions drain on nudges and on every "
            "stream at each tick. None (the default) decides from the sizing: on above half "
            "of what their sweep-only cadence carries a day (router.capacity.drain_mode)."
        ),
    )
    router_drain_max_fetches: int = Field(
        default=1_000,
        ge=1,
        description=(
            "In drain mode (a sizing above what the sweep alone carries), the most fetches a "
            "run makes for the archiver, analytics and reactions of one stream; a run also "
            "stops on a short fetch (caught up) or when its invocation's time is up."
        ),
    )
    archive_batch_size: int = Field(default=100, ge=1, le=1000)
    archive_batches_per_tick: int = Field(default=1, ge=1)
    analytics_batch_size: int = Field(default=100, ge=1, le=1000)
    analytics_batches_per_tick: int = Field(default=1, ge=1)
    processed_events_retention_days: float = Field(default=14, gt=0)
    processed_events_prune_cap: int = Field(
        default=5_000, ge=1, description="processed_events rows the daily prune deletes at most."
    )
    expected_events_per_day: int = Field(
        default=1_000,
        ge=1,
        description=(
            "The volume (all streams) this deployment is sized for. At the default the "
            "spec's daily prune keeps up; above it, every other sweep tick prunes too, in "
            "chunks sized for twice this inflow (or the observed rate, when higher)."
        ),
    )
    maintenance_time_utc: str = Field(
        default="04:17", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="Daily tick."
    )
    release_sweep_every_min: int = Field(
        default=5, ge=1, le=60, description="Release-sweep ticks: minutes 4, 9, 14 … of an hour."
    )
    router_capacity_check_every_s: float = Field(
        default=3_600.0,
        gt=0,
        description=(
            "How often a warm router measures the streams' event rate again: its capacity "
            "warnings and drain mode follow the rate, not only the first sweep's."
        ),
    )
    router_rate_min_span_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A stream's observed rate counts once its messages span this long on the server's "
            "clock: a shorter span tells too little."
        ),
    )
    router_freshness_flush_s: float = Field(
        default=60.0,
        ge=0,
        description="Freshness points stay in memory; a run's end writes them this often.",
    )
    view_latest_events: int = Field(
        default=20, ge=1, description="Latest events a project view shows."
    )
    lag_metrics_retention_days: float = Field(
        default=30, gt=0, description="METRICS rows (lag, backlog) kept in platform_metrics."
    )
    audit_retention_days: float = Field(
        default=365,
        gt=0,
        description=(
            "Rows of the audit log (every mutation asked of the API) kept in the product "
            "database; the daily maintenance deletes older ones."
        ),
    )
    event_metrics_retention_days: float = Field(
        default=90,
        gt=0,
        description=(
            "EVENT_METRICS rows (one per lifecycle Event: the analytics) kept in "
            "platform_metrics. CloudWatch keeps the same points 15 months in the cloud; "
            "the table is the local record and the dashboards' recent window."
        ),
    )
    metrics_prune_cap: int = Field(default=200_000, ge=1)
    metrics_emf: bool = Field(
        default=False, description="Also print metrics as CloudWatch EMF lines (on in Lambda)."
    )

    # -- command queues ------------------------------------------------------------------------
    command_ack_wait_s: float = Field(
        default=60.0, gt=0, description="A queue consumer's ack wait; in-progress marks extend it."
    )
    command_in_progress_s: float = Field(
        default=30.0,
        gt=0,
        description="A running handler's message is marked in progress this often.",
    )
    command_max_hold_s: float = Field(
        default=900.0, gt=0, description="How long a handler may hold a message (15 minutes)."
    )
    command_send_timeout_s: float = Field(default=5.0, gt=0)
    queue_retry_delay_s: dict[str, float] = Field(
        default_factory=dict,
        description="Per-queue retry delay overriding the QUEUE_CONSUMERS table (tests).",
    )
    queue_concurrency: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Handlers a queue's consumer runs at once, by queue, overriding the "
            'QUEUE_CONSUMERS table\'s (sizing; e.g. {"agent-wakeups": 8}).'
        ),
    )

    # -- archive (S3) -------------------------------------------------------------------------
    evidence_bucket: str = "rhumbatron-evidence"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    lambda_endpoint_url: str | None = Field(
        default=None, description="Lambda API endpoint override (tests; None in the cloud)."
    )
    lambda_timeout_s: float = Field(default=2.0, gt=0, description="Lambda invoke timeout.")
    s3_timeout_s: float = Field(default=5.0, gt=0, description="S3 connect and read timeout.")
    archive_max_age_days: float = Field(default=365, gt=0)
    archive_expiry_pass: bool = Field(
        default=True,
        description="Delete expired archive objects in the daily tick (a store without lifecycle "
        "rules); off in the cloud, where the bucket's lifecycle rule expires them.",
    )
    archive_expiry_max_objects: int = Field(default=1_000, ge=1)

    # -- API --- (the operator API, rhumbatron.api) --------------------------------------------
    api_auth_mode: Literal["static", "jwt"] = Field(
        default="static",
        description="static: bearer tokens from api_tokens (local); jwt: signed JWTs (the cloud).",
    )
    api_tokens: dict[str, ApiTokenGrant] = Field(
        default_factory=dict,
        repr=False,  # the keys are secrets: keep them out of logs and tracebacks
        description='static mode: bearer token -> {"tenant": ..., "scopes": [...]}, as JSON in '
        "RHUMBATRON_API_TOKENS. Empty refuses every request.",
    )
    api_jwt_secret: SecretStr | None = Field(
        default=None, description="jwt mode: the HS256 shared secret."
    )
    api_jwt_public_key: str | None = Field(
        default=None, description="jwt mode: the RS256 public key (PEM)."
    )
    api_jwt_jwks_url: str | None = Field(
        default=None, description="jwt mode: a JWKS URL serving the RS256 keys (by kid)."
    )
    api_jwt_issuer: str | None = Field(default=None, description="jwt mode: the required iss.")
    api_jwt_audience: str | None = Field(default=None, description="jwt mode: the required aud.")
    api_jwt_tenant_claim: str = Field(
        default="tenant", min_length=1, description="jwt mode: the claim naming the tenant."
    )
    api_jwt_leeway_s: float = Field(
        default=30.0, ge=0, le=300, description="Clock skew allowed on exp, nbf and iat."
    )
    api_jwt_max_lifetime_s: float = Field(
        default=86_400.0,
        gt=0,
        description="The longest a JWT may live: its exp may be at most this far after now "
        "(and after its iat); a token minted for longer is refused (401).",
    )
    api_max_body_bytes: int = Field(
        default=1_048_576,
        ge=1,
        description="The largest request body the API reads (1 MiB); a larger one is answered "
        "413 before it is read whole.",
    )
    api_retry_after_s: int = Field(
        default=5, ge=1, description="Retry-After of a 503 (NATS down, product file busy or full)."
    )
    api_retry_resend_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A Retry reservation this old with its send unconfirmed (its process died "
        "between reserving and sending) is sent again under the same message ID, which the "
        "duplicate window makes harmless; longer than any connect plus send.",
    )

    @model_validator(mode="before")
    @classmethod
    def _api_tokens_valid(cls, data: Any) -> Any:
        """Check the token grants here, before the field, so that no error message (which
        :func:`load_settings` prints with the offending input) ever contains a token: each
        grant is named by a fingerprint of its token instead."""
        import hashlib

        from pydantic import TypeAdapter

        tokens = data.get("api_tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, dict):
            return data  # absent, or not a mapping: the field's own error says so
        problems = []
        for token, grant in tokens.items():
            name = f"token sha256:{hashlib.sha256(str(token).encode()).hexdigest()[:8]}"
            if len(str(token)) < 16:
                problems.append(f"{name} is shorter than 16 characters (guessable)")
            try:
                TypeAdapter(ApiTokenGrant).validate_python(grant)
            except ValidationError as exc:
                for err in exc.errors(include_url=False):
                    where = ".".join(str(part) for part in err["loc"]) or "(grant)"
                    problems.append(f"{name}: {where}: {err['msg']}")
        if problems:
            raise ValueError("RHUMBATRON_API_TOKENS: " + "; ".join(problems))
        return data

    @field_validator("api_jwt_secret", "api_jwt_public_key", "api_jwt_jwks_url", mode="before")
    @classmethod
    def _empty_key_source_is_unset(cls, value: object) -> object:
        # A template parameter left blank arrives as "": it names no key source.
        return None if value == "" else value

    @model_validator(mode="after")
    def _jwt_settings_complete(self) -> Self:
        if self.api_auth_mode != "jwt":
            return self
        keys = [
            name
            for name in ("api_jwt_secret", "api_jwt_public_key", "api_jwt_jwks_url")
            if getattr(self, name) is not None
        ]
        if len(keys) != 1:
            raise ValueError(
                "RHUMBATRON_API_AUTH_MODE=jwt needs exactly one of RHUMBATRON_API_JWT_SECRET, "
                f"RHUMBATRON_API_JWT_PUBLIC_KEY, RHUMBATRON_API_JWT_JWKS_URL; got {keys or 'none'}"
            )
        missing = [
            f"RHUMBATRON_{name.upper()}"
            for name in ("api_jwt_issuer", "api_jwt_audience")
            if not getattr(self, name)
        ]
        if missing:
            raise ValueError(f"RHUMBATRON_API_AUTH_MODE=jwt needs {', '.join(missing)}")
        return self

    # -- end of API -----------------------------------------------------------------------------

    # -- causal routing --- (rhumbatron.causal: Clef-flash and the command cap) -----------------
    clef_flash_model: str = Field(
        default="claude-haiku-5-5",
        min_length=1,
        description="The Claude Haiku model Clef-flash asks (spec: one Claude Haiku call).",
    )
    clef_flash_api_key: SecretStr | None = Field(
        default=None,
        description="The Anthropic API key; None makes every Clef-flash question abstain "
        "(and so wake). ANTHROPIC_API_KEY is deliberately not read.",
    )
    clef_flash_timeout_s: float = Field(
        default=10.0, gt=0, description="Bound on one Clef-flash call; past it, abstain."
    )
    clef_flash_max_tokens: int = Field(
        default=512, ge=64, description="max_tokens of a Clef-flash call (one small tool call)."
    )
    clef_flash_threshold: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="Below this probability Clef-flash abstains (wakes); exactly it does not.",
    )
    clef_flash_max_calls_per_day: int = Field(
        default=200, ge=0, description="Clef-flash model calls per UTC day; past it, wake."
    )
    clef_flash_cap_scope: Literal["deployment", "tenant"] = Field(
        default="deployment",
        description="Whom the daily Clef-flash cap counts for: the deployment, or each tenant.",
    )
    change_command_cap_per_day: int = Field(
        default=1_000,
        ge=1,
        description="Counted commands (change.dispatch, candidate.create, change.settle, "
        "agent.wake) per Change per UTC day; the router drops the rest.",
    )
    anthropic_base_url: str | None = Field(
        default=None, description="Anthropic API base URL override (tests; None in the cloud)."
    )
    clef_flash_api_key_secret_arn: str | None = Field(
        default=None,
        description="A Secrets Manager secret holding the Anthropic API key as plain text, read "
        "once per process when clef_flash_api_key is not set (the cloud).",
    )
    # -- end of causal routing ------------------------------------------------------------------

    # -- Change lifecycle --- (rhumbatron.lifecycle, workflows, agents, indexing) ----------------
    max_active_agents_per_change: int = Field(
        default=8, ge=1, description="Agents active at once on one Change (assigned or running)."
    )
    integration_more_work_delay_s: float = Field(
        default=10.0,
        ge=0,
        description="A bounded integration command with more work asks for another delivery "
        "after this long.",
    )
    conflict_review_delay_s: float = Field(
        default=45.0,
        ge=0,
        description="A candidate.create waiting for a conflict review asks again after this long.",
    )
    workflow_engine: Literal["in_process", "step_functions"] = Field(
        default="in_process",
        description="Where verification and release workflows run: in this process (local) or "
        "AWS Step Functions (execution name = instance ID).",
    )
    verification_state_machine_arn: str | None = Field(
        default=None, description="The verification workflow's state machine (step_functions)."
    )
    release_state_machine_arn: str | None = Field(
        default=None, description="The release workflow's state machine (step_functions)."
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, description="Bound on one outgoing webhook request."
    )
    webhook_tolerance_s: int = Field(
        default=300,
        ge=1,
        description="A signed webhook older or newer than this is refused (Standard Webhooks).",
    )
    webhook_allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Hosts a webhook may reach although they are private, loopback or "
        "link-local (tests and the demo allow 127.0.0.1); everything else of that kind is "
        "refused at registration and at send.",
    )
    release_recover_after_s: float = Field(
        default=2_700.0,
        gt=0,
        description="A Change still releasing this long after promotion gets release.recover.",
    )
    settle_quiet_min_s: float = Field(
        default=180.0, ge=0, description="An open Change quiet at least this long is settled."
    )
    settle_quiet_max_s: float = Field(
        default=21_600.0, gt=0, description="An open Change quiet longer than this is left alone."
    )
    housekeeping_batch_cap: int = Field(
        default=10, ge=1, description="Commands of one housekeeping kind queued per sweep tick."
    )
    # -- end of Change lifecycle ----------------------------------------------------------------

    # -- trace spans --- (rhumbatron.core.tracing; docs/tracing.md) ------------------------------
    trace_spans: bool = Field(
        default=False,
        description="Record this process's spans (API calls, routed events, handled commands, "
        "workflow steps, publishes) in <state>/traces.sqlite for the local dashboard's Change "
        "timeline. On for `rhumbatron up` and `make demo`; off in Lambda, where X-Ray holds "
        "the traces (each span about a Change annotates the segment with change_trace_id).",
    )
    trace_spans_max_rows: int = Field(
        default=20_000,
        ge=100,
        description="Spans <state>/traces.sqlite keeps; each flush deletes the oldest beyond it.",
    )

    # -- fault injection (tests only) ---------------------------------------------------------
    crash_at: str | None = Field(
        default=None, description="Kill the process at this named point (fault tests only)."
    )

    @field_validator("crash_at")
    @classmethod
    def _known_crash_point(cls, value: str | None) -> str | None:
        from rhumbatron.core.faults import CRASH_POINTS

        if value is not None and value not in CRASH_POINTS:
            raise ValueError(f"unknown crash point; known: {', '.join(sorted(CRASH_POINTS))}")
        return value

    @field_validator("queue_retry_delay_s", "queue_concurrency")
    @classmethod
    def _known_queues(cls, value: dict[str, Any]) -> dict[str, Any]:
        from rhumbatron.protocol.queue_consumers import QUEUE_CONSUMERS

        if unknown := sorted(set(value) - set(QUEUE_CONSUMERS)):
            raise ValueError(
                f"unknown queue(s) {', '.join(unknown)}; the queues are "
                f"{', '.join(QUEUE_CONSUMERS)}"
            )
        return value

    @field_validator("queue_concurrency")
    @classmethod
    def _some_handlers(cls, value: dict[str, int]) -> dict[str, int]:
        if low := {queue: n for queue, n in value.items() if n < 1}:
            raise ValueError(f"a queue runs at least 1 handler at once; got {low}")
        return value

    @field_validator("producer_bindings")
    @classmethod
    def _bindings_in_range(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        # Imported here, as check_retention below: every handler imports the settings at its
        # cold start, and the protocol package is the message registry (test_import_hygiene).
        from rhumbatron.protocol.ids import EVENT_STREAM_COUNT

        if value is not None:
            bad = [i for i in value if not 0 <= i < EVENT_STREAM_COUNT]
            if bad:
                raise ValueError(f"stream indexes {bad} are outside 0..{EVENT_STREAM_COUNT - 1}")
        return value

    # -- retention fit --- (rhumbatron.core.retention: every window against the others) ----
    max_consumer_lag_s: float = Field(
        default=86_400.0,
        gt=0,
        description="The largest lag a consumer may have (the lag SLO, spec EO4). One day: long "
        "enough to notice a lag on the dashboards and raise a ceiling (docs/operations.md), short "
        "enough to leave most of the 7-day event stream to replays. At least the sweep's "
        "8-minute round of the streams; the event streams must keep events longer than this "
        "plus replay_window_days.",
    )
    replay_window_days: float = Field(
        default=5,
        gt=0,
        description="How far back a consumer's cursor may be rewound (replay, spec EO4). Five "
        "days: what the 7-day event stream leaves after the 1-day lag, less a day's margin for "
        "the replay itself to run (the stream must exceed lag + window, not equal it). The "
        "archive keeps its objects at least this long.",
    )

    @model_validator(mode="after")
    def _retention_windows_fit(self) -> Self:
        """Every window checked against the others (the retention rule of seed 002 and the
        nesting of DESIGN §6); every broken rule is listed at once, naming its settings."""
        from rhumbatron.core.retention import check_retention

        check_retention(self)  # RetentionMisfitError is a ValueError: pydantic reports it
        return self

    # -- end of retention fit -------------------------------------------------------------------

    @property
    def reconcile_window_s(self) -> float:
        """How far back reconciliation proves the log against the outbox, in seconds:
        ``reconcile_window_days``, or the event stream's retention when unset."""
        return (self.reconcile_window_days or self.event_stream_max_age_days) * 86_400

    @property
    def monitor_urls(self) -> tuple[str, ...]:
        """``nats_monitor_urls`` split: one monitoring URL per node."""
        raw = self.nats_monitor_urls or ""
        return tuple(url.strip() for url in raw.split(",") if url.strip())

    @property
    def maintenance_minute_of_day(self) -> int:
        """The daily maintenance tick as a UTC minute of the day (04:17 → 257)."""
        hours, minutes = self.maintenance_time_utc.split(":")
        return int(hours) * 60 + int(minutes)


def load_settings(**overrides: object) -> Settings:
    """Build :class:`Settings` from the environment plus ``overrides``.

    Raises :class:`ConfigurationError` naming each bad setting and its value.
    """
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(_describe(err) for err in exc.errors(include_url=False))
        raise ConfigurationError(f"invalid settings: {problems}") from exc
    except SettingsError as exc:
        # An environment value of a structured setting that is not JSON: pydantic-settings
        # names the field in its own words, and never the variable.
        field = _SETTINGS_ERROR_FIELD.search(str(exc))
        name = "RHUMBATRON_" + field.group(1).upper() if field else "a RHUMBATRON_ variable"
        raise ConfigurationError(
            f"invalid settings: {name} is not valid JSON; give it as a JSON value (see "
            "docs/operations.md for its form)"
        ) from None


_SETTINGS_ERROR_FIELD = re.compile(r'field "(\w+)"')


def _describe(err: Any) -> str:
    message = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return message  # a rule across settings: the message names each one
    name = "RHUMBATRON_" + "_".join(str(part) for part in err["loc"]).upper()
    # Never a token's or a secret's value, nor a whole object (api_tokens holds tokens).
    quoted = describe_input(err["loc"], err.get("input"))
    return f"{name}: {message}" if quoted is None else f"{name}={quoted}: {message}"
