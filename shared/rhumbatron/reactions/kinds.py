"""The kind grammar: every Event kind as ``<subject>.<verb>``, what it is about, and whether a
reaction may be triggered by it (spec: "Coverage grows by grammar", S2-033, S2-034, S2-095).

:data:`KIND_GRAMMAR` is a read-only view over :data:`~rhumbatron.protocol.EVENT_TYPES`: the
registry stays the one list of kinds; this module adds what reactions need to know.

* **subject** is the noun before the dot (``task`` in ``task.completed``); **about** is the
  thing whose ID the Event carries, and so where that ID lives (:attr:`SubjectType.id_key`):
  a ``claim.*`` Event is about a resource, a ``promotion.*`` Event about a Candidate.
* **triggerable** is an allow-list (S2-095): only kinds named in
  :data:`TRIGGERABLE_EVENT_KINDS` can be matched by a subscription or an agent trigger. Every
  registered kind is decided one way or the other; :data:`NOT_TRIGGERABLE` says why a kind is
  left out. A kind of the :data:`REACTION_FAMILY` is never triggerable, even if listed: a
  reaction's own facts must not trigger reactions (the loop guard of S2-014).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal

from rhumbatron.protocol.event_types import EVENT_TYPES, EventTypeSpec, Owner
from rhumbatron.protocol.payloads import Payload
from rhumbatron.reactions._values import same_value

__all__ = [
    "KIND_GRAMMAR",
    "NOT_TRIGGERABLE",
    "REACTION_FAMILY",
    "SUBJECT_OF_NOUN",
    "TRIGGERABLE_EVENT_KINDS",
    "WILDCARD",
    "Kind",
    "KindGrammar",
    "PayloadField",
    "SubjectType",
    "kind_pattern_matches",
    "kinds_table",
    "list_kinds",
]

#: The noun of the facts reactions write about themselves (``reaction.delivered`` ...). No kind
#: of this family is ever triggerable, whether or not it is registered yet.
REACTION_FAMILY = "reaction"

#: The wildcard of a kind pattern: a whole ``<subject>`` or ``<verb>`` part, never a fragment.
WILDCARD = "*"


class SubjectType(StrEnum):
    """The thing an Event is about: the ID that orders its facts (S2-041)."""

    PROJECT = "project"
    CHANGE = "change"
    TASK = "task"
    RESOURCE = "resource"
    ARTIFACT = "artifact"
    CANDIDATE = "candidate"
    RELEASE = "release"
    APP = "app"
    AGENT = "agent"
    #: ``schedule.fired`` is about its schedule (S2-101).
    SCHEDULE = "schedule"
    #: ``reaction.disabled`` is about the subscription it disabled.
    SUBSCRIPTION = "subscription"
    #: ``log.gap_detected`` is about the event stream a replica lost events of.
    STREAM = "stream"

    @property
    def id_key(self) -> str:
        """The selector filter key that holds this subject's ID (``subject.changeId`` ...)."""
        return _ID_KEYS[self]


_ID_KEYS: Mapping[SubjectType, str] = MappingProxyType(
    {
        SubjectType.PROJECT: "subject.projectId",
        SubjectType.CHANGE: "subject.changeId",
        SubjectType.TASK: "subject.taskId",
        SubjectType.RESOURCE: "subject.resource",
        SubjectType.ARTIFACT: "payload.artifactId",
        SubjectType.CANDIDATE: "payload.candidateId",
        SubjectType.RELEASE: "payload.releaseId",
        SubjectType.APP: "payload.appName",
        SubjectType.AGENT: "payload.agentId",
        SubjectType.SCHEDULE: "payload.scheduleId",
        SubjectType.SUBSCRIPTION: "payload.subscriptionId",
        SubjectType.STREAM: "payload.stream",
    }
)

_S = SubjectType
#: What each noun of the registry is about. A noun missing here falls back on its type's flags
#: (task, change, resource, else project); a test keeps every registered noun listed.
SUBJECT_OF_NOUN: Mapping[str, SubjectType] = MappingProxyType(
    {
        "project": _S.PROJECT,
        # The canonical line is the project's own: one per project.
        "canonical": _S.PROJECT,
        "artifact": _S.ARTIFACT,
        "app": _S.APP,
        # Claims, intents, challenges and changesets are what the resource shard orders.
        "claim": _S.RESOURCE,
        "intent": _S.RESOURCE,
        "challenge": _S.RESOURCE,
        "changeset": _S.RESOURCE,
        "change": _S.CHANGE,
        "verification": _S.CHANGE,
        "model": _S.CHANGE,
        "task": _S.TASK,
        "agent": _S.AGENT,
        "candidate": _S.CANDIDATE,
        "promotion": _S.CANDIDATE,
        "release": _S.RELEASE,
        "schedule": _S.SCHEDULE,
        "reaction": _S.SUBSCRIPTION,
        "log": _S.STREAM,
        # A tenant's budget is recorded in the shard of one of its projects (the one whose
        # event met the refusal).
        "budget": _S.PROJECT,
    }
)

#: Kinds left off the allow-list, each with the reason (S2-096: some kinds are on the log but
#: deliberately not trigger-matchable).
NOT_TRIGGERABLE: Mapping[str, str] = MappingProxyType(
    {
        "agent.woke": "it narrates an agent's own activation; a reaction's facts never trigger "
        "reactions (loop guard, S2-014)",
        "model.routed": "it narrates a step inside an agent's activation (the model it chose); "
        "a reaction's facts never trigger reactions (loop guard, S2-014)",
        "claim.acquired": "it is lease bookkeeping (who holds a resource now) that the causal "
        "router coordinates; waking on every lease is noise, like *.moved (S2-096)",
        "claim.released": "it is lease bookkeeping (who holds a resource now) that the causal "
        "router coordinates; waking on every lease is noise, like *.moved (S2-096)",
        "budget.exceeded": "it is the admission gate's own refusal: a reaction to it would ask "
        "the very budget that just ran out (loop guard, S2-014); it is watched on the log and "
        "its metric instead",
    }
)

#: The allow-list (TRIGGERABLE_EVENT_KINDS, S2-095): only these kinds can be matched.
TRIGGERABLE_EVENT_KINDS: frozenset[str] = frozenset(
    {
        "project.created",
        "project.archived",
        "project.deleted",
        "artifact.promoted",
        "canonical.advanced",
        "app.provisioned",
        "app.removed",
        "claim.expired",
        "intent.declared",
        "intent.changed",
        "challenge.created",
        "changeset.proposed",
        "change.created",
        "change.planned",
        "change.status_changed",
        "change.settled",
        "change.completed",
        "change.failed",
        "change.cancelled",
        "change.not_selected",
        "change.declined",
        "task.ready",
        "task.assigned",
        "task.started",
        "task.completed",
        "task.failed",
        "task.blocked",
        "verification.started",
        "candidate.created",
        "candidate.verified",
        "candidate.rejected",
        "candidate.stale",
        "candidate.promoted",
        "promotion.requested",
        "promotion.completed",
        "promotion.rejected",
        "release.started",
        "release.completed",
        "release.failed",
        # A time-driven reaction is a subscription on the clock's tick (S2-065).
        "schedule.fired",
        # An ops agent (or a pager's webhook) reacts to a log that lost events.
        "log.gap_detected",
    }
)

# Filters compare exactly, so only fields of these types (or a Literal of them) are filterable;
# a list or a timestamp is not.
_SCALARS: tuple[type, ...] = (str, int, bool)


@dataclass(frozen=True, slots=True)
class PayloadField:
    """One field of a kind's payload, by its wire name (``candidateId``)."""

    name: str
    attribute: str
    annotation: Any
    required: bool

    @property
    def filterable(self) -> bool:
        """True if a selector filter may compare it: a str, int or bool (or a Literal)."""
        options = _options(self.annotation)
        return bool(options) and all(_is_scalar_option(o) for o in options)

    @property
    def holds(self) -> str:
        """What the field holds, in words (``a string``, ``one of 'a', 'b'``)."""
        return " or ".join(_option_words(o) for o in _options(self.annotation))

    def accepts(self, value: object) -> bool:
        """True if ``value`` is one this field can hold, so a filter on it can ever match."""
        return self.filterable and any(_option_accepts(o, value) for o in _options(self.annotation))


@dataclass(frozen=True, slots=True)
class Kind:
    """One Event kind as the grammar sees it."""

    name: str
    subject: str
    verb: str
    about: SubjectType
    triggerable: bool
    spec: EventTypeSpec

    @property
    def version(self) -> int:
        """The kind's ``eventVersion``."""
        return self.spec.version

    @property
    def owner(self) -> Owner:
        """The actor class whose outbox writes it."""
        return self.spec.owner

    @property
    def payload(self) -> type[Payload]:
        """The kind's payload model."""
        return self.spec.payload

    @property
    def subject_id_key(self) -> str:
        """The filter key holding the ID of what the kind is about."""
        return self.about.id_key

    @property
    def payload_fields(self) -> tuple[PayloadField, ...]:
        """The payload's fields, in the model's order."""
        return _payload_fields(self.spec.payload)


class KindGrammar(Mapping[str, Kind]):
    """A read-only view over an Event type registry, one :class:`Kind` per registered type."""

    def __init__(
        self,
        registry: Mapping[str, EventTypeSpec],
        triggerable: Collection[str] = TRIGGERABLE_EVENT_KINDS,
    ) -> None:
        kinds: dict[str, Kind] = {}
        for name, spec in registry.items():
            subject, verb = name.split(".", 1)
            kinds[name] = Kind(
                name=name,
                subject=subject,
                verb=verb,
                about=_about(subject, spec),
                # The reaction family is refused here, not only by omission from the list, so
                # registering ``reaction.*`` later cannot open the loop by accident.
                triggerable=name in triggerable and subject != REACTION_FAMILY,
                spec=spec,
            )
        self._kinds: Mapping[str, Kind] = MappingProxyType(kinds)

    def __getitem__(self, name: str) -> Kind:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    @property
    def subjects(self) -> frozenset[str]:
        """Every noun of the registry."""
        return frozenset(kind.subject for kind in self._kinds.values())

    @property
    def verbs(self) -> frozenset[str]:
        """Every verb of the registry."""
        return frozenset(kind.verb for kind in self._kinds.values())

    def matching(self, pattern: str) -> tuple[Kind, ...]:
        """The registered kinds ``pattern`` matches (triggerable or not), by name."""
        return tuple(
            self._kinds[name] for name in sorted(self._kinds) if kind_pattern_matches(pattern, name)
        )


def kind_pattern_matches(pattern: str, kind: str) -> bool:
    """True if ``pattern`` (``task.completed``, ``task.*``, ``*.completed``) matches ``kind``.

    A ``*`` stands for one whole part; this does not check that either is registered.
    """
    pattern_parts, kind_parts = pattern.split("."), kind.split(".")
    return len(pattern_parts) == len(kind_parts) and all(
        p in (WILDCARD, k) for p, k in zip(pattern_parts, kind_parts, strict=True)
    )


def list_kinds(grammar: KindGrammar | None = None) -> list[dict[str, Any]]:
    """One JSON-ready row per kind, by name: what ``rhumbatron kinds --json`` prints."""
    grammar = KIND_GRAMMAR if grammar is None else grammar
    return [_row(grammar[name]) for name in sorted(grammar)]


def kinds_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows of :func:`list_kinds` as a text table (an optional field ends with ``?``)."""
    header = ("KIND", "VERSION", "SUBJECT", "SUBJECT ID", "TRIGGERABLE", "OWNER", "PAYLOAD FIELDS")
    lines = [
        (
            row["kind"],
            str(row["version"]),
            row["subject"],
            row["subjectId"],
            "yes" if row["triggerable"] else "no",
            row["owner"],
            ", ".join(f["name"] + ("" if f["required"] else "?") for f in row["payload"]["fields"])
            or "-",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header) - 1)]
    text = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(line, widths, strict=False)), line[-1]])
        for line in (header, *lines)
    ]
    triggerable = sum(1 for row in rows if row["triggerable"])
    text.append(f"{len(rows)} kind(s), {triggerable} triggerable")
    return "\n".join(text)


def _row(kind: Kind) -> dict[str, Any]:
    return {
        "kind": kind.name,
        "version": kind.version,
        "subject": kind.subject,
        "verb": kind.verb,
        "about": kind.about.value,
        "subjectId": kind.subject_id_key,
        "triggerable": kind.triggerable,
        "notTriggerableBecause": None if kind.triggerable else _why_not(kind),
        "owner": kind.owner.value,
        "idKind": kind.spec.id_kind.value,
        "summary": kind.spec.summary,
        "payload": {
            "model": kind.payload.__name__,
            "fields": [
                {"name": f.name, "required": f.required, "filterable": f.filterable}
                for f in kind.payload_fields
            ],
        },
    }


def _why_not(kind: Kind) -> str:
    if kind.subject == REACTION_FAMILY:
        return "the reaction family is never matchable (loop guard, S2-014)"
    return NOT_TRIGGERABLE.get(kind.name, "not on the allow-list (TRIGGERABLE_EVENT_KINDS)")


def _about(subject: str, spec: EventTypeSpec) -> SubjectType:
    known = SUBJECT_OF_NOUN.get(subject)
    if known is not None:
        return known
    if spec.requires_task:
        return SubjectType.TASK
    if spec.requires_change:
        return SubjectType.CHANGE
    if spec.resource_event:
        return SubjectType.RESOURCE
    return SubjectType.PROJECT


@functools.cache
def _payload_fields(model: type[Payload]) -> tuple[PayloadField, ...]:
    return tuple(
        PayloadField(
            name=info.alias or attribute,
            attribute=attribute,
            annotation=info.annotation,
            required=info.is_required(),
        )
        for attribute, info in model.model_fields.items()
    )


def _options(annotation: Any) -> tuple[Any, ...]:
    """The non-None members of a union (``str | None`` → ``str``), or the annotation; an
    ``Annotated`` member (``AgentId | None``) counts as its base type."""
    members = (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return tuple(
        typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members
    )


def _is_scalar_option(option: Any) -> bool:
    if typing.get_origin(option) is Literal:
        return all(isinstance(v, _SCALARS) for v in typing.get_args(option))
    return option in _SCALARS


def _option_words(option: Any) -> str:
    if typing.get_origin(option) is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(option))
    words = {str: "a string", int: "an integer", bool: "a boolean"}
    return words.get(option, getattr(option, "__name__", str(option)))


def _option_accepts(option: Any, value: object) -> bool:
    if typing.get_origin(option) is Literal:
        return any(same_value(value, v) for v in typing.get_args(option))
    if option is bool:
        return isinstance(value, bool)
    if option is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return option is str and isinstance(value, str)


#: The kinds of :data:`~rhumbatron.protocol.EVENT_TYPES` (built last: it needs the helpers).
KIND_GRAMMAR = KindGrammar(EVENT_TYPES)
