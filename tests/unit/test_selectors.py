"""The one selector and its one matcher (S2-061, S2-095, S2-106, loop guard S2-014): kind
patterns with whole-part ``*`` wildcards, a filter over subject and payload fields, refusals at
the edge that name the bad pattern, key or value, and kinds that can never be matched."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.errors import SelectorError
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.event_types import EVENT_TYPES
from rhumbatron.reactions import selectors as selectors_module
from rhumbatron.reactions._values import same_value
from rhumbatron.reactions.kinds import KindGrammar
from rhumbatron.reactions.selectors import (
    MAX_FILTER_VALUES,
    Selector,
    event_selector_matches,
    selected_kinds,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
AGENT = FactContext(Caller("acme", "agent:builder-1", "corr-1"), "p1", NOW)
SYSTEM = FactContext(Caller("acme", "system:router", "corr-2"), "p2", NOW)


def _task(kind: str, payload: dict[str, Any], *, change: str = "c1", task: str = "t1") -> Event:
    return AGENT.fact(kind, payload, change_id=change, task_id=task)


def _release(kind: str, generation: int) -> Event:
    payload = {"releaseId": f"rel-{generation}", "generation": generation}
    return SYSTEM.fact(kind, payload, change_id="c9")


def _claim(kind: str) -> Event:
    payload: dict[str, Any] = {"claimId": "cl1", "agentId": "builder-1"}
    if kind == "claim.expired":
        payload["expiredAt"] = NOW
    if kind == "claim.acquired":
        payload["expiresAt"] = NOW
    return AGENT.fact(kind, payload, resource="src/app.py")


def _refusal(kinds: Any, filter: dict[str, Any] | None = None) -> str:
    with pytest.raises(SelectorError) as caught:
        Selector.create(kinds, filter)
    return str(caught.value)


# -- kind patterns ----------------------------------------------------------------------------


def test_an_exact_kind_matches_only_that_kind() -> None:
    # GIVEN a selector on task.completed
    selector = Selector.create(["task.completed"])
    # WHEN a completed and a failed task are offered
    # THEN only the completed one matches
    assert event_selector_matches(selector, _task("task.completed", {"agentId": "builder-1"}))
    assert not event_selector_matches(selector, _task("task.failed", {"reason": "boom"}))


def test_a_subject_wildcard_matches_every_verb_of_that_subject() -> None:
    # GIVEN a selector on task.*
    selector = Selector.create(["task.*"])
    # WHEN task facts and a release fact are offered
    # THEN the task facts match and the release fact does not
    assert event_selector_matches(selector, _task("task.ready", {}))
    assert event_selector_matches(selector, _task("task.failed", {"reason": "boom"}))
    assert not event_selector_matches(selector, _release("release.completed", 3))


def test_a_verb_wildcard_matches_that_verb_of_every_subject() -> None:
    # GIVEN a selector on *.completed
    selector = Selector.create(["*.completed"])
    # WHEN completions of two subjects and a failure are offered
    # THEN both completions match and the failure does not
    assert event_selector_matches(selector, _task("task.completed", {"agentId": "builder-1"}))
    assert event_selector_matches(selector, _release("release.completed", 3))
    assert not event_selector_matches(selector, _release("release.failed", 3))
    assert [k.name for k in selected_kinds(selector)] == [
        "change.completed",
        "promotion.completed",
        "release.completed",
        "task.completed",
    ]


def test_several_patterns_match_any_of_them() -> None:
    # GIVEN a selector on two exact kinds
    selector = Selector.create(["task.failed", "release.failed"])
    # WHEN each and a third kind are offered
    # THEN either matches, the third does not
    assert event_selector_matches(selector, _task("task.failed", {"reason": "boom"}))
    assert event_selector_matches(selector, _release("release.failed", 2))
    assert not event_selector_matches(selector, _release("release.completed", 2))


@pytest.mark.parametrize("pattern", ["*", "*.*"])
def test_a_pattern_that_selects_every_kind_is_refused(pattern: str) -> None:
    # GIVEN a pattern for everything  WHEN a selector is built  THEN it is refused, with why
    message = _refusal([pattern])
    assert repr(pattern) in message
    assert "log consumer with its own cursor" in message


@pytest.mark.parametrize(
    "pattern",
    ["Task.completed", "task", "task.comp*", "task.completed.extra", "", "task.", "*task.ready"],
)
def test_a_pattern_outside_the_grammar_is_refused_naming_it(pattern: str) -> None:
    # GIVEN a pattern that is not <subject>.<verb>  WHEN a selector is built
    message = _refusal([pattern])
    # THEN the refusal names it and says what a pattern looks like
    assert f"kind pattern {pattern!r} is not <subject>.<verb>" in message
    assert "task.*" in message


@pytest.mark.parametrize(
    ("pattern", "suggestion"),
    [
        ("task.complete", "task.completed"),
        ("tsk.*", "task.*"),
        ("*.complet", "*.completed"),
    ],
)
def test_a_pattern_matching_no_registered_kind_is_refused_with_close_matches(
    pattern: str, suggestion: str
) -> None:
    # GIVEN a misspelt pattern  WHEN a selector is built
    message = _refusal([pattern])
    # THEN the refusal names it and the close matches
    assert f"kind pattern {pattern!r} matches no registered kind" in message
    assert f"did you mean {suggestion}" in message


@pytest.mark.parametrize("pattern", ["agent.woke", "agent.*", "model.*", "*.acquired"])
def test_a_pattern_matching_only_untriggerable_kinds_is_refused(pattern: str) -> None:
    # GIVEN a pattern whose kinds cannot trigger reactions  WHEN a selector is built
    message = _refusal([pattern])
    # THEN the refusal names the pattern and says why its kinds cannot trigger
    assert f"kind pattern {pattern!r} matches only kinds that cannot trigger" in message
    assert "loop guard" in message or "lease bookkeeping" in message


def test_a_wildcard_never_matches_an_untriggerable_kind() -> None:
    # GIVEN claim.*, which covers the triggerable claim.expired and the lease bookkeeping
    selector = Selector.create(["claim.*"])
    # WHEN each claim fact is offered
    # THEN only claim.expired matches
    assert event_selector_matches(selector, _claim("claim.expired"))
    assert not event_selector_matches(selector, _claim("claim.acquired"))
    assert not event_selector_matches(selector, _claim("claim.released"))
    assert [k.name for k in selected_kinds(selector)] == ["claim.expired"]


def test_the_reaction_family_is_refused_as_a_pattern() -> None:
    # GIVEN a pattern on the reaction family  WHEN a selector is built
    message = _refusal(["reaction.*"])
    # THEN it is refused as never matchable, by the loop guard
    assert "names the reaction family, which is never matchable" in message


def test_a_reaction_fact_never_matches_even_through_a_verb_wildcard() -> None:
    # GIVEN a registry where reaction.delivered and task.delivered exist and both are listed
    base = EVENT_TYPES["task.completed"]
    registry = {
        name: dataclasses.replace(base, name=name)
        for name in ("reaction.delivered", "task.delivered")
    }
    grammar = KindGrammar(registry, triggerable=set(registry))
    selector = Selector.create(["*.delivered"], grammar=grammar)
    reaction, task = (
        _task("task.completed", {"agentId": "builder-1"}).model_copy(update={"event_type": name})
        for name in ("reaction.delivered", "task.delivered")
    )
    # WHEN a fact of each is offered
    # THEN the reaction fact does not match, the task fact does
    assert not event_selector_matches(selector, reaction, grammar=grammar)
    assert event_selector_matches(selector, task, grammar=grammar)
    with pytest.raises(SelectorError, match="never matchable"):
        Selector.create(["reaction.delivered"], grammar=grammar)


def test_an_event_of_an_unregistered_kind_never_matches() -> None:
    # GIVEN a selector on *.completed and a fact whose kind the grammar does not know
    selector = Selector.create(["*.completed"])
    stranger = _task("task.completed", {"agentId": "a"}).model_copy(
        update={"event_type": "schedule.completed"}
    )
    # WHEN it is offered  THEN it does not match
    assert not event_selector_matches(selector, stranger)


def test_kinds_must_be_a_non_empty_list() -> None:
    # GIVEN no pattern, or a bare string  WHEN a selector is built  THEN both are refused
    assert "kinds" in _refusal([])
    assert "kinds must be a list of patterns, not the string 'task.ready'" in _refusal("task.ready")


# -- filters ----------------------------------------------------------------------------------


def test_a_subject_filter_matches_the_envelope_field() -> None:
    # GIVEN task.* filtered to one Change
    selector = Selector.create(["task.*"], {"subject.changeId": "c1"})
    # WHEN facts of that Change and of another are offered
    # THEN only the first matches
    assert event_selector_matches(selector, _task("task.ready", {}, change="c1"))
    assert not event_selector_matches(selector, _task("task.ready", {}, change="c2"))


def test_a_list_of_values_matches_any_of_them() -> None:
    # GIVEN task.* filtered to two tasks
    selector = Selector.create(["task.*"], {"subject.taskId": ["t1", "t2"]})
    # WHEN three tasks are offered  THEN the two listed match
    assert event_selector_matches(selector, _task("task.ready", {}, task="t1"))
    assert event_selector_matches(selector, _task("task.ready", {}, task="t2"))
    assert not event_selector_matches(selector, _task("task.ready", {}, task="t3"))


def test_every_filter_key_must_hold() -> None:
    # GIVEN a filter on the actor and a payload field
    selector = Selector.create(
        ["task.completed"], {"subject.actor": "agent:builder-1", "payload.agentId": "builder-1"}
    )
    # WHEN a fact meeting both and one meeting only the actor are offered
    # THEN only the first matches
    assert event_selector_matches(selector, _task("task.completed", {"agentId": "builder-1"}))
    assert not event_selector_matches(selector, _task("task.completed", {"agentId": "other"}))


def test_a_payload_filter_compares_the_wire_field_exactly() -> None:
    # GIVEN release.* filtered to generation 3
    selector = Selector.create(["release.*"], {"payload.generation": 3})
    # WHEN releases of generation 3 and 4 are offered  THEN only 3 matches
    assert event_selector_matches(selector, _release("release.started", 3))
    assert not event_selector_matches(selector, _release("release.started", 4))


def test_a_selected_kind_without_the_payload_field_never_matches() -> None:
    # GIVEN task.* filtered on agentId, which task.ready does not carry
    selector = Selector.create(["task.*"], {"payload.agentId": "builder-1"})
    # WHEN a ready task and a completed one are offered
    # THEN only the completed one matches
    assert not event_selector_matches(selector, _task("task.ready", {}))
    assert event_selector_matches(selector, _task("task.completed", {"agentId": "builder-1"}))


def test_an_absent_optional_value_never_matches() -> None:
    # GIVEN task.failed filtered on agentId, and a failure without an agent
    selector = Selector.create(["task.failed"], {"payload.agentId": "builder-1"})
    # WHEN it is offered  THEN it does not match
    assert not event_selector_matches(selector, _task("task.failed", {"reason": "dead letter"}))


def test_a_subject_filter_on_a_field_the_fact_lacks_never_matches() -> None:
    # GIVEN release.* filtered on a task, which release facts do not carry
    selector = Selector.create(["release.*"], {"subject.taskId": "t1"})
    # WHEN a release is offered  THEN it does not match
    assert not event_selector_matches(selector, _release("release.started", 3))


@pytest.mark.parametrize(
    ("kinds", "filter", "expected"),
    [
        (["task.*"], {"changeId": "c1"}, "is neither subject.<field> nor payload.<field>"),
        (["task.*"], {"subject.chnageId": "c1"}, "did you mean subject.changeId?"),
        (["task.*"], {"subject.changeId": 7}, "subject.changeId is a string"),
        (["task.*"], {"payload.agent_id": "a"}, "did you mean payload.agentId?"),
        (["release.*"], {"payload.candidateId": "x"}, "is no payload field of the selected"),
        (["intent.*"], {"payload.paths": "src/"}, "is a list or timestamp field"),
        (["claim.expired"], {"payload.expiredAt": "2026"}, "is a list or timestamp field"),
        (["promotion.*"], {"payload.outcome": "promotd"}, "one of 'promoted'"),
        (["release.*"], {"payload.generation": True}, "never holds (an integer)"),
        (["release.*"], {"payload.generation": "3"}, "never holds (an integer)"),
        (["task.*"], {"payload.agentId": []}, "allows an empty list of values"),
        (["task.*"], {"payload.agentId": 1.5}, "has value 1.5"),
        (["task.*"], {"payload.agentId": None}, "has value None"),
        (["task.*"], {"payload.agentId": [["a"]]}, "has value ['a']"),
    ],
)
def test_a_filter_that_can_never_match_is_refused_naming_key_and_value(
    kinds: list[str], filter: dict[str, Any], expected: str
) -> None:
    # GIVEN a filter with a bad key or value  WHEN a selector is built
    message = _refusal(kinds, filter)
    # THEN the refusal names the key and says what is wrong
    assert next(iter(filter)) in message
    assert expected in message


_TASK_KINDS = "task.assigned, task.blocked, task.completed, task.failed, task.ready, task.started"
_TASK_FIELDS = "agentId, agentRole, blockedLimit, changesetId, reason"
_SUBJECT_FIELDS = "projectId, changeId, taskId, resource, actor"
_SCALARS = "a filter value is a string, an integer, a boolean or a list of them"


@pytest.mark.parametrize(
    ("kinds", "filter", "refusal"),
    [
        (
            ["task.*"],
            {"payload.": "c1"},
            "filter key 'payload.' is neither subject.<field> nor payload.<field> "
            "(subject.changeId, payload.candidateId)",
        ),
        (
            ["task.*"],
            {"subject.change.Id": "c1"},
            "filter key 'subject.change.Id' names no envelope field; did you mean "
            f"subject.changeId? subject fields are {_SUBJECT_FIELDS}",
        ),
        (
            ["task.*"],
            {"subject.zzz": "c1"},
            "filter key 'subject.zzz' names no envelope field; "
            f"subject fields are {_SUBJECT_FIELDS}",
        ),
        (
            ["task.*"],
            {"payload.agent_id": "a"},
            "filter key 'payload.agent_id' is no payload field of the selected kinds "
            f"({_TASK_KINDS}); did you mean payload.agentId? their filterable fields are "
            f"{_TASK_FIELDS}",
        ),
        (
            ["task.ready"],
            {"payload.qqqq": "a"},
            "filter key 'payload.qqqq' is no payload field of the selected kinds (task.ready); "
            "their filterable fields are agentRole",
        ),
        (
            ["change.planned"],
            {"payload.qqqq": "a"},
            "filter key 'payload.qqqq' is no payload field of the selected kinds "
            "(change.planned); their filterable fields are none",
        ),
        (
            ["intent.*"],
            {"payload.paths": "src/"},
            "filter key 'payload.paths' is a list or timestamp field; filters compare strings, "
            "integers and booleans exactly",
        ),
        (
            ["task.failed", "verification.started"],
            {"payload.reason": 3},
            "filter 'payload.reason' has value 3, which reason never holds (a string or one of "
            "'work_graph_completed', 'rebase', 'manual'), so it would never match",
        ),
        (
            ["task.*"],
            {"payload.agentId": 1.5},
            f"filter: filter 'payload.agentId' has value 1.5; {_SCALARS}",
        ),
        (
            ["task.completd"],
            None,
            "kinds: kind pattern 'task.completd' matches no registered kind (did you mean "
            "task.completed or release.completed or change.completed?); `rhumbatron kinds` "
            "lists them",
        ),
        (
            ["tsak.*"],
            None,
            "kinds: kind pattern 'tsak.*' matches no registered kind (did you mean task.*?); "
            "`rhumbatron kinds` lists them",
        ),
        (
            ["blargh.*"],
            None,
            "kinds: kind pattern 'blargh.*' matches no registered kind; `rhumbatron kinds` "
            "lists them",
        ),
        (["task.*", 3], None, "kinds.1: Input should be a valid string"),
        (
            [2, 3],
            None,
            "kinds.0: Input should be a valid string; kinds.1: Input should be a valid string; "
            "kinds: Tuple should have at least 1 item after validation, not 0",
        ),
    ],
)
def test_a_refusal_says_word_for_word_what_is_wrong_and_what_would_do(
    kinds: list[Any], filter: dict[str, Any] | None, refusal: str
) -> None:
    # GIVEN a selector that can never match  WHEN it is built
    # THEN the whole refusal reads as written: the key, the value, the fields or kinds near it
    assert _refusal(kinds, filter) == f"invalid selector: {refusal}"


def test_a_filter_may_list_exactly_the_cap_of_values() -> None:
    values = [f"t{i}" for i in range(MAX_FILTER_VALUES)]
    assert Selector.create(["task.*"], {"subject.taskId": values})


def test_a_filter_lists_at_most_the_cap_of_values() -> None:
    # GIVEN one value more than the cap  WHEN a selector is built  THEN it is refused
    values = [f"t{i}" for i in range(MAX_FILTER_VALUES + 1)]
    assert f"at most {MAX_FILTER_VALUES}" in _refusal(["task.*"], {"subject.taskId": values})


def test_filter_values_compare_exactly_so_a_bool_is_never_an_integer() -> None:
    # GIVEN the one comparison that validation and matching share
    # WHEN bools, integers and strings are compared
    # THEN equal values of the same kind are equal, and True is not 1
    assert same_value(1, 1) and same_value("a", "a") and same_value(True, True)
    assert not same_value(True, 1)
    assert not same_value(0, False)
    assert not same_value("1", 1)


# -- the model --------------------------------------------------------------------------------


def test_a_selector_round_trips_through_its_wire_form() -> None:
    # GIVEN a selector with a list value
    selector = Selector.create(["task.*", "*.failed"], {"subject.taskId": ["t1", "t2"]})
    # WHEN it is dumped as JSON and parsed again
    wire = selector.model_dump(mode="json")
    # THEN the wire form uses lists and the parse equals the original
    assert wire == {"kinds": ["task.*", "*.failed"], "filter": {"subject.taskId": ["t1", "t2"]}}
    assert Selector.parse(wire) == selector


def test_a_selector_is_immutable() -> None:
    # GIVEN a selector
    selector = Selector.create(["task.*"], {"subject.taskId": "t1"})
    # WHEN its fields or its filter are changed  THEN both are refused
    with pytest.raises(ValidationError):
        selector.kinds = ("release.*",)  # type: ignore[misc]
    with pytest.raises(TypeError):
        selector.filter["subject.taskId"] = "t2"  # type: ignore[index]


def test_an_unknown_selector_field_is_refused() -> None:
    # GIVEN a wire selector with a field the grammar lacks  WHEN it is parsed  THEN refused
    with pytest.raises(SelectorError, match="when"):
        Selector.parse({"kinds": ["task.*"], "when": "always"})


def test_building_a_selector_directly_validates_the_same_way() -> None:
    # GIVEN the pydantic constructor  WHEN it gets an unknown pattern
    # THEN pydantic's ValidationError carries the same message
    with pytest.raises(ValidationError, match="matches no registered kind"):
        Selector(kinds=("task.complete",))


def test_the_selectors_module_exports_its_public_names() -> None:
    # GIVEN the module  WHEN __all__ is read  THEN each name exists
    for name in selectors_module.__all__:
        assert hasattr(selectors_module, name), name


def test_a_pattern_part_starts_with_a_lowercase_letter_and_may_hold_underscores() -> None:
    # WHEN a kind with an underscore in its verb is named  THEN it is selected
    assert Selector.create(["change.status_changed"]).kinds == ("change.status_changed",)
    # AND a part that starts with an underscore is not a part
    with pytest.raises(SelectorError) as refused:
        Selector.create(["_task.completed"])
    assert str(refused.value) == (
        "invalid selector: kinds: kind pattern '_task.completed' is not <subject>.<verb>: each "
        "part is lowercase letters and _, or a whole * (task.completed, task.*, *.completed)"
    )


def test_a_pattern_of_only_untriggerable_kinds_names_each_and_why() -> None:
    # GIVEN a grammar whose allow-list leaves out both task kinds below
    registry = {name: EVENT_TYPES[name] for name in ("task.completed", "task.failed")}
    grammar = KindGrammar(registry, triggerable=())
    # WHEN a pattern matches only those  THEN each is named with its reason
    with pytest.raises(SelectorError) as refused:
        Selector.create(["task.*"], grammar=grammar)
    assert str(refused.value) == (
        "invalid selector: kinds: kind pattern 'task.*' matches only kinds that cannot trigger "
        "reactions (task.completed: not on the allow-list; task.failed: not on the allow-list); "
        "`rhumbatron kinds` shows which can"
    )
