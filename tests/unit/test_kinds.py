"""The kind grammar (spec "Coverage grows by grammar", S2-033, S2-034, S2-036, S2-095): every
kind is ``<subject>.<verb>`` with its subject, triggerability and payload model, ``rhumbatron
kinds`` lists them, and the review rule holds both ways: every fact a transition can emit is
registered, and every registered kind has an emitter.

The emitters are found by reading the source of the package and of the development package
(the scenario runner replays Change facts): every ``<ctx>.fact(<type>, ...)`` call.
A type given as an f-string (``f"change.{target.value}"``) is expanded from the domain table
that decides which values can reach it; a type held in a local variable is read from its
assignments; any other call site must be a listed pass-through.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import rhumbatron
import rhumbatron_dev
from rhumbatron.cli import main
from rhumbatron.domain.candidates import CANDIDATE_MOVES
from rhumbatron.domain.changes import TERMINAL_STATUSES
from rhumbatron.domain.project import PROJECT_ADMIN_MOVES
from rhumbatron.domain.releases import ReleaseStatus
from rhumbatron.protocol.event_types import EVENT_TYPES
from rhumbatron.reactions import kinds as kinds_module
from rhumbatron.reactions.kinds import (
    KIND_GRAMMAR,
    NOT_TRIGGERABLE,
    REACTION_FAMILY,
    SUBJECT_OF_NOUN,
    TRIGGERABLE_EVENT_KINDS,
    KindGrammar,
    PayloadField,
    SubjectType,
    kind_pattern_matches,
    kinds_table,
    list_kinds,
)
from rhumbatron.reactions.selectors import SUBJECT_FIELDS

PACKAGE = Path(rhumbatron.__file__).resolve().parent
DEV_PACKAGE = Path(rhumbatron_dev.__file__).resolve().parent

#: f-string families, expanded from the table that decides which values reach them.
FAMILIES: dict[str, frozenset[str]] = {
    # move_change: a terminal state records change.<state>.
    "change.{}": frozenset(f"change.{s}" for s in TERMINAL_STATUSES),
    # decide_candidate: every state a legal move can reach.
    "candidate.{}": frozenset(
        f"candidate.{s.value}" for targets in CANDIDATE_MOVES.values() for s in targets
    ),
    # finish_release: completed or failed; it refuses started.
    "release.{}": frozenset(
        f"release.{s.value}" for s in ReleaseStatus if s is not ReleaseStatus.STARTED
    ),
    # set_project_status: every state a legal move can reach.
    "project.{}": frozenset(
        f"project.{s}" for targets in PROJECT_ADMIN_MOVES.values() for s in targets
    ),
}

#: Call sites whose type is data, not code: they emit no kind of their own.
PASS_THROUGH: dict[tuple[str, str], str] = {
    ("domain/changes.py", "append_change_events"): "replays recorded Change facts (the "
    "scenario runner); it refuses any type that is not a registered Change Event",
}

#: Kinds about a resource whose registry entry does not require ``resource`` (the flag means
#: "one of the six resource Events"), with why the ID is still there.
RESOURCE_NOT_REQUIRED = {
    "claim.acquired": "acquire_claim always passes resource=",
}


@dataclass(frozen=True)
class FactSite:
    """One ``.fact(...)`` call: where, and the kinds it can emit (None: not resolvable)."""

    path: str
    function: str
    line: int
    kinds: frozenset[str] | None


class _FactFinder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.sites: list[FactSite] = []
        self.replayed: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        first = node.args[0] if node.args else None
        if isinstance(node.func, ast.Attribute) and node.func.attr == "fact" and first:
            function = self.functions[-1] if self.functions else None
            self.sites.append(
                FactSite(
                    self.path,
                    function.name if function else "<module>",
                    node.lineno,
                    _resolve(first, function),
                )
            )
        replay = isinstance(node.func, ast.Name) and node.func.id == "ChangeFact"
        if replay and isinstance(first, ast.Constant) and isinstance(first.value, str):
            self.replayed.add(first.value)
        self.generic_visit(node)


def _resolve(
    arg: ast.expr, function: ast.FunctionDef | ast.AsyncFunctionDef | None
) -> frozenset[str] | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return frozenset({arg.value})
    if isinstance(arg, ast.JoinedStr):
        template = "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
            for v in arg.values
        )
        return FAMILIES.get(template)
    if isinstance(arg, ast.IfExp):
        body, orelse = _resolve(arg.body, function), _resolve(arg.orelse, function)
        return None if body is None or orelse is None else body | orelse
    if isinstance(arg, ast.Name) and function is not None:
        values = [
            node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets)
        ]
        resolved = [_resolve(v, function) for v in values]
        if values and all(r is not None for r in resolved):
            return frozenset().union(*(r for r in resolved if r is not None))
    return None


@dataclass(frozen=True)
class Scan:
    sites: tuple[FactSite, ...]
    replayed: frozenset[str]

    @property
    def emitted(self) -> frozenset[str]:
        return frozenset().union(*(s.kinds for s in self.sites if s.kinds is not None))

    @property
    def unresolved(self) -> set[tuple[str, str]]:
        return {(s.path, s.function) for s in self.sites if s.kinds is None}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    """Every module of the package (``protocol/ids.py``), then of the development package
    (``rhumbatron_dev/demo.py``), which holds the demo, the scenario runner and the local
    dashboard."""
    for root, prefix in ((PACKAGE, ""), (DEV_PACKAGE, "rhumbatron_dev/")):
        for file in sorted(root.rglob("*.py")):
            path = prefix + file.relative_to(root).as_posix()
            yield path, ast.parse(file.read_text(), str(file))


@pytest.fixture(scope="module")
def scan() -> Scan:
    sites: list[FactSite] = []
    replayed: set[str] = set()
    for path, tree in _modules():
        finder = _FactFinder(path)
        finder.visit(tree)
        sites += finder.sites
        replayed |= finder.replayed
    return Scan(tuple(sites), frozenset(replayed))


# -- the review rule, both ways ---------------------------------------------------------------


def test_every_fact_a_transition_can_emit_is_registered(scan: Scan) -> None:
    # GIVEN every .fact(...) call site of the package, and every replayed ChangeFact
    # WHEN their kinds are compared with the registry
    unregistered = sorted((scan.emitted | scan.replayed) - set(EVENT_TYPES))
    # THEN none is missing from EVENT_TYPES
    assert unregistered == [], f"emitted but not registered in EVENT_TYPES: {unregistered}"


def test_every_fact_call_site_resolves_to_kinds_or_is_a_listed_pass_through(scan: Scan) -> None:
    # GIVEN the call sites whose type could not be read from the code
    # WHEN they are compared with the listed pass-throughs
    # THEN they are exactly those (a new f-string family needs a FAMILIES entry)
    assert scan.unresolved == set(PASS_THROUGH), "unresolved .fact() call sites: " + ", ".join(
        f"{s.path}:{s.line} in {s.function}" for s in scan.sites if s.kinds is None
    )


def test_every_f_string_family_is_used_and_expands_to_registered_kinds(scan: Scan) -> None:
    # GIVEN the f-string families the scan expands
    # WHEN each is looked for among the call sites
    used = {
        family for family, names in FAMILIES.items() if any(s.kinds == names for s in scan.sites)
    }
    # THEN each is used by some emitter, and names only registered kinds
    assert used == set(FAMILIES)
    for family, names in FAMILIES.items():
        assert names, family
        assert names <= set(EVENT_TYPES), (family, sorted(names - set(EVENT_TYPES)))


def test_every_registered_kind_has_an_emitter(scan: Scan) -> None:
    # GIVEN the registered kinds
    # WHEN those that no transition emits are collected
    without_emitter = set(EVENT_TYPES) - scan.emitted
    # THEN there is none: a kind nothing can emit is dead weight, or a transition forgot it
    assert sorted(without_emitter) == [], "registered kinds without an emitter (add one)"


def test_the_scan_sees_the_emitters_it_is_meant_to_see(scan: Scan) -> None:
    # GIVEN the scan
    # WHEN the emitters of a literal, a variable, an f-string family and an actor are looked up
    by_kind = {k: s for s in scan.sites for k in (s.kinds or ())}
    # THEN each is found where the code emits it
    assert by_kind["task.completed"].path == "domain/tasks.py"
    assert by_kind["intent.changed"].function == "declare_intent"
    assert by_kind["candidate.promoted"].function == "decide_candidate"
    assert by_kind["promotion.completed"].path == "actors/shard_handlers.py"


# -- the grammar ------------------------------------------------------------------------------


def test_the_grammar_has_one_kind_per_registered_type_with_its_payload_model() -> None:
    # GIVEN the registry and the grammar
    # WHEN each kind is compared with its registry entry
    # THEN the names are the same and each kind splits into its subject and verb
    assert list(KIND_GRAMMAR) == list(EVENT_TYPES)
    for name, kind in KIND_GRAMMAR.items():
        spec = EVENT_TYPES[name]
        assert f"{kind.subject}.{kind.verb}" == name
        assert (kind.version, kind.owner, kind.payload) == (spec.version, spec.owner, spec.payload)


def test_the_grammar_is_read_only() -> None:
    # GIVEN the grammar
    # WHEN a kind is assigned or a field of a kind is changed
    # THEN both are refused
    with pytest.raises(TypeError):
        KIND_GRAMMAR["task.completed"] = KIND_GRAMMAR["task.failed"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        KIND_GRAMMAR["claim.acquired"].triggerable = True  # type: ignore[misc]


def test_every_registered_noun_says_what_it_is_about() -> None:
    # GIVEN the nouns of the registry
    # WHEN each is looked up in the noun table
    # THEN none falls back on the flags
    assert sorted(KIND_GRAMMAR.subjects - set(SUBJECT_OF_NOUN)) == []


@pytest.mark.parametrize(
    ("noun", "about"),
    [
        ("promotion", "candidate"),
        ("candidate", "candidate"),
        ("canonical", "project"),
        ("claim", "resource"),
        ("verification", "change"),
        ("schedule", "schedule"),
        ("reaction", "subscription"),
        ("log", "stream"),
    ],
)
def test_one_noun_family_is_about_one_type_of_thing_whatever_its_verb(
    noun: str, about: str
) -> None:
    # GIVEN the kinds of one noun family (promotion.started, promotion.completed ...)
    family = [kind for name, kind in KIND_GRAMMAR.items() if name.split(".")[0] == noun]
    # WHEN each says what it is about
    # THEN they all name the same type of thing, the one the noun stands for
    assert family, noun
    assert {kind.about.value for kind in family} == {about}


def test_every_kind_carries_the_id_of_what_it_is_about() -> None:
    # GIVEN each kind and where the ID of its subject lives
    for name, kind in KIND_GRAMMAR.items():
        spec = kind.spec
        part, field = kind.subject_id_key.split(".")
        # WHEN that place is checked against the envelope rules and the payload model
        # THEN the ID is always there
        if part == "payload":
            required = {f.name for f in kind.payload_fields if f.required}
            assert field in required, (name, field)
        else:
            assert field in SUBJECT_FIELDS, (name, field)
            if field == "changeId":
                assert spec.requires_change, name
            if field == "taskId":
                assert spec.requires_task, name
            if field == "resource":
                assert spec.resource_event or name in RESOURCE_NOT_REQUIRED, name


def test_the_subject_types_name_a_filter_key_each() -> None:
    # GIVEN the subject types
    # WHEN their ID keys are read
    # THEN each is subject.<envelope field> or payload.<field>
    for subject in SubjectType:
        part, field = subject.id_key.split(".")
        assert part in ("subject", "payload") and field, subject
        if part == "subject":
            assert field in SUBJECT_FIELDS, subject


def test_every_registered_kind_is_decided_triggerable_or_not_explicitly() -> None:
    # GIVEN the allow-list and the list of kinds left off it
    triggerable, left_off = TRIGGERABLE_EVENT_KINDS, set(NOT_TRIGGERABLE)
    # WHEN they are compared with the registry
    registered = {n for n in EVENT_TYPES if not n.startswith(f"{REACTION_FAMILY}.")}
    # THEN every kind is on exactly one list, and both name only registered kinds
    assert triggerable & left_off == set()
    assert sorted(registered - triggerable - left_off) == []
    assert sorted((triggerable | left_off) - set(EVENT_TYPES)) == []
    for name, kind in KIND_GRAMMAR.items():
        assert kind.triggerable is (name in triggerable), name


def test_the_agent_narration_and_lease_kinds_cannot_trigger_reactions() -> None:
    # GIVEN the kinds that narrate an agent's own activation or a lease
    # WHEN their triggerability is read
    # THEN none can trigger, and the rest of their families can
    for name in ("agent.woke", "model.routed", "claim.acquired", "claim.released"):
        assert not KIND_GRAMMAR[name].triggerable, name
    assert KIND_GRAMMAR["claim.expired"].triggerable
    assert KIND_GRAMMAR["task.completed"].triggerable


def test_a_reaction_kind_is_never_triggerable_even_when_listed() -> None:
    # GIVEN a registry with a reaction.delivered kind that the allow-list names
    spec = dataclasses.replace(EVENT_TYPES["task.completed"], name="reaction.delivered")
    registry = {"reaction.delivered": spec, "task.completed": EVENT_TYPES["task.completed"]}
    # WHEN the grammar is built over it
    grammar = KindGrammar(registry, triggerable={"reaction.delivered", "task.completed"})
    # THEN the reaction kind cannot trigger, and is listed with the loop guard as the reason
    assert not grammar["reaction.delivered"].triggerable
    assert grammar["task.completed"].triggerable
    row = next(r for r in list_kinds(grammar) if r["kind"] == "reaction.delivered")
    assert "loop guard" in row["notTriggerableBecause"]


@pytest.mark.parametrize(
    ("pattern", "kind", "matches"),
    [
        ("task.completed", "task.completed", True),
        ("task.*", "task.completed", True),
        ("*.completed", "task.completed", True),
        ("task.*", "change.completed", False),
        ("*.completed", "task.failed", False),
        ("task", "task.completed", False),
        ("task.completed.x", "task.completed", False),
    ],
)
def test_a_wildcard_stands_for_one_whole_part(pattern: str, kind: str, matches: bool) -> None:
    # GIVEN a pattern and a kind  WHEN they are compared  THEN * matches a whole part only
    assert kind_pattern_matches(pattern, kind) is matches


# -- rhumbatron kinds -------------------------------------------------------------------------


def test_list_kinds_gives_one_row_per_kind_with_its_payload_fields() -> None:
    # GIVEN the grammar
    # WHEN the rows are listed
    rows = {row["kind"]: row for row in list_kinds()}
    # THEN every kind has a row, with wire field names and which are optional
    assert list(rows) == sorted(EVENT_TYPES)
    promoted = rows["candidate.promoted"]
    assert promoted["subject"] == "candidate" and promoted["subjectId"] == "payload.candidateId"
    assert promoted["triggerable"] is True and promoted["notTriggerableBecause"] is None
    assert promoted["payload"] == {
        "model": "CandidateDecided",
        "fields": [
            {"name": "candidateId", "required": True, "filterable": True},
            {"name": "reason", "required": False, "filterable": True},
        ],
    }
    assert {"name": "paths", "required": True, "filterable": False} in rows["intent.declared"][
        "payload"
    ]["fields"]
    assert rows["claim.acquired"]["notTriggerableBecause"] == NOT_TRIGGERABLE["claim.acquired"]


def test_rhumbatron_kinds_prints_a_table_of_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the CLI
    # WHEN `rhumbatron kinds` runs
    status = main(["kinds"])
    out = capsys.readouterr().out.splitlines()
    # THEN it prints a header, one line per kind and a count
    assert status == 0
    assert out[0].split()[:3] == ["KIND", "VERSION", "SUBJECT"]
    lines = {line.split()[0]: line.split() for line in out[1:-1]}
    assert set(lines) == set(EVENT_TYPES)
    assert lines["task.completed"][:6] == [
        "task.completed",
        "1",
        "task",
        "subject.taskId",
        "yes",
        "resource_shard",
    ]
    assert lines["agent.woke"][4] == "no"
    assert "agentId, changesetId?" in " ".join(lines["task.completed"])
    triggerable = sum(1 for k in KIND_GRAMMAR.values() if k.triggerable)
    assert out[-1] == f"{len(EVENT_TYPES)} kind(s), {triggerable} triggerable"


def test_rhumbatron_kinds_json_prints_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the CLI
    # WHEN `rhumbatron kinds --json` runs
    status = main(["kinds", "--json"])
    # THEN it prints list_kinds() as JSON
    assert status == 0
    assert json.loads(capsys.readouterr().out) == list_kinds()


def test_the_kinds_module_exports_what_it_defines() -> None:
    # GIVEN the names the module defines at its top level
    tree = ast.parse(Path(kinds_module.__file__ or "").read_text())
    defined = {
        target.id
        for node in tree.body
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if isinstance(target, ast.Name)
    } | {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    # WHEN the public ones are compared with __all__
    public = {name for name in defined if not name.startswith("_")} - {"__all__"}
    # THEN they agree
    assert public == set(kinds_module.__all__)


def test_a_kinds_row_names_every_property_of_the_kind() -> None:
    # GIVEN a reaction fact, never matchable, and a triggerable fact
    rows = {row["kind"]: row for row in list_kinds()}
    disabled, started = rows["reaction.disabled"], rows["verification.started"]
    # WHEN their rows are read  THEN every key says what the JSON output promises
    assert {k: v for k, v in disabled.items() if k != "payload"} == {
        "kind": "reaction.disabled",
        "version": 1,
        "subject": "reaction",
        "verb": "disabled",
        "about": "subscription",
        "subjectId": "payload.subscriptionId",
        "triggerable": False,
        "notTriggerableBecause": "the reaction family is never matchable (loop guard, S2-014)",
        "owner": "resource_shard",
        "idKind": "actor_minted",
        "summary": "A webhook subscription whose endpoint keeps failing was disabled.",
    }
    assert (started["verb"], started["about"], started["notTriggerableBecause"]) == (
        "started",
        "change",
        None,
    )


def test_a_noun_the_grammar_does_not_list_is_about_what_its_types_flags_say() -> None:
    # GIVEN a registry of nouns SUBJECT_OF_NOUN does not list, each with another type's flags
    # (a task's, a change's, a resource's, a project's), none of them on the allow-list
    flags_of = {"widget": "task.ready", "gadget": "change.created", "gizmo": "claim.released"}
    registry = {f"{noun}.made": EVENT_TYPES[kind] for noun, kind in flags_of.items()}
    registry["doohickey.made"] = EVENT_TYPES["project.created"]
    assert not set(SUBJECT_OF_NOUN) & {name.split(".")[0] for name in registry}

    # WHEN the grammar reads them
    rows = {row["kind"]: row for row in list_kinds(KindGrammar(registry, triggerable=()))}

    # THEN each is about what its flags say, and none is triggerable, for want of a listing
    assert {name: (row["about"], row["subjectId"]) for name, row in rows.items()} == {
        "widget.made": ("task", "subject.taskId"),
        "gadget.made": ("change", "subject.changeId"),
        "gizmo.made": ("resource", "subject.resource"),
        "doohickey.made": ("project", "subject.projectId"),
    }
    assert {row["notTriggerableBecause"] for row in rows.values()} == {
        "not on the allow-list (TRIGGERABLE_EVENT_KINDS)"
    }


def test_the_kinds_table_is_aligned_in_columns_and_marks_optional_and_missing_fields() -> None:
    # GIVEN two kinds' rows, and a third whose payload has no field
    rows = {row["kind"]: row for row in list_kinds()}
    bare = {**rows["task.ready"], "kind": "task.bare", "payload": {"model": "X", "fields": []}}
    # WHEN they are printed as a table
    table = kinds_table([rows["agent.woke"], rows["verification.started"], bare])
    # THEN each column is as wide as its widest cell, the last one free
    assert table.splitlines() == [
        "KIND                  VERSION  SUBJECT       SUBJECT ID        TRIGGERABLE  OWNER        "
        "   PAYLOAD FIELDS",
        "agent.woke            1        agent         payload.agentId   no           resource_shard"
        "  agentId, falseWakeup?",
        "verification.started  1        verification  subject.changeId  yes          resource_shard"
        "  reason?",
        "task.bare             1        task          subject.taskId    yes          resource_shard"
        "  -",
        "3 kind(s), 2 triggerable",
    ]


def test_a_payload_field_says_in_words_what_it_holds() -> None:
    # GIVEN fields of every sort the registry holds
    def field(kind: str, name: str) -> PayloadField:
        return next(f for f in KIND_GRAMMAR[kind].payload_fields if f.name == name)

    # WHEN what each holds is read  THEN it is said in words, a Literal's values listed
    assert field("project.created", "name").holds == "a string"
    assert field("artifact.promoted", "generation").holds == "an integer"
    assert field("agent.woke", "falseWakeup").holds == "a boolean"
    assert field("claim.acquired", "mode").holds == "one of 'exclusive', 'shared'"
    # AND any other type by its name, or as it prints when it has none
    assert field("claim.acquired", "expiresAt").holds == "datetime"
    assert PayloadField("x", "x", "Widget", required=True).holds == "Widget"


def test_a_payload_field_accepts_only_values_of_what_it_holds() -> None:
    # GIVEN fields of every scalar sort the registry holds
    def field(kind: str, name: str) -> PayloadField:
        return next(f for f in KIND_GRAMMAR[kind].payload_fields if f.name == name)

    text, number = field("project.created", "name"), field("artifact.promoted", "generation")
    flag, mode = field("agent.woke", "falseWakeup"), field("claim.acquired", "mode")
    # WHEN values are offered  THEN each takes its own sort only (a bool is no integer), and a
    # Literal only its members
    assert (text.accepts("Shop"), text.accepts(5)) == (True, False)
    assert (number.accepts(3), number.accepts(True), number.accepts("3")) == (True, False, False)
    assert (flag.accepts(False), flag.accepts(0)) == (True, False)
    assert (mode.accepts("shared"), mode.accepts("other"), mode.accepts(None)) == (
        True,
        False,
        False,
    )
