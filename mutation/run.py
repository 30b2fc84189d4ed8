"""``python -m mutation.run [--package NAME ...]``: mutation testing of the core; kill rates.

For each package this

1. lays out a workspace ``.mutation/<package>/`` that mutmut understands (mutmut looks for the
   code under ``src/``; ours lives under ``shared/``, so ``src`` is a link to it), with a
   ``pyproject.toml`` holding the mutmut settings and the repository's pytest settings;
2. runs ``mutmut run`` there: every function of the package is mutated, and each mutant runs
   the tests that reach it, stopping at the first failure. Which tests reach a function are
   mutmut's stats; they are collected again whenever the code or the tests changed since;
3. re-checks each survivor in a fresh interpreter with the mutant switched on before anything
   is imported. mutmut forks its workers from a process that has already imported the package
   and run the tests once, so code that runs while a module is imported (the event and command
   catalogues are built by helper functions), or state that run left behind, never meets the
   mutant there; a fresh process does. A survivor runs its function's covering tests (mutmut's
   stats); one whose function runs at import, or that no test reached, also runs the plan's
   re-check files. A kill counts when a second run repeats it (that run is the test that
   failed, alone), and a re-check runs first the tests that killed its function's other
   mutants (``recheck-killers.json`` in the workspace);
4. prints, per package, the mutants killed, the survivors shown equivalent (one line each in
   ``mutation/equivalent.txt``, or by the one rule applied here: a mutant that only changes
   the case of SQL keywords, tables or columns, which SQLite reads in any case), the
   survivors left, and the kill rate
   ``(killed + equivalent) / mutants``. Every survivor not on the list is written with its
   diff to ``mutation/survivors/<package>.txt`` (committed, beside the figures); an entry of
   the list that names no survivor any more is reported as stale.

It may take hours for the whole core; ``--package`` runs one. Results are resumable: mutmut
keeps its verdicts in the workspace, and a second run tests only what changed. The verdicts
are also kept in ``mutation/state/<package>.json.gz`` (committed), written as they arrive
and by every ``--report``: a fresh checkout's workspace starts from them, so a run stopped
by a session's end goes on where it stopped. ``--report`` prints the table from what is
there without running anything.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pytest plugins of the re-checks, found by module name (only they are in the folder).
RECHECK_PLUGINS = Path(__file__).resolve().parent / "plugins"
WORKSPACES = ROOT / ".mutation"
EQUIVALENT_LIST = Path(__file__).resolve().parent / "equivalent.txt"
RESULTS = Path(__file__).resolve().parent / "results.json"
STATE = Path(__file__).resolve().parent / "state"
# In a workspace: the test that killed each mutant a re-check confirmed (``killers_first``).
KILLERS = "recheck-killers.json"
SURVIVORS = Path(__file__).resolve().parent / "survivors"
CONFORMANCE = ROOT / "docs" / "conformance.md"
_TABLE_BEGIN = "<!-- mutation-table:begin -->"
_TABLE_END = "<!-- mutation-table:end -->"

# The packages the issue names as the core, in dependency order.
CORE_PACKAGES = ("protocol", "actors", "messaging", "router", "queues", "causal", "reactions")

# What mutmut copies beside the mutated package: the tests read these by path.
_ALSO_COPY = ("docs", "functions", "samplefiles", "events", "template.yaml")

# The development package (the local stack, the shared test doubles): code the tests run on,
# not code under test. mutmut copies it beside the package, unmutated: the workspace's tests
# must import it from there, since mutmut takes the original tree (src/) off sys.path.
SOURCE_PATHS = ("src/rhumbatron", "src/rhumbatron_dev")

# Tests that run the original tree in a subprocess (the cold-import measurements, the demo)
# never see a mutant, so they only cost time; this tool's own tests are about the tool. The
# structure tests (layers, module sizes, the public names, the glossary) read the source tree
# by its repository path, which a workspace does not have, and judge its shape, which no
# mutant changes.
_NEVER_SELECTED = (
    "tests/unit/test_import_hygiene.py",
    "tests/integration/test_demo.py",
    "tests/unit/test_mutation_tool.py",
    "tests/unit/test_layering.py",
    "tests/unit/test_module_sizes.py",
    "tests/unit/test_public_api.py",
    "tests/unit/test_glossary.py",
)

_UNIT = ("tests/unit",)

# mutmut's exit codes (mutmut.stats.status_by_exit_code): the ones that mean "a test noticed".
_KILLED_CODES = frozenset({1, 3, 36, 24, -24, 152, 255, 37})
_SURVIVED_CODES = frozenset({0, 5, 33})
_TIMEOUT = 36

# A mutant that hangs (a loop that never ends, a wait that is never answered) costs its
# timeout, and those timeouts were most of a run's hours: mutmut's default wall clock is 15×
# the covering tests' own time, and the suite's per-test limit is 120 s. The slowest test of
# any plan takes under 8 s, so 5× and 30 s still leave a mutant that is only slower room to
# finish, and a hang costs a quarter of what it did.
MUTMUT_TIMEOUT_MULTIPLIER = 5.0
PER_TEST_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class PackagePlan:
    """Which tests run against one package's mutants."""

    name: str
    tests: tuple[str, ...]
    # Run in a fresh process for each survivor: small, and they must reach the import-time
    # tables the package builds.
    recheck: tuple[str, ...]
    # Tests that read the package's source text (not its behaviour): in the mutated tree they
    # read every mutant's string literals at once, so they fail with no mutant switched on.
    reads_source: tuple[str, ...] = ()
    # Fast proofs written for a run's survivors, run in every survivor's re-check: adding a
    # file to ``tests`` would change mutmut's selection, and that resets every verdict.
    proofs: tuple[str, ...] = ()
    # Proofs for the survivors of one module only (by its name in the package), for tests too
    # slow to run with every survivor: a 3-node cluster's, say.
    module_proofs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


PLANS: dict[str, PackagePlan] = {
    "protocol": PackagePlan(
        "protocol",
        tests=(*_UNIT, "tests/security/test_identifiers.py"),
        # Fastest first: -x stops at the first failing test.
        recheck=(
            "tests/unit/test_catalogues.py",
            "tests/unit/test_envelope_messages.py",
            "tests/unit/test_kinds.py",
            "tests/unit/test_ids.py",
            "tests/unit/test_spec_numbers.py",
            "tests/unit/test_envelopes.py",
        ),
    ),
    "causal": PackagePlan(
        "causal",
        tests=(
            *_UNIT,
            "tests/integration/test_causal_routing.py",
            "tests/integration/test_event_plane_principles.py",
            "tests/security/test_forged_events.py",
        ),
        recheck=(
            "tests/unit/test_causal_rules.py",
            "tests/unit/test_causal_world.py",
            "tests/unit/test_clef_flash.py",
            "tests/unit/test_command_cap.py",
            "tests/integration/test_causal_routing.py",
        ),
        module_proofs={
            # The key read from a secret at each question, and a rotated one taken over: the
            # runtime's secret cache builds that ClefFlash (moto's Secrets Manager).
            "clef_flash": (
                "tests/lambda_/test_secrets.py::"
                "test_clef_flash_asks_the_model_with_the_key_from_the_secret",
                "tests/lambda_/test_secrets.py::"
                "test_clef_flash_asks_with_the_rotated_key_once_the_kept_one_is_past_its_max_age",
                "tests/lambda_/test_secrets.py::"
                "test_clef_flash_keeps_its_key_when_a_re_read_fails_and_abstains_when_it_never_had_one",
                "tests/lambda_/test_secrets.py::"
                "test_without_a_key_or_a_secret_clef_flash_abstains_without_asking",
            ),
            # An Event's route span, named and under its header: a Change followed end to end.
            "routing": ("tests/e2e/test_change_trace.py",),
        },
    ),
    "queues": PackagePlan(
        "queues",
        tests=(
            *_UNIT,
            "tests/integration/test_dead_letter_consumer.py",
            "tests/integration/test_wake_consumer.py",
            "tests/integration/test_queue_consumer.py",
            "tests/integration/test_cli_dead_letters.py",
            "tests/integration/test_lifecycle_housekeeping.py",
            "tests/integration/test_event_plane_principles.py",
            "tests/api/test_dead_letters_api.py",
        ),
        # No import-time tables here: the re-check only has to cover the queues' own tests.
        recheck=(
            "tests/unit/test_open_letter_counts.py",
            "tests/unit/test_known_gap_emitters.py",
            "tests/integration/test_dead_letter_consumer.py",
            "tests/integration/test_wake_consumer.py",
            "tests/integration/test_event_plane_principles.py",
        ),
    ),
    "messaging": PackagePlan(
        "messaging",
        tests=(
            *_UNIT,
            "tests/integration/test_atomic_batches.py",
            "tests/integration/test_command_bus.py",
            "tests/integration/test_connection.py",
            "tests/integration/test_consumers.py",
            "tests/integration/test_durability.py",
            "tests/integration/test_ensure_consumer.py",
            "tests/integration/test_fast_batches.py",
            "tests/integration/test_frames.py",
            "tests/integration/test_housekeeping_send.py",
            "tests/integration/test_lambda_nudge.py",
            "tests/integration/test_publisher.py",
            "tests/integration/test_puller.py",
            "tests/integration/test_queue_consumer.py",
            # log_state: the reconciliation's reads of every replica (issue #18)
            "tests/integration/test_reconciliation.py",
            "tests/integration/test_sender.py",
            "tests/integration/test_streams.py",
            "tests/integration/test_router.py",
            "tests/integration/test_replay.py",
            "tests/integration/test_cli_dead_letters.py",
            "tests/api/test_dead_letters_api.py",
            "tests/api/test_lifecycle_api.py",
            "tests/lambda_/test_queue_worker.py",
            "tests/lambda_/test_secrets.py",
        ),
        proofs=(
            "tests/integration/test_atomic_batches.py",
            "tests/integration/test_sender.py",
            "tests/integration/test_fast_batches.py",
            "tests/integration/test_durability.py",
            "tests/integration/test_command_bus.py",
            "tests/integration/test_puller.py",
            "tests/integration/test_ensure_consumer.py",
            "tests/integration/test_connection.py",
            "tests/lambda_/test_secrets.py",
            "tests/integration/test_frames.py",
            "tests/unit/test_scan_pacing.py",
            "tests/unit/test_replica_holders.py",
        ),
        # The scan's placement on a named replica needs a cluster; a dead-letter send that
        # outlives its worker, a process killed at a named point (3 s a run).
        module_proofs={
            "log_state": ("tests/integration/test_scan_placement.py",),
            # its re-reads run on worker threads, where mutmut's stats see no call
            "secrets": (
                "tests/lambda_/test_secrets.py::"
                "test_a_secret_read_from_an_endpoint_that_never_answers_gives_up_on_its_timeout",
            ),
            "queue_consumer": (
                "tests/faults/test_queue_faults.py::"
                "test_a_worker_killed_after_the_dead_letter_send_still_leaves_one_dead_letter",
                # its crash point before the ack runs in a worker process of its own
                "tests/faults/test_queue_faults.py::"
                "test_worker_crashing_before_its_ack_redoes_only_the_idempotent_effect",
            ),
        },
        # The stream and consumer tables are built at import time.
        recheck=(
            "tests/unit/test_spec_numbers.py",
            "tests/integration/test_streams.py",
            "tests/integration/test_consumers.py",
            "tests/integration/test_queue_consumer.py",
        ),
    ),
    "actors": PackagePlan(
        "actors",
        tests=(
            *_UNIT,
            "tests/integration/test_publisher.py",
            "tests/integration/test_fast_batches.py",
            "tests/integration/test_lambda_nudge.py",
            "tests/integration/test_lifecycle_housekeeping.py",
            "tests/integration/test_time_events.py",
            # an outbox made before trace context gets its column (migrate_outbox)
            "tests/integration/test_trace_headers.py",
            "tests/api/test_lifecycle_api.py",
            "tests/security/test_identifiers.py",
            "tests/lambda_/test_outbox_publisher_handler.py",
        ),
        recheck=(
            "tests/unit/test_actors.py",
            "tests/unit/test_alarms.py",
            "tests/unit/test_alarm_fires.py",
            "tests/unit/test_outbox_states.py",
            "tests/unit/test_lifecycle_shard.py",
            "tests/unit/test_settings_and_storage.py",
            "tests/integration/test_publisher.py",
        ),
        # It scans the source for every .fact(...) kind, actors' included.
        reads_source=("tests/unit/test_kinds.py",),
        proofs=(
            "tests/unit/test_due_index.py::"
            "test_a_marker_for_an_actor_with_no_file_or_no_valid_name_creates_nothing",
            "tests/unit/test_due_index.py::"
            "test_an_actor_file_the_gauge_cannot_read_is_named_and_the_others_still_count",
            "tests/unit/test_due_index.py::"
            "test_the_index_lists_its_markers_not_its_own_files_and_forgets_twice_harmlessly",
            "tests/unit/test_outbox_states.py::"
            "test_the_published_rows_since_a_time_name_their_stream_and_place_in_outbox_order",
            "tests/unit/test_outbox_states.py::"
            "test_the_publish_runs_of_one_alarm_fire_add_up_in_its_report",
            "tests/unit/test_outbox_states.py::"
            "test_an_outbox_with_no_row_counts_zero_in_every_state",
            "tests/unit/test_actors.py::"
            "test_a_projects_tenant_is_read_from_its_root_and_none_before_it_is_created",
            # The repair's re-publish (published_envelopes, record_stream_seqs,
            # republish_rows) on one real server.
            "tests/integration/test_reconciliation.py::"
            "test_a_repair_publishes_again_only_what_no_copy_holds_and_the_log_is_whole_after",
            "tests/integration/test_reconciliation.py::"
            "test_a_republish_inside_the_duplicate_window_names_each_repeat_and_each_unknown_id",
            "tests/unit/test_settings_and_storage.py::"
            "test_sqlite_failures_become_errors_that_say_what_to_do",
            # The crash point inside an actor's transaction: a process killed there.
            "tests/faults/test_actor_faults.py::"
            "test_process_killed_inside_a_transaction_leaves_state_and_outbox_together",
            # The crash point after the PubAcks (F5): a publisher process killed there.
            "tests/faults/test_publisher_faults.py::"
            "test_publisher_killed_after_the_puback_is_deduplicated_on_resend",
            "tests/faults/test_actor_faults.py::"
            "test_network_filesystem_is_detected_from_the_mount_table",
            # The patch language on a two-column key, and the errors naming a bad ref.
            "tests/unit/test_actor_patches.py",
            "tests/unit/test_actors.py::"
            "test_a_promotion_names_the_changes_it_carries_and_the_root_keeps_the_canonical_history",
            "tests/unit/test_shard_decisions.py",
            "tests/unit/test_alarm_fires.py::"
            "test_a_publish_while_another_publisher_holds_the_actor_is_busy_and_sends_nothing",
            "tests/unit/test_alarm_fires.py::"
            "test_a_publish_counts_every_row_it_failed_the_unsendable_and_the_refused_alike",
            # A Change's attention reason: none, then a dead letter's (no unit test reads it).
            "tests/integration/test_dead_letter_consumer.py::"
            "test_a_redelivered_dead_letter_blocks_a_ready_or_assigned_task_once",
            "tests/integration/test_dead_letter_consumer.py::"
            "test_a_running_task_is_left_running_and_the_change_gets_the_reason",
        ),
    ),
    "router": PackagePlan(
        "router",
        tests=(
            *_UNIT,
            "tests/integration/test_router.py",
            # a warm router's wire and files: pull requests, flushes, decodes, connections
            "tests/integration/test_router_warm_costs.py",
            "tests/integration/test_view_store.py",
            "tests/integration/test_lambda_nudge.py",
            "tests/integration/test_cli_capacity.py",
            "tests/integration/test_replay.py",
            "tests/integration/test_archive.py",
            "tests/integration/test_consumers.py",
            "tests/integration/test_dashboard_outage.py",
            "tests/integration/test_causal_routing.py",
            "tests/integration/test_event_plane_principles.py",
            "tests/integration/test_cli_replay.py",
            "tests/security/test_forged_events.py",
            "tests/api/test_replay_api.py",
            "tests/lambda_/test_router_handlers.py",
        ),
        module_proofs={
            # Its crash points run in a router process of its own, which the stats never see.
            "handlers": (
                "tests/faults/test_router_faults.py::test_router_killed_mid_batch_loses_and_doubles_no_effect",
                # A routed Command's span under its Event's header: only a Change followed
                # from the API call to its release links them (3 s).
                "tests/e2e/test_change_trace.py",
            ),
            # The crash point before the ack, in a router process of its own.
            "settling": (
                "tests/faults/test_router_faults.py::test_router_killed_mid_batch_loses_and_doubles_no_effect[projector-before_ack]",
            ),
        },
        recheck=(
            "tests/unit/test_project_view.py",
            "tests/unit/test_project_index.py",
            "tests/unit/test_freshness.py",
            "tests/integration/test_router.py",
            "tests/integration/test_replay.py",
        ),
    ),
    "reactions": PackagePlan(
        "reactions",
        tests=(
            *_UNIT,
            "tests/integration/test_reactions.py",
            "tests/integration/test_time_events.py",
            "tests/integration/test_webhook_agent.py",
            "tests/integration/test_webhook_receiver.py",
            "tests/integration/test_webhook_retries.py",
            "tests/integration/test_step_functions_engine.py",
            "tests/integration/test_event_plane_principles.py",
            "tests/api/test_subscriptions_api.py",
            "tests/api/test_schedules_api.py",
        ),
        # They read every ``.fact(<kind>, …)`` call of the source, or the kinds module's
        # names: each mutant's copy of a reaction fact's kind ("XXbudget.exceededXX", None)
        # or of a function would count as one. test_kinds.py's other tests stay in.
        reads_source=(
            *(
                f"tests/unit/test_kinds.py::{name}"
                for name in (
                    "test_every_fact_a_transition_can_emit_is_registered",
                    "test_every_fact_call_site_resolves_to_kinds_or_is_a_listed_pass_through",
                    "test_every_f_string_family_is_used_and_expands_to_registered_kinds",
                    "test_every_registered_kind_has_an_emitter",
                    "test_the_scan_sees_the_emitters_it_is_meant_to_see",
                    "test_the_kinds_module_exports_what_it_defines",
                )
            ),
            "tests/unit/test_event_plane_principles.py::"
            "test_facts_are_built_only_in_transitions_and_by_the_listed_observers",
            # It reads the module's names, and every mutant's copy of a function is one.
            "tests/unit/test_receiver.py::test_the_public_api_is_what_all_says",
        ),
        recheck=(
            # The kind grammar is built at import (KIND_GRAMMAR): its helpers' mutants meet
            # only the tests that read it.
            "tests/unit/test_kinds.py",
            "tests/unit/test_subscription_registry.py",
            "tests/unit/test_selectors.py",
            "tests/unit/test_webhook_ledger.py",
            "tests/unit/test_webhook_signing.py",
            "tests/unit/test_webhook_url_safety.py",
            "tests/unit/test_receiver.py",
            "tests/unit/test_schedules.py",
            "tests/unit/test_workflow_engine.py",
            "tests/integration/test_reactions.py",
        ),
    ),
}


@dataclass(frozen=True, slots=True)
class EquivalentMutant:
    """One line of ``equivalent.txt``: a mutant no test can kill, and why."""

    name: str
    reason: str


@dataclass(slots=True)
class PackageResult:
    """The verdicts of one package's mutants."""

    package: str
    killed: set[str] = field(default_factory=set)
    survived: set[str] = field(default_factory=set)
    not_checked: set[str] = field(default_factory=set)
    #: Survivors the committed list shows equivalent, and those the SQL rule does.
    equivalent: set[str] = field(default_factory=set)
    by_rule: set[str] = field(default_factory=set)

    @property
    def total(self) -> int:
        return len(self.killed) + len(self.survived) + len(self.not_checked)

    @property
    def left(self) -> set[str]:
        """Survivors not shown equivalent: each needs a test or a line in the list."""
        return self.survived - self.equivalent - self.by_rule

    @property
    def kill_rate(self) -> float:
        """(killed + shown equivalent) / every mutant; 0 when nothing was generated."""
        if self.total == 0:
            return 0.0
        return (len(self.killed) + len(self.survived) - len(self.left)) / self.total

    def as_json(self) -> dict[str, object]:
        return {
            "mutants": self.total,
            "killed": len(self.killed),
            "equivalent": len(self.survived) - len(self.left),
            "survived": len(self.left),
            "not_checked": len(self.not_checked),
            "kill_rate": round(self.kill_rate, 4),
        }


class MutationError(Exception):
    """The mutation run could not be set up or finished; the message says what to do."""


def read_equivalent_list(path: Path = EQUIVALENT_LIST) -> dict[str, EquivalentMutant]:
    """Parse ``equivalent.txt``: ``<mutant name> <reason>`` per line, ``#`` comments.

    Raises :class:`MutationError` naming the line for an entry without a reason or a name
    that is not a mutmut mutant name, or for a mutant listed twice.
    """
    entries: dict[str, EquivalentMutant] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        reason = reason.strip()
        if "__mutmut_" not in name or not name.startswith("rhumbatron."):
            raise MutationError(f"{path.name}:{number}: {name!r} is not a mutmut mutant name")
        if not reason:
            raise MutationError(f"{path.name}:{number}: {name} gives no reason it is equivalent")
        if name in entries:
            raise MutationError(f"{path.name}:{number}: {name} is listed twice")
        entries[name] = EquivalentMutant(name, reason)
    return entries


def package_of(mutant_name: str) -> str:
    """``rhumbatron.router.records.x_f__mutmut_3`` → ``router``."""
    parts = mutant_name.split(".")
    if len(parts) < 3 or parts[0] != "rhumbatron":
        raise MutationError(f"{mutant_name!r} is not a mutant of the rhumbatron package")
    return parts[1]


def classify(
    package: str,
    exit_codes: dict[str, int | None],
    recheck_codes: dict[str, int],
    equivalent: Iterable[str],
    *,
    by_rule: Iterable[str] = (),
    to_confirm: Iterable[str] = (),
) -> PackageResult:
    """Sort one package's mutants into killed, survived and not checked.

    ``exit_codes`` are mutmut's verdicts; ``recheck_codes`` those of the fresh-process
    re-check, which can turn a survivor into a kill. A mutant equivalent ``by_rule`` is
    never re-checked, so a re-check kill recorded for it (by an older run) is not counted.
    A kill ``to_confirm`` (one that ran into the per-test limit) counts only when the
    re-check repeats it: a re-check that passes makes it a survivor, and none yet leaves it
    not checked. One equivalent ``by_rule`` is equivalent, whatever its clock said: a case
    change of SQL cannot make a test slower, so its "kill" was the machine's load.
    """
    result = PackageResult(package)
    result.by_rule = set(by_rule)
    unconfirmed = set(to_confirm)
    for name, code in exit_codes.items():
        rechecked = None if name in result.by_rule else recheck_codes.get(name)
        if name in unconfirmed and name in result.by_rule:
            result.survived.add(name)
        elif name in unconfirmed:
            if rechecked in _KILLED_CODES:
                result.killed.add(name)
            elif rechecked in _SURVIVED_CODES:
                result.survived.add(name)
            else:
                result.not_checked.add(name)
        elif code in _KILLED_CODES or rechecked in _KILLED_CODES:
            result.killed.add(name)
        elif code in _SURVIVED_CODES:
            result.survived.add(name)
        else:
            result.not_checked.add(name)
    result.equivalent = {name for name in equivalent if package_of(name) == package}
    return result


def stale_entries(results: Sequence[PackageResult]) -> list[str]:
    """Lines of the list that name no current survivor: the code or the tests moved on. A
    mutant whose "kill" waits for its re-check (it ran into the per-test limit, most often
    under load) is not stale yet: the re-check may find it surviving, as the line says."""
    stale: list[str] = []
    for result in results:
        stale.extend(sorted(result.equivalent - result.survived - result.not_checked))
    return stale


def format_table(results: Sequence[PackageResult]) -> str:
    """The kill rate per package, as a Markdown table."""
    return table_of_recorded({r.package: r.as_json() for r in results})


def table_of_recorded(recorded: dict[str, dict[str, object]]) -> str:
    """The Markdown table of ``results.json``, in the core's order: what ``docs/conformance.md``
    shows under "Mutation testing"."""
    lines = [
        "| package | mutants | killed | equivalent | survived | not checked | kill rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for package in sorted(recorded, key=CORE_PACKAGES.index):
        j = recorded[package]
        rate = float(str(j["kill_rate"]))
        lines.append(
            f"| {package} | {j['mutants']} | {j['killed']} | {j['equivalent']} | "
            f"{j['survived']} | {j['not_checked']} | {rate:.1%} |"
        )
    return "\n".join(lines)


# --- the workspace -----------------------------------------------------------------------


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    # JSON strings and lists of strings are valid TOML basic strings and arrays.
    return json.dumps(value)


def workspace_config(plan: PackagePlan, pytest_options: dict[str, object]) -> str:
    """The workspace's ``pyproject.toml``: mutmut's settings and the repository's pytest ones."""
    selection = list(plan.tests)
    for test in plan.reads_source:
        selection += ["--deselect", test]
    for path in _NEVER_SELECTED:
        selection += ["--ignore", path]
    mutmut = {
        "source_paths": list(SOURCE_PATHS),
        "only_mutate": [f"src/rhumbatron/{plan.name}/*"],
        "also_copy": list(_ALSO_COPY),
        "pytest_add_cli_args_test_selection": selection,
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        "use_git_change_detection": False,
        "timeout_multiplier": MUTMUT_TIMEOUT_MULTIPLIER,
    }
    pytest_ini = {k: v for k, v in pytest_options.items() if k != "testpaths"}
    if "timeout" in pytest_ini:
        pytest_ini["timeout"] = PER_TEST_TIMEOUT_S
    lines = ["# Written by mutation/run.py; edit PLANS there, not this file.", "[tool.mutmut]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in mutmut.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in pytest_ini.items()]
    return "\n".join(lines) + "\n"


def prepare_workspace(plan: PackagePlan) -> Path:
    """Create (or refresh) ``.mutation/<package>/`` and return it."""
    workspace = WORKSPACES / plan.name
    workspace.mkdir(parents=True, exist_ok=True)
    links = {"src": ROOT / "shared", "tests": ROOT / "tests"}
    links |= {name: ROOT / name for name in _ALSO_COPY}
    for name, target in links.items():
        link = workspace / name
        if link.is_symlink() or link.exists():
            if link.resolve() == target.resolve():
                continue
            link.unlink()
        link.symlink_to(target)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    options = pyproject["tool"]["pytest"]["ini_options"]
    (workspace / "pyproject.toml").write_text(workspace_config(plan, options), encoding="utf-8")
    return workspace


def _mutmut(workspace: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        raise MutationError(f"{mutmut} is missing: run `make mutation`, which installs mutmut")
    return subprocess.run(
        [str(mutmut), *args], cwd=workspace, text=True, capture_output=capture, check=False
    )


@dataclass(frozen=True, slots=True)
class MutantVerdict:
    """mutmut's verdict on one mutant: its exit code, the hash of the function it mutates,
    and how long its tests ran (None when mutmut did not record it)."""

    code: int | None
    function_hash: str
    duration_s: float | None = None


def _read_meta(workspace: Path, package: str) -> dict[str, MutantVerdict]:
    """Every mutant's verdict, the hash of the function it mutates and its tests' duration.

    A module that moved or was removed since an older run (``messaging/testing.py``, now
    ``rhumbatron_dev.testing``) leaves its verdicts in the workspace: they are not counted.
    """
    found: dict[str, MutantVerdict] = {}
    mutated = workspace / "mutants" / "src"
    package_dir = mutated / "rhumbatron" / package
    for meta_path in sorted(package_dir.rglob("*.py.meta")):
        if not (workspace / "src" / meta_path.relative_to(mutated).with_suffix("")).exists():
            continue
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        hashes: dict[str, str] = meta["hash_by_function_name"]
        durations: dict[str, float] = meta.get("durations_by_key", {})
        for name, code in meta["exit_code_by_key"].items():
            function = name.rpartition(".")[2].partition("__mutmut_")[0]
            found[name] = MutantVerdict(code, hashes.get(function, ""), durations.get(name))
    return found


def kills_to_confirm(verdicts: dict[str, MutantVerdict]) -> set[str]:
    """mutmut's kills whose tests ran as long as the per-test limit: one of them may only
    have waited too long on a loaded machine (or in a forked worker's inherited state), so
    it counts once a fresh re-check repeats it."""
    return {
        name
        for name, verdict in verdicts.items()
        if verdict.code in _KILLED_CODES
        and verdict.duration_s is not None
        and verdict.duration_s >= PER_TEST_TIMEOUT_S
    }


def recheck_mutants(
    workspace: Path,
    plan: PackagePlan,
    mutants: Sequence[str],
    *,
    previous: dict[str, int],
    hashes: dict[str, str],
    max_children: int,
    to_confirm: Collection[str] = (),
) -> dict[str, int]:
    """Run the plan's re-check tests for each mutant in a fresh interpreter, mutant on: the
    survivors, and the kills ``to_confirm`` (in :func:`recheck_order`).

    Verdicts are saved to ``recheck.json`` as they arrive, so an interrupted run resumes.
    """
    codes = dict(previous)
    todo = [name for name in mutants if name not in codes]
    if not todo:
        return codes
    # A re-check that fails for another reason would count every survivor as killed: the
    # tests, and every proof (a cluster's that cannot start here, say), must pass with no
    # mutant on, and the tests fail when every mutated function raises.
    started = time.monotonic()
    proofs = (*plan.proofs, *(p for group in plan.module_proofs.values() for p in group))
    clean_tests = (*dict.fromkeys((*plan.recheck, *proofs)), *source_readers_left_out(plan))
    clean_log = workspace / "clean-recheck.log"
    clean = _run_recheck(workspace, clean_tests, "", output=clean_log)
    if clean != 0:  # a real-server test may fail once under load, as in _confirmed_recheck
        print(f"  the clean re-check failed once (see {clean_log}); trying it again", flush=True)
        clean = _run_recheck(workspace, clean_tests, "", output=clean_log)
    if clean != 0:
        raise MutationError(
            f"the re-check tests of {plan.name} ({', '.join(clean_tests)}) fail with no "
            f"mutant on (exit {clean}): {clean_log} has pytest's output, and they run in "
            f"{workspace / 'mutants'}"
        )
    if _run_recheck(workspace, plan.recheck, "fail") == 0:
        raise MutationError(
            f"the re-check tests of {plan.name} pass even when every mutated function raises: "
            "they do not import the workspace's mutated package"
        )
    # A mutant that loops forever is killed by the clock, as mutmut's own timeouts are.
    timeout_s = max(60.0, 10 * (time.monotonic() - started))
    at_import = import_time_functions(workspace)
    covering = _covering_tests(workspace)
    tests_of = {name: recheck_tests(name, plan, covering, at_import) for name in todo}
    todo = recheck_order(todo, to_confirm, tests_of, listed=read_equivalent_list())
    saved = workspace / "recheck.json"
    killers_path = workspace / KILLERS
    killers: dict[str, str] = (
        json.loads(killers_path.read_text(encoding="utf-8")) if killers_path.exists() else {}
    )

    def recheck(name: str) -> tuple[int, str | None]:
        # Ordered as the re-check starts: the kills confirmed meanwhile name their tests.
        tests = killers_first(tests_of[name], name, dict(killers))
        return _confirmed_recheck(
            workspace, (*tests, *source_readers_left_out(plan)), name, timeout_s=timeout_s
        )

    checking_since = time.monotonic()
    with ThreadPoolExecutor(max_workers=max_children) as pool:
        futures = {pool.submit(recheck, name): name for name in todo}
        for done, future in enumerate(as_completed(futures), start=1):
            name = futures[future]
            codes[name], killer = future.result()
            if killer is not None:
                killers[name] = killer
                killers_path.write_text(json.dumps(killers, indent=1, sort_keys=True), "utf-8")
            verdict = "killed" if codes[name] in _KILLED_CODES else "survived"
            print(f"  re-check {done}/{len(todo)} {name}: {verdict}", flush=True)
            if done % 10 == 0 or done == len(todo):
                left_s = (time.monotonic() - checking_since) / done * (len(todo) - done)
                print(f"  re-check: {done} of {len(todo)} done, about {left_s / 60:.0f} min left")
            record = {n: [c, hashes.get(n, "")] for n, c in codes.items()}
            saved.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
            save_state(workspace, plan.name)
    return codes


def recheck_order(
    mutants: Sequence[str],
    to_confirm: Collection[str],
    tests_of: Mapping[str, Sequence[str]],
    listed: Collection[str] = (),
) -> list[str]:
    """The order of a re-check: the survivors first, as given (a proof written since may kill
    one), then the kills to confirm, those not ``listed`` as equivalent before those listed,
    then the survivors listed; each group after the first with the fewest tests first. A
    kill to confirm costs its tests' time (all of them when it is not confirmed, the
    per-test limit when it hangs), and a connection function's mutant has 300 tests where a
    scan's has 9: a run stopped part-way has confirmed the most it could. An unlisted kill
    that does not confirm is a survivor to triage, so those come first: a listed one only
    turns from not checked into killed or equivalent (in session 23, 32 of `messaging`'s
    first 34 kills to confirm were listed ones, cheap and never a new survivor). A listed
    survivor counts as equivalent whether or not it is re-checked (its re-check only finds a
    line a proof made stale), so it waits for the rest: `router` lists 259: they took the
    first twenty minutes of its re-check."""
    confirming, listed_names = set(to_confirm), set(listed)
    equivalent = listed_names - confirming

    def cheapest_first(names: Iterable[str]) -> list[str]:
        return sorted(names, key=lambda n: (len(tests_of[n]), n))

    survivors = [name for name in mutants if name not in confirming | equivalent]
    kills = [n for n in mutants if n in confirming]
    return [
        *survivors,
        *cheapest_first(n for n in kills if n not in listed_names),
        *cheapest_first(n for n in kills if n in listed_names),
        *cheapest_first(n for n in mutants if n in equivalent),
    ]


def source_readers_left_out(plan: PackagePlan) -> tuple[str, ...]:
    """pytest's arguments that leave the plan's ``reads_source`` tests out of a re-check, as
    mutmut's selection leaves them out: in the mutated tree they fail with no mutant on."""
    return tuple(arg for test in plan.reads_source for arg in ("--deselect", test))


def function_of(mutant_name: str) -> str:
    """``rhumbatron.router.records.x_f__mutmut_3`` → ``rhumbatron.router.records.x_f``."""
    return mutant_name.partition("__mutmut_")[0]


def recheck_tests(
    mutant: str,
    plan: PackagePlan,
    covering: dict[str, list[str]],
    at_import: set[str],
) -> tuple[str, ...]:
    """The tests a survivor is re-checked with in a fresh interpreter.

    Its function's covering tests (mutmut's stats): run fresh, they meet the mutant even
    where mutmut's forked worker reused state its parent had built (a cache, a memo). A
    function that runs while a module is imported, or that no test reached in mutmut's
    stats run, gets the plan's re-check files too: only they are known to reach the tables
    built at import. Such a survivor also gets every one of the plan's ``proofs``; one the
    stats saw called gets only the proofs outside mutmut's selection (a test that kills a
    worker process, say): the stats list the tests of the selection that called it (they are
    collected again whenever the code or the tests change: see :func:`drop_stale_stats`),
    and running every proof was half of a re-check's time. The stats can still miss a call
    (one made in a subprocess, or in a fixture's teardown), so a proof written for one
    module's survivors goes in ``module_proofs``, which its survivors always run. Leaving a
    test out can only keep a mutant alive, never count one killed that is not.
    """
    function = function_of(mutant)
    tests = tuple(covering.get(function, ()))
    proofs = plan.proofs
    if function in at_import or not tests:
        tests = (*plan.recheck, *(t for t in tests if t.partition("::")[0] not in plan.recheck))
    else:
        proofs = tuple(p for p in proofs if not in_selection(p, plan))
    proofs = (*proofs, *plan.module_proofs.get(module_of(function, plan.name), ()))
    return (*tests, *dict.fromkeys(p for p in proofs if p not in tests))


def module_of(function: str, package: str) -> str:
    """``rhumbatron.messaging.log_state.xǁ_ScanPacingǁanswered`` → ``log_state``; a
    function of the package's ``__init__`` → ``__init__``."""
    module = function.rpartition(".")[0]
    return "__init__" if module == f"rhumbatron.{package}" else module.rpartition(".")[2]


def in_selection(test: str, plan: PackagePlan) -> bool:
    """Whether ``test`` (a file, or ``file::name``) is one that mutmut's selection runs: in
    a file or folder of the plan's ``tests``, and not left out of it."""
    path = test.partition("::")[0]

    def under(chosen: str) -> bool:
        return path == chosen or path.startswith(chosen.rstrip("/") + "/")

    def deselected(entry: str) -> bool:  # pytest's --deselect: a node ID prefix
        if "::" not in entry:
            return under(entry)
        return test == entry or test.startswith((entry + "[", entry + "::"))

    return (
        any(under(c) for c in plan.tests)
        and not any(under(c) for c in _NEVER_SELECTED)
        and not any(deselected(t) for t in plan.reads_source)
    )


def _covering_tests(workspace: Path) -> dict[str, list[str]]:
    """mutmut's stats: the tests that called each mutated function."""
    path = workspace / "mutants" / "mutmut-stats.json"
    if not path.exists():
        return {}
    stats = json.loads(path.read_text(encoding="utf-8"))
    return {name: sorted(tests) for name, tests in stats["tests_by_mangled_function_name"].items()}


# Imports every module of the package in a fresh interpreter with mutmut's trampolines in
# "stats" mode, and prints the mutated functions that ran meanwhile.
_IMPORT_PROBE = """
import importlib, json, pkgutil
import rhumbatron
from mutmut.state import state
for module in pkgutil.walk_packages(rhumbatron.__path__, "rhumbatron."):
    try:
        importlib.import_module(module.name)
    except Exception:
        pass  # a module that cannot be imported here runs nothing at import either
print(json.dumps(sorted(state()._stats)))
"""


def import_time_functions(workspace: Path) -> set[str]:
    """The mutated functions that run while the package's modules are imported (the event
    and command catalogues are built by such functions). mutmut's workers never see their
    mutants there; the fresh-process re-check must reach them with the plan's files."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str((workspace / "mutants" / "src").resolve())
    env["MUTANT_UNDER_TEST"] = "stats"
    probe = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        cwd=workspace / "mutants",
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise MutationError(
            f"cannot list the functions run at import in {workspace}: {probe.stderr.strip()}"
        )
    return set(json.loads(probe.stdout.strip().splitlines()[-1]))


def _confirmed_recheck(
    workspace: Path, tests: Sequence[str], mutant: str, *, timeout_s: float
) -> tuple[int, str | None]:
    """A re-check whose kill is confirmed by a second run: a real-server test that fails once
    under load must not count a survivor as killed. The second run is the test that failed,
    alone: a connection function's mutant has 300 tests, and the one that hangs may be the
    last of them. When that test passes alone (it failed only after the tests before it),
    every test runs again. A kill no second run repeats is a survivor, and is said so.

    Returns the verdict's code and the test that failed in both runs (None when the kill
    was not confirmed, or its test is not known)."""
    trace = workspace / "recheck-tmp" / f"{uuid.uuid4().hex[:12]}.trace"
    try:
        code = _run_recheck(workspace, tests, mutant, timeout_s=timeout_s, trace=trace)
        failed = last_started_test(trace)
    finally:
        trace.unlink(missing_ok=True)
    if code == 0:
        return 0, None
    if failed is not None:
        again = _run_recheck(workspace, (failed,), mutant, timeout_s=timeout_s)
        if again != 0:
            return again, failed
    again = _run_recheck(workspace, tests, mutant, timeout_s=timeout_s)
    if again == 0:
        print(f"  re-check {mutant}: failed once, passed again; counted as a survivor", flush=True)
    return again, None


def killers_first(tests: Sequence[str], mutant: str, killers: Mapping[str, str]) -> list[str]:
    """``tests`` with the ones that killed other mutants of ``mutant``'s function first, the
    most kills first, then the rest in their order. A re-check stops at its first failure,
    and mutants of one function mostly fall to one test: a kill to confirm of ``consume``
    runs that test first instead of the 100 before it (and, when it hangs, waits for the
    per-test limit once, not after them). The tests and their verdicts are the same."""
    function = function_of(mutant)
    kills = Counter(
        test for name, test in killers.items() if function_of(name) == function and test in tests
    )
    first = sorted(kills, key=lambda test: (-kills[test], test))
    return [*first, *(test for test in tests if test not in kills)]


def last_started_test(trace: Path) -> str | None:
    """The node ID of the last test a re-check started (the one that failed, under ``-x``),
    from the file the ``recheck_trace`` plugin wrote; None when no test started."""
    try:
        started = trace.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    return started[-1] if started else None


def _run_recheck(
    workspace: Path,
    tests: Sequence[str],
    mutant: str,
    *,
    timeout_s: float = 900,
    output: Path | None = None,
    trace: Path | None = None,
) -> int:
    """0 when the re-check tests pass with ``mutant`` on, 1 when one fails, 36 on a timeout.

    A collection error counts as a failure: the clean run passed, so only the mutant can
    have broken the import. A test that runs into the per-test limit ends the run at once
    (pytest-timeout's thread method): a mutant that leaves a thread blocked (a read with no
    timeout, say) would otherwise hold the interpreter's exit, and a worker, until
    ``timeout_s`` (a secrets mutant held one for ten minutes). The run has a temporary
    folder of its own, and whatever still runs from it when the run ends (a nats-server
    its fixtures did not get to stop) is killed. ``output`` keeps pytest's output; ``trace``
    gets the node ID of each test as it starts (:func:`last_started_test`).
    """
    env = dict(os.environ)
    # Before the editable install's path: the mutated copy is the one imported.
    env["PYTHONPATH"] = os.pathsep.join(
        [str((workspace / "mutants" / "src").resolve()), str(RECHECK_PLUGINS)]
    )
    env["MUTANT_UNDER_TEST"] = mutant
    basetemp = (workspace / "recheck-tmp" / uuid.uuid4().hex[:12]).resolve()
    basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest makes only the last folder
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    if trace is not None:
        env["RECHECK_TRACE"] = str(trace.resolve())
        command += ["-p", "recheck_trace"]
    command += ["-o", "timeout_method=thread", f"--basetemp={basetemp}"]
    try:
        finished = subprocess.run(
            [*command, "--rootdir=.", *tests],
            cwd=workspace / "mutants",
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as timed_out:
        finished = subprocess.CompletedProcess(timed_out.cmd, _TIMEOUT, "", "")
        finished.stdout = _text(timed_out.stdout) + f"\n(stopped after {timeout_s:g} s)\n"
        finished.stderr = _text(timed_out.stderr)
    finally:
        kill_holders(basetemp)
        shutil.rmtree(basetemp, ignore_errors=True)
    if output is not None:
        output.write_text(finished.stdout + finished.stderr, encoding="utf-8")
    if finished.returncode == _TIMEOUT:
        return _TIMEOUT
    return 0 if finished.returncode == 0 else 1


def _text(captured: str | bytes | None) -> str:
    """What a timed-out run had printed (bytes even with ``text=True``, or None)."""
    if isinstance(captured, bytes):
        return captured.decode(errors="replace")
    return captured or ""


def kill_holders(folder: Path) -> list[int]:
    """Kill every process whose command line names ``folder`` (a nats-server started in a
    test's temporary folder, left by a run that ended before its fixtures stopped it); the
    PIDs killed. Linux's ``/proc`` only: elsewhere nothing is found."""
    killed: list[int] = []
    needle = str(folder).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle not in cmdline.read_bytes():
                continue
            pid = int(cmdline.parent.name)
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        killed.append(pid)
    return killed


def _load_recheck(workspace: Path, hashes: dict[str, str]) -> dict[str, int]:
    """Verdicts of an earlier re-check, for mutants whose function has not changed.

    A run re-checks the survivors again (a test added since may kill one): see
    :func:`run_package`. A report reads every verdict.
    """
    path = workspace / "recheck.json"
    if not path.exists():
        return {}
    saved: dict[str, list[object]] = json.loads(path.read_text(encoding="utf-8"))
    return {
        name: int(str(code))
        for name, (code, function_hash) in saved.items()
        if hashes.get(name) == function_hash
    }


def _as_survivor(name: str, diff: str) -> str:
    """mutmut's diff of ``name`` headed as a survivor. mutmut heads it with the status of its
    pass: a kill the re-check did not repeat shows as killed, and a mutant no test ran then
    (its tests were mapped after) as ``no tests``, which the heading keeps, for triage."""
    status, _, rest = diff.partition("\n")
    said = status.removeprefix(f"# {name}: ")
    note = " (no test ran it in the pass)" if said == "no tests" else ""
    return f"# {name}: survived{note}\n{rest}"


def write_survivors(workspace: Path, result: PackageResult, out_dir: Path = SURVIVORS) -> Path:
    """Every survivor not shown equivalent, with its diff, to ``<out_dir>/<package>.txt``: the
    committed list of what no test kills yet, one ``# <name>: survived`` block each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result.package}.txt"
    cached = workspace / "diffs.json"
    diffs: dict[str, list[str]] = (
        json.loads(cached.read_text(encoding="utf-8")) if cached.exists() else {}
    )
    parts = [
        _as_survivor(name, diffs[name][0])
        if name in diffs
        else f"# {name}: survived (no diff recorded)"
        for name in sorted(result.left)
    ]
    header = (
        f"# {len(parts)} surviving mutants of rhumbatron/{result.package} not shown equivalent; "
        "written by `make mutation`.\n"
    )
    path.write_text(header + "".join(f"\n{part}\n" for part in parts), encoding="utf-8")
    return path


def listed_survivors(path: Path) -> list[str]:
    """The mutant names a survivors file lists."""
    return re.findall(r"^# (rhumbatron\.\S+): survived", path.read_text(encoding="utf-8"), re.M)


def run_package(
    plan: PackagePlan, *, max_children: int, report_only: bool, recheck_children: int | None = None
) -> PackageResult:
    """Run (or only read) one package's mutation testing and classify its mutants."""
    workspace = prepare_workspace(plan)
    restored = restore_state(workspace, plan.name)
    if restored:
        print(f"   {restored} files of verdicts restored from {STATE.name}/{plan.name}.json.gz")
    if not report_only:
        print(f"== mutmut over rhumbatron/{plan.name} (workspace {workspace})", flush=True)
        if drop_stale_stats(workspace):
            print("   the code or the tests changed since its stats: mutmut collects them again")
        finished = _mutmut(workspace, "run", "--max-children", str(max_children))
        save_state(workspace, plan.name)
        if finished.returncode != 0:
            raise MutationError(
                f"mutmut run over {plan.name} exited {finished.returncode}; its output above "
                f"says why (a failing clean run of {', '.join(plan.tests)} is the usual cause)"
            )
    meta = _read_meta(workspace, plan.name)
    if not meta:
        raise MutationError(
            f"no mutmut results for {plan.name} in {workspace}: run without --report first"
        )
    codes = {name: verdict.code for name, verdict in meta.items()}
    hashes = {name: verdict.function_hash for name, verdict in meta.items()}
    to_confirm = kills_to_confirm(meta)
    recheck = _load_recheck(workspace, hashes)
    survivors = sorted(name for name, code in codes.items() if code in _SURVIVED_CODES)
    diffs = mutant_diffs(workspace, [*survivors, *sorted(to_confirm)], hashes)
    sql_case = {name for name in [*survivors, *to_confirm] if is_sql_case_change(diffs[name])}
    if not report_only:
        print(
            f"== re-check of rhumbatron/{plan.name}: "
            f"{len(set(survivors) - sql_case)} survivors, {len(to_confirm - sql_case)} kills "
            f"that ran into the {PER_TEST_TIMEOUT_S} s per-test limit",
            flush=True,
        )
        # Only kills are carried over: a survivor (or a kill not confirmed) is re-checked on
        # every run, since a test added since may kill it.
        recheck = recheck_mutants(
            workspace,
            plan,
            [name for name in survivors if name not in sql_case] + sorted(to_confirm - sql_case),
            previous={n: c for n, c in recheck.items() if c in _KILLED_CODES},
            hashes=hashes,
            max_children=recheck_children or max_children,
            to_confirm=to_confirm,
        )
    save_state(workspace, plan.name)
    return classify(
        plan.name,
        codes,
        recheck,
        read_equivalent_list(),
        by_rule=sql_case,
        to_confirm=to_confirm,
    )


def source_digest(root: Path = ROOT) -> str:
    """A digest of what the tests run on: every file of the code, the tests, the Lambda
    functions and the other folders copied beside them, and the pytest settings. The tests
    mutmut never runs (``_NEVER_SELECTED``: this tool's own, say) are left out: a change
    to them cannot change which tests reach a function."""
    digest = hashlib.sha256()
    inputs = ("shared", "tests", *_ALSO_COPY, "pyproject.toml")
    for name in inputs:
        top = root / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts or path.relative_to(root).as_posix() in _NEVER_SELECTED:
                continue
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def drop_stale_stats(workspace: Path, root: Path = ROOT) -> bool:
    """Forget mutmut's stats (which tests call which function) unless the code and the
    tests are what they were when it collected them; True when they were forgotten.

    mutmut collects a test's stats once, when the test is new: after a change to the code
    (a function that now calls another) or to an old test, they miss tests that reach a
    function, and mutmut and the re-check then run too few tests against its mutants. The
    stats file keeps everything else (the settings' fingerprint, by which mutmut resets its
    verdicts when the test selection changes), with no test in it: every test is new again,
    and mutmut collects them all, keeping its verdicts. Its copy of the tests goes too
    (mutmut copies over it, so a deleted or renamed test would still run there).
    """
    stamp = workspace / "stats-source.txt"
    digest = source_digest(root)
    if stamp.exists() and stamp.read_text(encoding="utf-8") == digest:
        return False
    mutants = workspace / "mutants"
    stats_path = mutants / "mutmut-stats.json"
    if stats_path.exists():
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
        stats["tests_by_mangled_function_name"] = {}
        stats["duration_by_test"] = {}
        stats_path.write_text(json.dumps(stats), encoding="utf-8")
    for copied in ("tests", *_ALSO_COPY):
        target = mutants / copied
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
    stamp.write_text(digest, encoding="utf-8")
    return True


def save_state(workspace: Path, package: str, out_dir: Path = STATE) -> Path:
    """Write one package's verdicts to ``<out_dir>/<package>.json.gz`` (committed) and
    return its path: mutmut's per-file records (each mutant's exit code and duration, each
    function's hash), the re-check's verdicts and the survivors' cached diffs.

    A workspace lives in ``.mutation/``, which a fresh checkout does not have; a run of one
    package takes hours, so a session that ends mid-run or a new clone must not start it
    over. :func:`restore_state` seeds a workspace from this file, and mutmut keeps a verdict
    while the hash of its function is unchanged. Written whole and then renamed, so an
    interrupted write leaves the previous state.
    """
    mutated = workspace / "mutants"
    meta = {
        path.relative_to(mutated).as_posix(): json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((mutated / "src" / "rhumbatron" / package).rglob("*.py.meta"))
    }
    current = {name: v.function_hash for name, v in _read_meta(workspace, package).items()}
    recheck_path = workspace / "recheck.json"
    recheck = json.loads(recheck_path.read_text(encoding="utf-8")) if recheck_path.exists() else {}
    diffs_path = workspace / "diffs.json"
    diffs = json.loads(diffs_path.read_text(encoding="utf-8")) if diffs_path.exists() else {}
    state = {
        "meta": meta,
        # An entry for a function that changed since is of no use to a later run.
        "recheck": {n: v for n, v in sorted(recheck.items()) if current.get(n) == v[1]},
        "diffs": {n: v for n, v in sorted(diffs.items()) if current.get(n) == v[1]},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{package}.json.gz"
    written = path.with_name(path.name + ".tmp")
    body = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    # mtime 0: the same state compresses to the same bytes, so git sees no change.
    written.write_bytes(gzip.compress(body, mtime=0))
    written.replace(path)
    return path


def restore_state(workspace: Path, package: str, state_dir: Path = STATE) -> int:
    """Seed ``workspace`` from the committed state of ``package`` (see :func:`save_state`)
    where it has no record of its own; return how many of mutmut's files were written.

    What the workspace holds is newer than any commit of it, so nothing is overwritten.
    """
    path = state_dir / f"{package}.json.gz"
    if not path.exists():
        return 0
    try:
        state = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as exc:
        raise MutationError(
            f"{path} cannot be read ({exc}): restore it with `git checkout -- {path}` "
            "or delete it to start the package's run over"
        ) from exc
    written = 0
    for relative, meta in state["meta"].items():
        target = workspace / "mutants" / relative
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(meta, indent=4), encoding="utf-8")
        written += 1
    for name in ("recheck", "diffs"):
        target = workspace / f"{name}.json"
        if state[name] and not target.exists():
            target.write_text(json.dumps(state[name], indent=1, sort_keys=True), encoding="utf-8")
    return written


def mutant_diffs(workspace: Path, names: Sequence[str], hashes: dict[str, str]) -> dict[str, str]:
    """``mutmut show`` of each mutant, cached in the workspace by the function's hash."""
    path = workspace / "diffs.json"
    cached: dict[str, list[str]] = (
        json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    )
    diffs: dict[str, str] = {}
    for name in names:
        entry = cached.get(name)
        if entry is not None and entry[1] == hashes.get(name, ""):
            diffs[name] = entry[0]
            continue
        shown = _mutmut(workspace, "show", name, capture=True)
        diffs[name] = shown.stdout.strip() or f"# {name}: (no diff: {shown.stderr.strip()})"
        cached[name] = [diffs[name], hashes.get(name, "")]
    path.write_text(json.dumps(cached, indent=1, sort_keys=True), encoding="utf-8")
    return diffs


# The first string literal of a line, and what makes it SQL: outside its quoted values, its
# characters are those of SQL, and it holds an upper-case keyword or a list of columns.
_FIRST_LITERAL = re.compile(r"""^[^"']*[rf]?(["'])(?P<text>.*?)\1""")
_SQL_VALUE = re.compile(r"'[^']*'")
_SQL_CHARACTERS = re.compile(r"^[\w\s,().?=*<>!+-]*$")
_SQL_KEYWORD = re.compile(
    r"\b(?:SELECT|INSERT|UPDATE|DELETE|CREATE|WITH|FROM|WHERE|ORDER BY|GROUP BY|VALUES|SET"
    r"|ON CONFLICT|AND|LIMIT|JOIN|RETURNING|COALESCE|SUM|COUNT|MAX|MIN"
    r"|SAVEPOINT|ROLLBACK TO|RELEASE|BEGIN|COMMIT|ATTACH DATABASE|DETACH DATABASE|PRAGMA)\b"
)
_COLUMN_LIST = re.compile(r"\w+\s*,\s*\w+")


def _is_sql_literal(line: str) -> bool:
    found = _FIRST_LITERAL.match(line)
    if found is None:
        return False
    text = _SQL_VALUE.sub("?", found.group("text"))
    return bool(
        _SQL_CHARACTERS.match(text) and (_SQL_KEYWORD.search(text) or _COLUMN_LIST.search(text))
    )


def _sql_values(line: str) -> list[str]:
    found = _FIRST_LITERAL.match(line)
    return _SQL_VALUE.findall(found.group("text")) if found is not None else []


def is_sql_case_change(diff: str) -> bool:
    """The mutant only changes the case of SQL keywords, tables and columns: equivalent.

    SQLite reads keywords and identifiers without regard to case, but not its quoted values:
    a changed line whose first string is not SQL (a message), or whose quoted values ('open')
    changed, does not qualify.
    """
    lines = diff.splitlines()
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    if not removed or len(removed) != len(added):
        return False
    changed = [(old, new) for old, new in zip(removed, added, strict=True) if old != new]
    return bool(changed) and all(
        old.lower() == new.lower() and _is_sql_literal(old) and _sql_values(old) == _sql_values(new)
        for old, new in changed
    )


def write_docs_table(recorded: dict[str, dict[str, object]], page: Path = CONFORMANCE) -> None:
    """Replace the table between the markers of ``docs/conformance.md`` with the recorded one."""
    text = page.read_text(encoding="utf-8")
    head, found, rest = text.partition(_TABLE_BEGIN)
    _, found_end, tail = rest.partition(_TABLE_END)
    if not (found and found_end):
        raise MutationError(f"{page} has no {_TABLE_BEGIN} ... {_TABLE_END} block for the table")
    table = table_of_recorded(recorded)
    page.write_text(f"{head}{_TABLE_BEGIN}\n{table}\n{_TABLE_END}{tail}", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mutation.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--package",
        action="append",
        choices=CORE_PACKAGES,
        help="a core package to run (repeatable); default: every one of them",
    )
    parser.add_argument(
        "--max-children",
        type=int,
        default=os.cpu_count() or 2,
        help="mutants tested at once (default: the number of cores)",
    )
    parser.add_argument(
        "--recheck-children",
        type=int,
        default=3 * (os.cpu_count() or 2),
        help="survivors re-checked at once (default: three per core: the re-check's "
        "real-server tests wait more than they compute)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the kill rates from the last run without running anything",
    )
    args = parser.parse_args(argv)
    packages = args.package or list(CORE_PACKAGES)
    results: list[PackageResult] = []
    try:
        for name in packages:
            result = run_package(
                PLANS[name],
                max_children=args.max_children,
                report_only=args.report,
                recheck_children=args.recheck_children,
            )
            results.append(result)
            survivors = write_survivors(WORKSPACES / name, result)
            print(f"  {name}: {len(result.left)} survivors left, listed with diffs in {survivors}")
    except MutationError as exc:
        print(f"mutation: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(results))
    recorded = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
    recorded |= {r.package: r.as_json() for r in results}
    RESULTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_docs_table(recorded)
    for name in stale_entries(results):
        print(f"stale: {name} is listed as equivalent but is no survivor now; remove its line")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
