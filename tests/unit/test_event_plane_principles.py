"""Principles of the event plane (seed 002) that hold by the shape of the code, checked by
reading the source of the package and of the development package: facts are built only
inside state transitions and by a listed few observers (EO1, S2-023, S2-092, S2-132); an
event never doubles as a command (S2-069); the product's surfaces never read the workflow
engine (charter rule 4, S2-078); and only the
outbox publisher sends to an event stream (EO6, S2-137).

Each test fails as soon as a module steps over its line, naming the module and the line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import rhumbatron
import rhumbatron_dev
from rhumbatron.protocol.command_types import COMMAND_TYPES
from rhumbatron.protocol.event_types import EVENT_TYPES

PACKAGE = Path(rhumbatron.__file__).resolve().parent
DEV_PACKAGE = Path(rhumbatron_dev.__file__).resolve().parent

#: Where state transitions live: the domain's decisions and the actors that run them. A fact
#: built here is a transition's fact.
TRANSITION_PACKAGES = ("domain/", "actors/")

#: The only facts built outside a transition: observations no state machine makes, each with
#: the observer that makes it. A new one is a decision, so it has to be listed here.
OBSERVED_KINDS: dict[str, str] = {
    "budget.exceeded": "the admission gate's refusal (reactions consumer)",
    "reaction.disabled": "the webhook delivery ledger giving up on an endpoint",
    "schedule.fired": "the clock's tick (schedules)",
    "log.gap_detected": "reconciliation's check of each replica of the log (the sweep)",
}

#: The product surfaces: what tenants and operators read. They read run records (actor state,
#: the project view), never the workflow engine's history. The local dashboard is in the
#: development package.
PRODUCT_SURFACES = ("api/", "rhumbatron_dev/dashboard/")

#: The operator's workflow operations (issue #19; the second document's ops surface:
#: describe, history, pending work, cancel, terminate) read and steer the engine by design:
#: they are the ops surface, not a product view, and nothing the product shows comes from
#: them. Any other product surface that reaches the engine fails the test.
OPS_ENGINE_READERS: dict[str, str] = {
    "api/routes/workflows.py": "the workflow operations' routes",
    "api/workflow_schemas.py": "their bodies, built from the engine's answers",
    "api/ports.py": "the runtime port those routes read the engine through",
}

#: Modules allowed to name an event stream's subject, and why; anything else that does could
#: publish around the outbox.
EVENT_SUBJECT_USERS: dict[str, str] = {
    "actors/publisher.py": "the outbox publisher: the one sender of events",
    "messaging/streams.py": "creates the streams with their subjects",
    "router/replay.py": "a replay reader's filter subject (reads, never sends)",
    "protocol/ids.py": "defines the subject",
}


@dataclass(frozen=True)
class FactSite:
    """One ``<ctx>.fact(<kind>, ...)`` call: where, and its kind when it is a literal."""

    path: str
    line: int
    kind: str | None


def _modules() -> Iterator[tuple[str, ast.Module]]:
    """Every module of the package (``protocol/ids.py``), then of the development package
    (``rhumbatron_dev/demo.py``), which holds the demo, the scenario runner and the local
    dashboard."""
    for root, prefix in ((PACKAGE, ""), (DEV_PACKAGE, "rhumbatron_dev/")):
        for file in sorted(root.rglob("*.py")):
            path = prefix + file.relative_to(root).as_posix()
            yield path, ast.parse(file.read_text(), str(file))


def _fact_sites() -> list[FactSite]:
    sites = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fact"
                and node.args
            ):
                first = node.args[0]
                kind = first.value if isinstance(first, ast.Constant) else None
                sites.append(FactSite(path, node.lineno, kind if isinstance(kind, str) else None))
    return sites


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _names(tree: ast.Module) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_facts_are_built_only_in_transitions_and_by_the_listed_observers() -> None:
    # GIVEN every place the package builds a fact
    sites = _fact_sites()
    assert any(s.path.startswith(TRANSITION_PACKAGES) for s in sites), "the scan found nothing"

    # WHEN those outside the domain and the actors are collected
    outside = [s for s in sites if not s.path.startswith(TRANSITION_PACKAGES)]

    # THEN each builds a listed observation, named as a literal kind that is registered
    stray = [
        f"{s.path}:{s.line} builds {s.kind!r}" for s in outside if s.kind not in OBSERVED_KINDS
    ]
    assert stray == [], "facts built outside a transition: " + "; ".join(stray)
    assert set(OBSERVED_KINDS) <= set(EVENT_TYPES)


def test_no_event_kind_is_also_a_command_type() -> None:
    # GIVEN the registered event kinds and command types
    # WHEN the two registries are compared
    both = sorted(set(EVENT_TYPES) & set(COMMAND_TYPES))
    # THEN no name is both: a fact never doubles as a request for work
    assert both == [], f"registered as an event and as a command: {both}"
    assert EVENT_TYPES and COMMAND_TYPES


def test_the_product_surfaces_never_import_the_workflow_engine() -> None:
    # GIVEN the modules of the API and the dashboard
    surfaces = [(p, t) for p, t in _modules() if p.startswith(PRODUCT_SURFACES)]
    assert surfaces, "the scan found no product surface"

    # WHEN their imports and the attributes they reach for are read
    readers = sorted(
        path
        for path, tree in surfaces
        if any(name.startswith("rhumbatron.workflows") for name in _imports(tree))
        or any(isinstance(n, ast.Attribute) and n.attr == "engine" for n in ast.walk(tree))
    )

    # THEN none imports the workflow engine or reaches the runtime's engine: what they show
    # comes from run records (actor state, the project view); only the operator's workflow
    # operations do, and they are exactly those listed
    assert readers == sorted(OPS_ENGINE_READERS), (
        f"product surfaces reading the workflow engine: "
        f"{sorted(set(readers) - set(OPS_ENGINE_READERS))}"
    )


def test_only_the_outbox_publisher_among_senders_names_an_event_stream_subject() -> None:
    # GIVEN every module of the package
    # WHEN those that use the event stream subject are collected
    users = {
        path
        for path, tree in _modules()
        if "event_stream_subject" in _names(tree) or path == "protocol/ids.py"
    }
    # THEN they are exactly the publisher, the stream set-up and the replay reader
    assert users == set(EVENT_SUBJECT_USERS), (
        f"unexpected users of event_stream_subject: {sorted(users - set(EVENT_SUBJECT_USERS))}; "
        f"no longer using it: {sorted(set(EVENT_SUBJECT_USERS) - users)}"
    )
