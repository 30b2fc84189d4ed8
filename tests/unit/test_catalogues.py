"""The two closed catalogues, EVENT_TYPES and COMMAND_TYPES, flag by flag as the spec lists them.

Each flag decides behaviour elsewhere: ``informational`` whether the causal router looks at a
fact at all, ``counts_toward_change_cap`` what the 1,000-command breaker counts,
``requires_change``/``requires_task`` which key fields an envelope must carry. The sets are
written out here, from the spec's flowchart and tables, not read back from the catalogue.
"""

from __future__ import annotations

import pytest

from rhumbatron.protocol.command_types import COMMAND_TYPES, _cmd
from rhumbatron.protocol.event_types import EVENT_TYPES, TaskCompleted, _spec
from unit.test_envelopes import RESOURCE_EVENTS

# The causal router's flowchart (S0-0xx "causal routing"): the only facts a rule reacts to.
ROUTED_BY_A_CAUSAL_RULE = {
    "change.planned",
    "task.completed",
    "task.failed",
    "verification.started",
    "canonical.advanced",
    "artifact.promoted",
} | RESOURCE_EVENTS  # the six resource Events, checked for overlap

# The 1,000-command cap counts exactly these (doc 000, "Caps").
COUNTED_BY_THE_CHANGE_CAP = {"change.dispatch", "candidate.create", "change.settle", "agent.wake"}

TASK_FACTS = {
    "task.ready",
    "task.assigned",
    "task.started",
    "task.completed",
    "task.failed",
    "task.blocked",
}

CHANGE_FACTS_WITHOUT_A_TASK = {
    "change.created",
    "change.planned",
    "change.status_changed",
    "change.completed",
    "change.failed",
    "change.cancelled",
    "change.declined",
    "change.not_selected",
    "change.settled",
    "agent.woke",
    "model.routed",
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
}


def test_a_causal_rule_reacts_to_exactly_the_facts_of_the_flowchart() -> None:
    routed = {name for name, spec in EVENT_TYPES.items() if not spec.informational}
    assert routed == ROUTED_BY_A_CAUSAL_RULE


def test_exactly_the_four_command_types_of_the_spec_count_toward_the_change_cap() -> None:
    counted = {name for name, spec in COMMAND_TYPES.items() if spec.counts_toward_change_cap}
    assert counted == COUNTED_BY_THE_CHANGE_CAP


def test_task_facts_need_a_task_and_change_facts_need_a_change() -> None:
    needs_task = {name for name, spec in EVENT_TYPES.items() if spec.requires_task}
    needs_change = {name for name, spec in EVENT_TYPES.items() if spec.requires_change}
    assert needs_task == TASK_FACTS
    assert needs_change == TASK_FACTS | CHANGE_FACTS_WITHOUT_A_TASK


def test_every_type_says_in_a_sentence_what_it_is() -> None:
    # The summaries are what `rhumbatron kinds` and the docs print for each type.
    summaries = [spec.summary for spec in EVENT_TYPES.values()]
    summaries += [spec.summary for spec in COMMAND_TYPES.values()]
    not_sentences = [s for s in summaries if not (isinstance(s, str) and s[:1].isupper())]
    assert not_sentences == []
    assert all(s.endswith(".") for s in summaries)


def test_a_catalogue_entry_that_breaks_the_grammar_is_refused_naming_it() -> None:
    # An event type must be <subject>.<verb>; a command type must name a known queue.
    with pytest.raises(ValueError) as bad_event:
        _spec(
            "TaskDone",
            TaskCompleted,
            EVENT_TYPES["task.completed"].owner,
            EVENT_TYPES["task.completed"].id_kind,
            "A task finished.",
        )
    assert str(bad_event.value) == "event type 'TaskDone' does not follow <subject>.<verb>"
    with pytest.raises(ValueError) as bad_command:
        _cmd("agent.poke", TaskCompleted, "nowhere", "Poke an agent.")
    assert str(bad_command.value) == "command 'agent.poke' names unknown queue 'nowhere'"


def test_every_event_type_is_one_subject_and_one_verb() -> None:
    # The view's projections read the verb as what follows the one dot (task.failed -> failed).
    assert [name for name in EVENT_TYPES if len(name.split(".")) != 2] == []
