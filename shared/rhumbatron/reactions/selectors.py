"""The one selector and the one matcher (S2-061, S2-106): subscriptions and agent triggers both
say what they react to with a :class:`Selector`, and both ask :func:`event_selector_matches`,
so the two grammars cannot drift.

The grammar, checked when a selector is built (at the edge), so a selector that can never
match is refused with a reason instead of sitting silent:

``kinds``
    One or more kind patterns ``<subject>.<verb>``. Either part may be a whole ``*``:
    ``task.completed``, ``task.*``, ``*.completed``. A fragment (``task.comp*``) is not a
    pattern, and neither is ``*`` or ``*.*``: a channel that carries every fact is a log
    consumer with its own cursor, not a subscription (S2-063). A pattern must match at least
    one registered kind that can trigger reactions (:data:`~.kinds.TRIGGERABLE_EVENT_KINDS`).
    A pattern may also match kinds that cannot (``claim.*`` covers ``claim.acquired``): those
    never match. The ``reaction.*`` family is refused outright (loop guard, S2-014).

``filter``
    A mapping from a key to an exact value or a non-empty list of allowed values; an Event
    matches when every key holds one of its values (AND over keys, OR within a list).
    Values are strings, integers or booleans, compared exactly (``true`` is not ``1``).

    * ``subject.<field>``: an envelope field that locates the fact: ``projectId``,
      ``changeId``, ``taskId``, ``resource`` or ``actor`` (strings). An Event without the
      field (a project fact has no ``changeId``) does not match.
    * ``payload.<field>``: a payload field by its wire name (``payload.candidateId``). It must
      be a string, integer or boolean field of at least one selected kind, and each value one
      that field can hold; a selected kind without the field never matches.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Self, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from rhumbatron.errors import SelectorError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.payloads import Payload
from rhumbatron.reactions._values import same_value
from rhumbatron.reactions.kinds import (
    KIND_GRAMMAR,
    NOT_TRIGGERABLE,
    REACTION_FAMILY,
    WILDCARD,
    Kind,
    KindGrammar,
    PayloadField,
    kind_pattern_matches,
)

__all__ = [
    "MAX_FILTER_VALUES",
    "MAX_KIND_PATTERNS",
    "SUBJECT_FIELDS",
    "FilterValue",
    "Scalar",
    "Selector",
    "event_selector_matches",
    "selected_kinds",
]

Scalar: TypeAlias = StrictStr | StrictInt | StrictBool
FilterValue: TypeAlias = Scalar | tuple[Scalar, ...]

#: The envelope fields a ``subject.<field>`` filter may name, with the Event's attribute.
SUBJECT_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "projectId": "project_id",
        "changeId": "change_id",
        "taskId": "task_id",
        "resource": "resource",
        "actor": "actor",
    }
)

#: Bounds that keep one selector small enough to check on every Event of the log.
MAX_KIND_PATTERNS = 50
MAX_FILTER_VALUES = 100

_SUBJECT, _PAYLOAD = "subject", "payload"
_GRAMMAR_CONTEXT = "grammar"
_MISSING = object()


class Selector(BaseModel):
    """What a subscription or an agent trigger reacts to: kind patterns plus a filter.

    Build it with :meth:`create` (or :meth:`parse` for wire JSON) to get a
    :class:`SelectorError`; constructing it directly raises pydantic's ``ValidationError``
    with the same messages. Validation uses :data:`~.kinds.KIND_GRAMMAR` unless a grammar is
    given in the validation context (``{"grammar": ...}``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: tuple[str, ...] = Field(min_length=1, max_length=MAX_KIND_PATTERNS)
    filter: Mapping[str, FilterValue] = Field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def create(
        cls,
        kinds: Iterable[str],
        filter: Mapping[str, Any] | None = None,
        *,
        grammar: KindGrammar | None = None,
    ) -> Self:
        """A validated selector; raises :class:`SelectorError` naming what is wrong."""
        # A bare string stays one so the validator refuses it, instead of reading its letters.
        patterns = kinds if isinstance(kinds, str) else list(kinds)
        return cls.parse(
            {"kinds": patterns, "filter": {} if filter is None else filter}, grammar=grammar
        )

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, grammar: KindGrammar | None = None) -> Self:
        """A selector from its wire form ``{"kinds": [...], "filter": {...}}``."""
        try:
            return cls.model_validate(
                raw, context={_GRAMMAR_CONTEXT: KIND_GRAMMAR if grammar is None else grammar}
            )
        except ValidationError as exc:
            raise SelectorError(_describe(exc)) from None

    @field_validator("kinds", mode="before")
    @classmethod
    def _kinds_are_a_list(cls, value: object) -> object:
        # A bare string would otherwise be read as a tuple of its characters.
        if isinstance(value, str):
            raise ValueError(f"kinds must be a list of patterns, not the string {value!r}")
        return value

    @field_validator("kinds")
    @classmethod
    def _known_patterns(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        grammar = _grammar(info)
        for pattern in value:
            _check_pattern(pattern, grammar)
        return value

    @field_validator("filter", mode="before")
    @classmethod
    def _filter_shape(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            raise ValueError(f"filter must be a mapping of key to value(s), not {value!r}")
        return {key: _normalised(key, allowed) for key, allowed in value.items()}

    @field_validator("filter")
    @classmethod
    def _frozen_filter(cls, value: Mapping[str, FilterValue]) -> Mapping[str, FilterValue]:
        # A frozen model with a dict inside would still be mutable through it.
        return MappingProxyType(dict(value))

    @model_validator(mode="after")
    def _filter_can_match(self, info: ValidationInfo) -> Self:
        kinds = selected_kinds(self, _grammar(info))
        for key, allowed in self.filter.items():
            _check_filter(key, allowed if isinstance(allowed, tuple) else (allowed,), kinds)
        return self

    @field_serializer("filter")
    def _serialise_filter(self, value: Mapping[str, FilterValue]) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}


def selected_kinds(selector: Selector, grammar: KindGrammar = KIND_GRAMMAR) -> tuple[Kind, ...]:
    """The triggerable kinds the selector's patterns match, by name (its filter aside)."""
    return tuple(
        kind
        for name, kind in sorted(grammar.items())
        if kind.triggerable and any(kind_pattern_matches(p, name) for p in selector.kinds)
    )


def event_selector_matches(
    selector: Selector, event: Event, *, grammar: KindGrammar = KIND_GRAMMAR
) -> bool:
    """True if ``event`` is one ``selector`` reacts to: the one matcher (S2-106).

    A kind that cannot trigger reactions never matches, whatever the patterns say: the
    reaction family, the kinds of :data:`~.kinds.NOT_TRIGGERABLE`, and an unregistered one.
    """
    kind = grammar.get(event.event_type)
    if kind is None or not kind.triggerable:
        return False
    if not any(kind_pattern_matches(pattern, kind.name) for pattern in selector.kinds):
        return False
    return all(
        _holds(_read(event, key), allowed if isinstance(allowed, tuple) else (allowed,))
        for key, allowed in selector.filter.items()
    )


# -- matching ---------------------------------------------------------------------------------


def _read(event: Event, key: str) -> object:
    part, name = key.split(".", 1)
    if part == _SUBJECT:
        return getattr(event, SUBJECT_FIELDS[name])
    attribute = _payload_attributes(type(event.payload)).get(name)
    return _MISSING if attribute is None else getattr(event.payload, attribute, _MISSING)


def _holds(actual: object, allowed: tuple[Scalar, ...]) -> bool:
    return actual is not _MISSING and any(same_value(actual, value) for value in allowed)


@functools.cache
def _payload_attributes(model: type[Payload]) -> Mapping[str, str]:
    """Wire name → attribute of a payload model (``candidateId`` → ``candidate_id``)."""
    return MappingProxyType({info.alias or name: name for name, info in model.model_fields.items()})


# -- validation -------------------------------------------------------------------------------


def _grammar(info: ValidationInfo) -> KindGrammar:
    context = info.context
    if isinstance(context, Mapping):
        grammar = context.get(_GRAMMAR_CONTEXT)
        if isinstance(grammar, KindGrammar):
            return grammar
    return KIND_GRAMMAR


def _check_pattern(pattern: str, grammar: KindGrammar) -> None:
    parts = pattern.split(".")
    if pattern in (WILDCARD, f"{WILDCARD}.{WILDCARD}"):
        raise ValueError(
            f"kind pattern {pattern!r} selects every kind; name the kinds (task.*, "
            "*.completed): a channel that carries every fact is a log consumer with its own "
            "cursor, not a subscription"
        )
    if len(parts) != 2 or not all(_part_ok(p) for p in parts):
        raise ValueError(
            f"kind pattern {pattern!r} is not <subject>.<verb>: each part is lowercase letters "
            "and _, or a whole * (task.completed, task.*, *.completed)"
        )
    if parts[0] == REACTION_FAMILY:
        raise ValueError(
            f"kind pattern {pattern!r} names the {REACTION_FAMILY} family, which is never "
            "matchable: a reaction's own facts must not trigger reactions (loop guard)"
        )
    matched = grammar.matching(pattern)
    if not matched:
        raise ValueError(
            f"kind pattern {pattern!r} matches no registered kind{_close(pattern, grammar)}; "
            "`rhumbatron kinds` lists them"
        )
    if not any(kind.triggerable for kind in matched):
        reasons = "; ".join(
            f"{kind.name}: {NOT_TRIGGERABLE.get(kind.name, 'not on the allow-list')}"
            for kind in matched
        )
        raise ValueError(
            f"kind pattern {pattern!r} matches only kinds that cannot trigger reactions "
            f"({reasons}); `rhumbatron kinds` shows which can"
        )


def _part_ok(part: str) -> bool:
    return part == WILDCARD or (
        part[:1].isascii()
        and part[:1].islower()
        and all(c == "_" or (c.isascii() and c.islower()) for c in part)
    )


def _close(pattern: str, grammar: KindGrammar) -> str:
    subject, verb = pattern.split(".")
    if subject == WILDCARD:
        options = [f"*.{v}" for v in difflib.get_close_matches(verb, sorted(grammar.verbs))]
    elif verb == WILDCARD:
        options = [f"{s}.*" for s in difflib.get_close_matches(subject, sorted(grammar.subjects))]
    else:
        options = difflib.get_close_matches(pattern, sorted(grammar), n=3)
    return f" (did you mean {' or '.join(options)}?)" if options else ""


def _normalised(key: object, allowed: object) -> object:
    """A scalar stays, a list becomes a tuple; anything else is refused, naming the key."""
    if isinstance(allowed, (list, tuple)):
        if not allowed:
            raise ValueError(f"filter {key!r} allows an empty list of values, so never matches")
        if len(allowed) > MAX_FILTER_VALUES:
            raise ValueError(
                f"filter {key!r} lists {len(allowed)} values; at most {MAX_FILTER_VALUES}"
            )
        for value in allowed:
            _scalar(key, value)
        return tuple(allowed)
    _scalar(key, allowed)
    return allowed


def _scalar(key: object, value: object) -> None:
    if not isinstance(value, (str, int, bool)):
        raise ValueError(
            f"filter {key!r} has value {value!r}; a filter value is a string, an integer, a "
            "boolean or a list of them"
        )


def _check_filter(key: str, allowed: tuple[Scalar, ...], kinds: tuple[Kind, ...]) -> None:
    part, _, name = key.partition(".")
    if part == _SUBJECT and name:
        if name not in SUBJECT_FIELDS:
            close = difflib.get_close_matches(name, list(SUBJECT_FIELDS), n=1)
            hint = f"did you mean subject.{close[0]}? " if close else ""
            raise ValueError(
                f"filter key {key!r} names no envelope field; {hint}subject fields are "
                + ", ".join(SUBJECT_FIELDS)
            )
        for value in allowed:
            if not isinstance(value, str):
                raise ValueError(f"filter {key!r} has value {value!r}; {key} is a string")
        return
    if part != _PAYLOAD or not name:
        raise ValueError(
            f"filter key {key!r} is neither subject.<field> nor payload.<field> "
            "(subject.changeId, payload.candidateId)"
        )
    fields = [f for kind in kinds for f in kind.payload_fields if f.name == name]
    if not fields:
        names = sorted({f.name for kind in kinds for f in kind.payload_fields if f.filterable})
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean payload.{close[0]}? " if close else ""
        raise ValueError(
            f"filter key {key!r} is no payload field of the selected kinds "
            f"({', '.join(k.name for k in kinds)}); {hint}their filterable fields are "
            + (", ".join(names) or "none")
        )
    if not any(f.filterable for f in fields):
        raise ValueError(
            f"filter key {key!r} is a list or timestamp field; filters compare strings, "
            "integers and booleans exactly"
        )
    for value in allowed:
        if not any(f.accepts(value) for f in fields):
            raise ValueError(
                f"filter {key!r} has value {value!r}, which {name} never holds "
                f"({_describe_type(fields)}), so it would never match"
            )


def _describe_type(fields: list[PayloadField]) -> str:
    return " or ".join(sorted({f.holds for f in fields if f.filterable}))


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        message = err["msg"].removeprefix("Value error, ")
        where = ".".join(str(part) for part in err["loc"])
        problems.append(f"{where}: {message}" if where else message)
    return "invalid selector: " + "; ".join(problems)
