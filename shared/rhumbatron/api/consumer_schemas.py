"""The consumers API's response bodies: frozen pydantic models, camelCase on the wire, like
:mod:`rhumbatron.api.schemas`."""

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from rhumbatron.messaging.cursors import CursorKind, CursorLag

__all__ = [
    "CapacityBody",
    "CeilingsBody",
    "ConsumerBody",
    "ConsumersBody",
    "PauseBody",
    "PauseRequest",
    "ReconciliationBody",
    "RepairBody",
    "RepairRequest",
    "RepairStepBody",
    "ReplicaReconciliationBody",
    "StreamReconciliationBody",
]


class _Wire(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class ConsumerBody(_Wire):
    """One durable consumer and its lag."""

    kind: CursorKind = Field(description="event: a subscription's; command: a queue's.")
    stream: str = Field(description="The stream it reads (EVENTS_NN or COMMANDS).")
    consumer: str = Field(description="The durable consumer's name.")
    subscription: str | None = Field(description="The subscription (an event consumer).")
    queue: str | None = Field(description="The queue (a command consumer).")
    exists: bool = Field(description="False: not created yet; it lags by all it would read.")
    num_pending: int = Field(ge=0, description="Records not yet delivered to it.")
    num_ack_pending: int = Field(ge=0, description="Delivered, not yet acknowledged.")
    last_delivered_seq: int = Field(ge=0, description="Stream sequence last delivered (0: none).")
    last_delivered_at: AwareDatetime | None = Field(description="When it was last delivered to.")
    paused_until: AwareDatetime | None = Field(
        default=None,
        description="Paused by an operator until then (JetStream delivers "
        "nothing to it meanwhile); null: not paused.",
    )

    @classmethod
    def of(cls, lag: CursorLag) -> "ConsumerBody":
        """``lag`` as answered: what it reads named as a subscription or a queue."""
        cursor = lag.cursor
        return cls(
            kind=cursor.kind,
            stream=cursor.stream,
            consumer=cursor.consumer,
            subscription=cursor.reads if cursor.kind is CursorKind.EVENT else None,
            queue=cursor.reads if cursor.kind is CursorKind.COMMAND else None,
            exists=lag.exists,
            num_pending=lag.num_pending,
            num_ack_pending=lag.num_ack_pending,
            last_delivered_seq=lag.last_delivered_seq,
            last_delivered_at=lag.last_delivered_at,
            paused_until=lag.paused_until,
        )


class ConsumersBody(_Wire):
    """Every durable consumer: the event streams' (stream × subscription), then the queues'."""

    consumers: list[ConsumerBody]


class CeilingsBody(_Wire):
    """Events a day (all streams) each bounded job of the router can keep up with."""

    archive_events_per_day: int = Field(ge=0, description="The audit archiver, sweep-driven.")
    analytics_events_per_day: int = Field(ge=0, description="The analytics projector.")
    sweep_apply_events_per_day: int = Field(
        ge=0, description="Projector and causal router with nudges off."
    )
    sweep_apply_calls_per_day: int = Field(
        ge=0, description="With nudges off, at one event per project per fetch (15 calls a run)."
    )
    reactions_events_per_day: int = Field(ge=0, description="Reactions, one batch a stream a tick.")
    prune_events_per_day: int = Field(ge=0, description="The claims' prune, daily and per tick.")


class CapacityBody(_Wire):
    """The router's ceilings against the volume sized for and the one the streams carry."""

    expected_events_per_day: int = Field(
        ge=1, description="The volume sized for (RHUMBATRON_EXPECTED_EVENTS_PER_DAY)."
    )
    observed_events_per_day: int = Field(
        ge=0, description="What the streams carry, from their first and last message times."
    )
    tick_prune_rows: int = Field(
        ge=0, description="Rows of each growing table an ordinary tick prunes (0: daily only)."
    )
    ceilings: CeilingsBody
    warnings: list[str] = Field(
        description="Every ceiling below the sized volume, or passed 80 % by the observed rate."
    )
    drain_mode: bool = Field(
        description="Whether the archiver, analytics and reactions drain on nudges and on "
        "every stream at each tick (above half of their sweep-only ceilings)."
    )


class ReplicaReconciliationBody(_Wire):
    """One replica's proof against the outbox, and its own counts."""

    node: str = Field(description="The node holding this copy of the stream.")
    leader: bool = Field(description="Whether it leads the stream.")
    expected: int = Field(ge=0, description="Events the outbox published in the window.")
    found: int = Field(ge=0, description="Of them, those this copy holds.")
    missing: list[str] = Field(description="The event IDs of those it lost.")
    messages: int | None = Field(description="Messages in its copy (its /jsz; null: not read).")
    first_seq: int | None = Field(description="Its first stream sequence.")
    last_seq: int | None = Field(description="Its last stream sequence.")
    holes: int = Field(ge=0, description="Messages missing inside its own sequence range.")
    behind: int = Field(ge=0, description="How far its last sequence is behind the leader's.")
    catching_up: list[str] = Field(
        description="Event IDs stored beyond its own last sequence: not yet replicated to it "
        "(a follower catching up), not lost."
    )
    error: str | None = Field(description="Why this copy could not be read.")


class StreamReconciliationBody(_Wire):
    """One event stream: the events the outbox published in the window, each replica's
    proof, and the events no replica holds."""

    stream: str
    expected: int = Field(ge=0)
    gap: bool = Field(description="Some replica lacks acknowledged events, or was not read.")
    missing_everywhere: list[str] = Field(
        description="Events no replica holds: the only ones the outbox may publish again."
    )
    replicas: list[ReplicaReconciliationBody]
    error: str | None = Field(description="Why the stream could not be read.")


class ReconciliationBody(_Wire):
    """The proof that the log holds every event the outbox marked published."""

    checked_from: AwareDatetime = Field(description="Rows published from here on were checked.")
    checked_to: AwareDatetime
    gap: bool = Field(description="Some stream has a gap.")
    streams: list[StreamReconciliationBody]
    unread_nodes: list[str] = Field(description="Monitor URLs that did not answer, with why.")
    requests: int = Field(ge=0, description="Requests the proof took.")
    seconds: float = Field(ge=0, description="How long it took.")


class RepairRequest(_Wire):
    """What to repair: the event streams (every one for none), and whether only to say it."""

    streams: list[int] | None = Field(
        default=None, description="Event stream indexes (0-7); default: all."
    )
    dry_run: bool = Field(default=False, description="Say what the repair would do; do nothing.")

    @field_validator("streams")
    @classmethod
    def _indexes(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(not 0 <= index <= 7 for index in value):
            raise ValueError(f"stream indexes are 0-7, not {value}")
        return value


class RepairStepBody(_Wire):
    """One step of a repair: done here (``move_leader``, ``republish``), or left to an
    operator (``rebuild_replica``: docs/operations.md, "Log gap detected")."""

    stream: str
    action: str = Field(description="move_leader, rebuild_replica or republish.")
    node: str = Field(description="The node it concerns ('' when none).")
    detail: str
    done: bool = Field(description="Whether this call did it (never in a dry run).")


class RepairBody(_Wire):
    """What a repair found and did."""

    dry_run: bool
    gap: bool = Field(description="The reconciliation before the repair found a gap.")
    steps: list[RepairStepBody]


class PauseRequest(_Wire):
    """Until when to pause a cursor (it resumes by itself then)."""

    until: AwareDatetime = Field(description="A time in the future, at most 7 days ahead.")


class PauseBody(_Wire):
    """A cursor's pause, as JetStream keeps it."""

    stream: str
    consumer: str
    paused_until: AwareDatetime | None = Field(description="null: resumed.")
