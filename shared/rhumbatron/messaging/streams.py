"""The streams Rhumbatron needs, and ``ensure_streams`` that creates or reconciles them.

* ``EVENTS_00`` … ``EVENTS_07`` on ``events.00`` … ``events.07``: limits retention, file
  storage, max age 7 days, a 2-hour duplicate window, atomic and fast-ingest batch publish
  allowed.
* ``COMMANDS`` on ``cmd.<queue>``: work-queue retention, max age 14 days, 2-hour window.

Running :func:`ensure_streams` again changes nothing. A stream that exists with other
settings is updated where JetStream allows it; otherwise start-up fails naming the difference.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rhumbatron.core.settings import Settings
from rhumbatron.errors import StreamConfigError
from rhumbatron.protocol.command_types import QUEUES
from rhumbatron.protocol.ids import EVENT_STREAM_COUNT, event_stream_name, event_stream_subject

if TYPE_CHECKING:
    from nats.js.api import StreamConfig
    from nats.js.client import JetStreamContext

__all__ = [
    "COMMAND_STREAM",
    "StreamReport",
    "command_subject",
    "ensure_streams",
    "wanted_streams",
]

COMMAND_STREAM = "COMMANDS"
_DAY_S = 86_400.0
#: Fields JetStream cannot change on an existing stream.
_IMMUTABLE = ("storage", "retention")
#: The fields we own; anything else on an existing stream is left as the operator set it.
_MANAGED = (
    "subjects",
    "retention",
    "storage",
    "max_age",
    "duplicate_window",
    "num_replicas",
    "allow_atomic",
    "allow_batched",
)


def command_subject(queue: str) -> str:
    """``cmd.<queue>``: the one subject of a queue on the COMMANDS stream."""
    return f"cmd.{queue}"


def wanted_streams(settings: Settings) -> list[StreamConfig]:
    """The configuration of every stream, from the settings."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig

    events = [
        StreamConfig(
            name=event_stream_name(index),
            subjects=[event_stream_subject(index)],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=settings.event_stream_max_age_days * _DAY_S,
            duplicate_window=settings.duplicate_window_s,
            num_replicas=settings.stream_replicas,
            allow_atomic=True,
            allow_batched=True,
        )
        for index in range(EVENT_STREAM_COUNT)
    ]
    commands = StreamConfig(
        name=COMMAND_STREAM,
        subjects=[command_subject(queue) for queue in QUEUES],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_age=settings.command_stream_max_age_days * _DAY_S,
        duplicate_window=settings.duplicate_window_s,
        num_replicas=settings.stream_replicas,
    )
    return [*events, commands]


@dataclass
class StreamReport:
    """What :func:`ensure_streams` did to each stream."""

    created: list[str] = field(default_factory=list)
    updated: dict[str, list[str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)


def _normalised(config: StreamConfig, name: str) -> Any:
    """``config``'s ``name`` as compared and shown: JetStream's own spelling of a policy
    (``'workqueue'``), whether nats-py read it into its enum or we wrote it as one."""
    value = getattr(config, name)
    if name in ("retention", "storage"):
        return getattr(value, "value", value)
    if name == "subjects":
        return sorted(value or [])
    if name in ("max_age", "duplicate_window"):
        return round(float(value or 0), 3)
    if name in ("allow_atomic", "allow_batched"):
        return bool(value)
    if name == "num_replicas":
        return value or 1
    return value


async def ensure_streams(js: JetStreamContext, settings: Settings) -> StreamReport:
    """Create every stream, or reconcile an existing one to the wanted settings."""
    from nats.js.errors import NotFoundError

    report = StreamReport()
    for wanted in wanted_streams(settings):
        assert wanted.name is not None
        try:
            info = await js.stream_info(wanted.name)
        except NotFoundError:
            await _refused_as_config_error(js.add_stream(wanted), wanted, "create")
            report.created.append(wanted.name)
            continue
        differences = {
            name: (_normalised(info.config, name), _normalised(wanted, name))
            for name in _MANAGED
            if _normalised(info.config, name) != _normalised(wanted, name)
        }
        if not differences:
            report.unchanged.append(wanted.name)
            continue
        fixed = {name: diff for name, diff in differences.items() if name in _IMMUTABLE}
        if fixed:
            described = ", ".join(
                f"{k}: has {have!r}, want {want!r}" for k, (have, want) in fixed.items()
            )
            raise StreamConfigError(
                f"stream {wanted.name} exists with settings JetStream cannot change ({described}); "
                f"back up and delete the stream, or point RHUMBATRON_NATS_URL elsewhere"
            )
        merged = info.config.evolve(**{name: getattr(wanted, name) for name in differences})
        await _refused_as_config_error(js.update_stream(merged), wanted, "update")
        report.updated[wanted.name] = sorted(differences)
    return report


async def _refused_as_config_error(
    call: Coroutine[Any, Any, object], wanted: StreamConfig, doing: str
) -> None:
    """Run a stream API call; JetStream's refusal becomes a :class:`StreamConfigError`."""
    from nats.js.errors import APIError

    try:
        await call
    except APIError as exc:
        raise StreamConfigError(
            f"JetStream refused to {doing} stream {wanted.name} on subjects "
            f"{', '.join(wanted.subjects or [])}: {exc.description} (code {exc.err_code}); "
            "if another stream already holds these subjects, remove it or point "
            "RHUMBATRON_NATS_URL at a server of Rhumbatron's own"
        ) from exc
