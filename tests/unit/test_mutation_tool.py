"""``make mutation``'s bookkeeping (mutation/run.py): the list of equivalent mutants, the kill
rate, stale entries and the workspace's settings. The mutation run itself takes hours and is
not part of ``make test``; this is the logic its figures rest on."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "mutation" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


tool = _load_tool()
P = "rhumbatron.protocol.ids"


def test_the_committed_list_of_equivalent_mutants_parses_and_names_core_packages() -> None:
    entries = tool.read_equivalent_list()
    assert {tool.package_of(name) for name in entries} <= set(tool.CORE_PACKAGES)
    assert all(entry.reason for entry in entries.values())


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (f"{P}.x_fnv1a32__mutmut_4", "gives no reason"),
        ("fnv1a32 is fine", "is not a mutmut mutant name"),
        (f"{P}.x_fnv1a32__mutmut_4 same codec\n{P}.x_fnv1a32__mutmut_4 again", "listed twice"),
    ],
)
def test_a_bad_line_of_the_list_is_refused_naming_its_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    listed = tmp_path / "equivalent.txt"
    listed.write_text(f"# a comment\n\n{line}\n")
    with pytest.raises(tool.MutationError, match=problem) as caught:
        tool.read_equivalent_list(listed)
    assert "equivalent.txt:3" in str(caught.value) or "equivalent.txt:4" in str(caught.value)


def test_the_kill_rate_counts_kills_rechecked_kills_and_listed_survivors_only() -> None:
    # GIVEN ten mutants: 6 killed by mutmut, 1 killed only in the fresh-process re-check,
    # 2 survivors of which one is listed as equivalent, and 1 mutmut never got to
    codes: dict[str, int | None] = {f"{P}.x_f__mutmut_{n}": 1 for n in range(1, 7)}
    codes |= {f"{P}.x_f__mutmut_7": 0, f"{P}.x_f__mutmut_8": 0, f"{P}.x_f__mutmut_9": 33}
    codes |= {f"{P}.x_f__mutmut_10": None}
    recheck = {f"{P}.x_f__mutmut_7": 1, f"{P}.x_f__mutmut_8": 0, f"{P}.x_f__mutmut_9": 0}
    listed = [f"{P}.x_f__mutmut_8", "rhumbatron.router.records.x_g__mutmut_1"]
    # WHEN they are classified
    result = tool.classify("protocol", codes, recheck, listed)
    # THEN (6 + 1 killed + 1 equivalent) of 10, and the survivor left is the unlisted one
    assert result.kill_rate == pytest.approx(0.8)
    assert result.left == {f"{P}.x_f__mutmut_9"}
    assert result.as_json() == {
        "mutants": 10,
        "killed": 7,
        "equivalent": 1,
        "survived": 1,
        "not_checked": 1,
        "kill_rate": 0.8,
    }
    assert "| protocol | 10 | 7 | 1 | 1 | 1 | 80.0% |" in tool.format_table([result])


def test_a_listed_mutant_that_no_longer_survives_is_stale() -> None:
    codes: dict[str, int | None] = {f"{P}.x_f__mutmut_1": 1, f"{P}.x_f__mutmut_2": 0}
    listed = [f"{P}.x_f__mutmut_1", f"{P}.x_f__mutmut_2", f"{P}.x_gone__mutmut_1"]
    result = tool.classify("protocol", codes, {}, listed)
    assert tool.stale_entries([result]) == [f"{P}.x_f__mutmut_1", f"{P}.x_gone__mutmut_1"]
    # a stale line never raises the kill rate: only survivors can be shown equivalent
    assert result.kill_rate == pytest.approx(1.0)
    # … and a listed mutant whose kill ran into the limit waits for its re-check, not stale
    waiting = tool.classify("protocol", codes, {}, listed, to_confirm=[f"{P}.x_f__mutmut_1"])
    assert tool.stale_entries([waiting]) == [f"{P}.x_gone__mutmut_1"]


def test_a_mutant_equivalent_by_the_sql_rule_is_neither_stale_nor_killed_by_a_re_check() -> None:
    # GIVEN two SQL case changes mutmut could not kill, one with a re-check "kill" recorded by
    # an older run (a real-server test that failed once under load)
    codes: dict[str, int | None] = {f"{P}.x_f__mutmut_1": 0, f"{P}.x_f__mutmut_2": 0}
    by_rule = [f"{P}.x_f__mutmut_1", f"{P}.x_f__mutmut_2"]
    result = tool.classify("protocol", codes, {f"{P}.x_f__mutmut_1": 1}, [], by_rule=by_rule)
    # THEN both count as equivalent, none as killed, and the list has no stale line
    assert result.as_json()["equivalent"] == 2
    assert result.killed == set()
    assert result.left == set()
    assert tool.stale_entries([result]) == []


def test_a_sql_case_change_whose_kill_ran_into_the_limit_is_equivalent_not_unchecked() -> None:
    # GIVEN a SQL case change that mutmut "killed" only by running into the per-test limit
    # (load: a case change cannot slow a test), never re-checked, and one that did survive
    slow, quiet = f"{P}.x_f__mutmut_1", f"{P}.x_f__mutmut_2"
    codes: dict[str, int | None] = {slow: 1, quiet: 0}
    result = tool.classify("protocol", codes, {}, [], by_rule=[slow, quiet], to_confirm=[slow])
    # THEN both are equivalent by the rule: neither waits for a re-check nor counts as killed
    assert result.not_checked == set()
    assert result.killed == set()
    assert result.as_json()["equivalent"] == 2
    assert result.kill_rate == pytest.approx(1.0)


def test_a_kill_that_ran_into_the_per_test_limit_counts_only_when_a_fresh_re_check_repeats_it(
    tmp_path: Path,
) -> None:
    # GIVEN mutmut's verdicts: two quick kills, and three kills whose tests ran as long as the
    # per-test limit (a loaded machine, or a forked worker's inherited state, can do that)
    limit = float(tool.PER_TEST_TIMEOUT_S)
    durations = {1: 2.0, 2: limit - 0.1, 3: limit, 4: limit + 5, 5: limit + 6}
    package_dir = tmp_path / "mutants" / "src" / "rhumbatron" / "protocol"
    package_dir.mkdir(parents=True)
    (tmp_path / "src" / "rhumbatron" / "protocol").mkdir(parents=True)
    (tmp_path / "src" / "rhumbatron" / "protocol" / "ids.py").write_text("")
    meta = {
        "exit_code_by_key": {f"{P}.x_f__mutmut_{n}": 1 for n in durations},
        "hash_by_function_name": {"x_f": "h"},
        "durations_by_key": {f"{P}.x_f__mutmut_{n}": d for n, d in durations.items()},
    }
    (package_dir / "ids.py.meta").write_text(json.dumps(meta))
    verdicts = tool._read_meta(tmp_path, "protocol")
    # WHEN the kills to confirm are picked and classified with a re-check that repeated one
    # kill (3), passed one (4) and has not run the third (5) yet
    to_confirm = tool.kills_to_confirm(verdicts)
    codes = {name: verdict.code for name, verdict in verdicts.items()}
    recheck = {f"{P}.x_f__mutmut_3": 1, f"{P}.x_f__mutmut_4": 0}
    result = tool.classify("protocol", codes, recheck, [], to_confirm=to_confirm)
    # THEN only the kills at the limit are confirmed, and each counts by its re-check
    assert to_confirm == {f"{P}.x_f__mutmut_{n}" for n in (3, 4, 5)}
    assert result.killed == {f"{P}.x_f__mutmut_{n}" for n in (1, 2, 3)}
    assert result.left == {f"{P}.x_f__mutmut_4"}
    assert result.not_checked == {f"{P}.x_f__mutmut_5"}
    # AND the survivors file names the one that survived as a survivor, though mutmut's diff
    # calls it killed
    diff = f"# {P}.x_f__mutmut_4: killed\n--- ids.py\n+++ ids.py\n-x = 1\n+x = 2"
    (tmp_path / "diffs.json").write_text(json.dumps({f"{P}.x_f__mutmut_4": [diff, "h"]}))
    path = tool.write_survivors(tmp_path, result, out_dir=tmp_path / "survivors")
    assert tool.listed_survivors(path) == [f"{P}.x_f__mutmut_4"]
    assert "+x = 2" in path.read_text()


def test_a_re_check_takes_the_survivors_first_then_the_kills_to_confirm_cheapest_first() -> None:
    # GIVEN two survivors and three kills to confirm, whose functions have 300, 9 and 9 tests
    survivors = [f"{P}.x_f__mutmut_9", f"{P}.x_f__mutmut_2"]
    tests_of = {
        **{name: ["t1"] for name in survivors},
        f"{P}.x_connect__mutmut_1": [f"t{n}" for n in range(300)],
        f"{P}.x_scan__mutmut_2": [f"t{n}" for n in range(9)],
        f"{P}.x_scan__mutmut_1": [f"t{n}" for n in range(9)],
    }
    kills = [name for name in tests_of if name not in survivors]
    # WHEN they are ordered for the re-check
    order = tool.recheck_order([*survivors, *kills], kills, tests_of)
    # THEN the survivors come first as given (a proof written since may kill one), then the
    #   kills to confirm with the fewest tests first (a stopped run confirmed the most it
    #   could), by name within the same count
    assert order == [
        *survivors,
        f"{P}.x_scan__mutmut_1",
        f"{P}.x_scan__mutmut_2",
        f"{P}.x_connect__mutmut_1",
    ]


def test_a_re_check_leaves_the_survivors_listed_as_equivalent_for_last() -> None:
    # GIVEN a survivor, one listed as equivalent with 5 tests and one with 2, and a kill to
    #   confirm
    survivor, confirm = f"{P}.x_f__mutmut_1", f"{P}.x_g__mutmut_1"
    listed = [f"{P}.x_h__mutmut_3", f"{P}.x_k__mutmut_1"]
    tests_of = {survivor: ["t"], confirm: ["t", "u"], listed[0]: ["t"] * 5, listed[1]: ["t"] * 2}
    # WHEN they are ordered for the re-check
    order = tool.recheck_order(
        [listed[0], survivor, listed[1], confirm], [confirm], tests_of, listed
    )
    # THEN what can move the kill rate comes first (the survivor, then the kill to confirm);
    #   the listed ones, equivalent either way, come last, the fewest tests first
    assert order == [survivor, confirm, listed[1], listed[0]]


def test_a_re_check_confirms_the_unlisted_kills_before_the_listed_ones() -> None:
    # GIVEN three kills to confirm: one listed as equivalent with 1 test, two unlisted with
    #   3 and 2, and a survivor listed as equivalent with 1 test
    listed_kill, listed_survivor = f"{P}.x_a__mutmut_1", f"{P}.x_b__mutmut_1"
    unlisted = [f"{P}.x_c__mutmut_1", f"{P}.x_d__mutmut_1"]
    tests_of = {listed_kill: ["t"], listed_survivor: ["t"], unlisted[0]: ["t"] * 3}
    tests_of[unlisted[1]] = ["t"] * 2
    # WHEN they are ordered for the re-check
    order = tool.recheck_order(
        [listed_kill, listed_survivor, *unlisted],
        [listed_kill, *unlisted],
        tests_of,
        [listed_kill, listed_survivor],
    )
    # THEN the unlisted kills come first, cheapest first (one that does not confirm is a
    #   survivor to triage), then the listed kill, though it is the cheapest, then the listed
    #   survivor
    assert order == [unlisted[1], unlisted[0], listed_kill, listed_survivor]


def test_a_re_check_ends_at_the_per_test_limit_not_when_a_blocked_thread_ends(
    tmp_path: Path,
) -> None:
    # GIVEN a workspace whose per-test limit is 1 s, and a test whose event loop waits on a
    #   worker thread blocked for ten minutes (as a mutant's secret read with no timeout
    #   does: asyncio.run's close waits for it, after the limit's signal has come)
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    (mutants / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntimeout = 1\n")
    (mutants / "test_blocked.py").write_text(
        "import asyncio, time\n\n"
        "def test_waits_on_a_blocked_thread(tmp_path):\n"
        "    (tmp_path / 'store').mkdir()  # in the run's own temporary folder\n"
        "    asyncio.run(asyncio.to_thread(time.sleep, 600))\n"
    )
    # WHEN it is re-checked with a minute to run
    started = time.monotonic()
    log = tmp_path / "recheck.log"
    trace = tmp_path / "run.trace"
    code = tool._run_recheck(
        tmp_path, ["test_blocked.py"], "", timeout_s=60, output=log, trace=trace
    )
    # THEN the run ends at the limit, a kill (1), not the minute's timeout (36), its output
    #   kept saying so, its trace naming the test that hung, and it leaves no temporary
    #   folder behind
    assert code == 1
    assert time.monotonic() - started < 30
    assert "Timeout" in log.read_text()
    assert tool.last_started_test(trace) == "test_blocked.py::test_waits_on_a_blocked_thread"
    assert list((tmp_path / "recheck-tmp").glob("*")) == []


def _recheck_workspace(tmp_path: Path, tests: str) -> Path:
    """A workspace whose ``mutants`` folder holds ``tests`` as ``test_m.py``; each test that
    runs appends its name to ``runs.txt`` beside it."""
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    (mutants / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntimeout = 20\n")
    (mutants / "test_m.py").write_text(
        "import os, pathlib\n"
        "RUNS = pathlib.Path(__file__).with_name('runs.txt')\n"
        "def ran(name):\n"
        "    with RUNS.open('a') as runs:\n"
        "        runs.write(name + '\\n')\n"
        "MUTANT = os.environ['MUTANT_UNDER_TEST']\n\n" + tests
    )
    return tmp_path


def test_a_re_checks_kill_is_confirmed_by_the_test_that_failed_run_alone(tmp_path: Path) -> None:
    # GIVEN a re-check of three tests where the second fails with the mutant on
    workspace = _recheck_workspace(
        tmp_path,
        "def test_first(): ran('first')\n"
        "def test_second(): ran('second'); assert MUTANT != 'm'\n"
        "def test_third(): ran('third')\n",
    )
    # WHEN its kill is confirmed
    code, killer = tool._confirmed_recheck(workspace, ["test_m.py"], "m", timeout_s=60)
    # THEN it counts as killed by that test, and the confirmation ran only it: the first
    #   ran once, the third (after -x stopped the run) never
    assert (code, killer) == (1, "test_m.py::test_second")
    runs = (workspace / "mutants" / "runs.txt").read_text().split()
    assert runs == ["first", "second", "second"]
    assert list((workspace / "recheck-tmp").glob("*")) == []


def test_a_kill_its_failing_test_does_not_repeat_alone_is_confirmed_by_every_test_again(
    tmp_path: Path,
) -> None:
    # GIVEN a test that fails with the mutant on only after the test before it ran
    workspace = _recheck_workspace(
        tmp_path,
        "def test_first(): ran('first')\n"
        "def test_second():\n"
        "    ran('second')\n"
        "    assert MUTANT != 'm' or RUNS.read_text().split()[-2:] != ['first', 'second']\n",
    )
    # WHEN its kill is confirmed
    code, killer = tool._confirmed_recheck(workspace, ["test_m.py"], "m", timeout_s=60)
    # THEN the failing test alone passes, so every test runs again, and the kill counts
    #   (with no one test to name for it)
    assert (code, killer) == (1, None)
    runs = (workspace / "mutants" / "runs.txt").read_text().split()
    assert runs == ["first", "second", "second", "first", "second"]


def test_a_re_check_that_fails_once_and_passes_again_is_a_survivor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a test that fails the first time only (as a real-server test may under load)
    workspace = _recheck_workspace(
        tmp_path,
        "def test_flaky():\n"
        "    first = not RUNS.exists()\n"
        "    ran('flaky')\n"
        "    assert not first\n",
    )
    # WHEN its kill is confirmed
    code, killer = tool._confirmed_recheck(workspace, ["test_m.py"], "m", timeout_s=60)
    # THEN the second run passes, and the mutant is a survivor, said so
    assert (code, killer) == (0, None)
    assert "failed once, passed again" in capsys.readouterr().out


def test_a_re_check_runs_first_the_tests_that_killed_its_functions_other_mutants() -> None:
    # GIVEN a function's mutants confirmed killed: two by test_b, one by test_c; another
    #   function's by test_a; and one killed by a test the next mutant does not run
    f, g = "rhumbatron.router.records.x_f", "rhumbatron.router.records.x_g"
    killers = {
        f"{f}__mutmut_1": "t.py::test_b",
        f"{f}__mutmut_2": "t.py::test_c",
        f"{f}__mutmut_3": "t.py::test_b",
        f"{f}__mutmut_4": "u.py::test_gone",
        f"{g}__mutmut_1": "t.py::test_a",
    }
    tests = ["t.py::test_a", "t.py::test_b", "t.py::test_c", "t.py::test_d"]
    # WHEN another mutant of f is re-checked
    ordered = tool.killers_first(tests, f"{f}__mutmut_9", killers)
    # THEN f's killers run first, the most kills first, then the rest as they were: the
    #   same tests, none added
    assert ordered == ["t.py::test_b", "t.py::test_c", "t.py::test_a", "t.py::test_d"]
    # (a mutant of a function no kill named keeps its order)
    assert tool.killers_first(tests, "rhumbatron.router.records.x_h__mutmut_1", killers) == tests


def test_the_last_test_a_re_check_started_is_read_from_its_trace(tmp_path: Path) -> None:
    trace = tmp_path / "run.trace"
    assert tool.last_started_test(trace) is None  # no test started: no file
    trace.write_text("")
    assert tool.last_started_test(trace) is None
    trace.write_text("test_m.py::test_a\ntest_m.py::test_b[a b]\n")
    assert tool.last_started_test(trace) == "test_m.py::test_b[a b]"


def test_what_still_runs_from_a_re_checks_folder_is_killed_and_nothing_else(
    tmp_path: Path,
) -> None:
    # GIVEN a process started from a run's temporary folder (a nats-server whose fixture
    #   never stopped it), and another from elsewhere
    folder = tmp_path / "recheck-tmp" / "abc"
    folder.mkdir(parents=True)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    left = subprocess.Popen([*sleep, str(folder / "nats.conf")], start_new_session=True)
    other = subprocess.Popen([*sleep, str(tmp_path / "elsewhere")], start_new_session=True)
    try:
        # WHEN the folder's holders are killed
        killed = tool.kill_holders(folder)
        # THEN the one started from it is gone, killed; the other still runs
        assert killed == [left.pid]
        assert left.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for process in (left, other):
            process.kill()
            process.wait()


def test_the_workspace_settings_read_back_as_mutmut_and_pytest_see_them() -> None:
    plan = tool.PLANS["router"]
    pytest_options = {"addopts": "-ra", "timeout": 120, "markers": ["a: b"], "testpaths": ["x"]}
    written = tomllib.loads(tool.workspace_config(plan, pytest_options))
    mutmut = written["tool"]["mutmut"]
    assert mutmut["source_paths"] == ["src/rhumbatron", "src/rhumbatron_dev"]
    assert mutmut["only_mutate"] == ["src/rhumbatron/router/*"]
    assert mutmut["pytest_add_cli_args_test_selection"][: len(plan.tests)] == list(plan.tests)
    assert "tests/integration/test_demo.py" in mutmut["pytest_add_cli_args_test_selection"]
    # A hanging mutant is stopped sooner than the suite's own limit would stop it.
    assert mutmut["timeout_multiplier"] == tool.MUTMUT_TIMEOUT_MULTIPLIER < 15
    assert written["tool"]["pytest"]["ini_options"] == {
        "addopts": "-ra",
        "timeout": tool.PER_TEST_TIMEOUT_S,
        "markers": ["a: b"],
    }


def test_the_dev_package_is_copied_unmutated_and_a_gone_module_is_not_counted(
    tmp_path: Path,
) -> None:
    # GIVEN a workspace whose earlier run mutated the messaging test doubles too, before they
    # moved to the development package (messaging/testing.py is no longer in the source)
    source_dir = tmp_path / "src" / "rhumbatron" / "messaging"
    source_dir.mkdir(parents=True)
    (source_dir / "sender.py").write_text("")
    package_dir = tmp_path / "mutants" / "src" / "rhumbatron" / "messaging"
    package_dir.mkdir(parents=True)
    for module in ("sender", "testing"):
        meta = {
            "exit_code_by_key": {f"rhumbatron.messaging.{module}.x_f__mutmut_1": 0},
            "hash_by_function_name": {"x_f": "h"},
        }
        (package_dir / f"{module}.py.meta").write_text(json.dumps(meta))
    # THEN only the code under test that is still there is counted
    assert set(tool._read_meta(tmp_path, "messaging")) == {
        "rhumbatron.messaging.sender.x_f__mutmut_1"
    }
    # AND a new run copies the development package (the doubles, the local stack) beside the
    # package, where the tests import it, and mutates only the package
    written = tomllib.loads(tool.workspace_config(tool.PLANS["messaging"], {}))["tool"]["mutmut"]
    assert "src/rhumbatron_dev" in written["source_paths"]
    assert written["only_mutate"] == ["src/rhumbatron/messaging/*"]
    assert "do_not_mutate" not in written


def test_the_survivors_file_lists_every_survivor_left_with_its_diff(tmp_path: Path) -> None:
    # GIVEN a package with one survivor shown equivalent and two left, one without a diff
    result = tool.PackageResult(
        "queues",
        survived={
            "rhumbatron.queues.a.x_f__mutmut_2",
            "rhumbatron.queues.a.x_f__mutmut_1",
            "rhumbatron.queues.a.x_g__mutmut_1",
        },
        equivalent={"rhumbatron.queues.a.x_g__mutmut_1"},
    )
    diff = "# rhumbatron.queues.a.x_f__mutmut_1: survived\n--- a.py\n+++ a.py\n-x = 1\n+x = 2"
    # (mutmut heads a mutant no test ran in the pass "no tests")
    untested = "# rhumbatron.queues.a.x_f__mutmut_2: no tests\n--- a.py\n+++ a.py\n-y\n+z"
    (tmp_path / "diffs.json").write_text(
        json.dumps(
            {
                "rhumbatron.queues.a.x_f__mutmut_1": [diff, "h"],
                "rhumbatron.queues.a.x_f__mutmut_2": [untested, "h"],
            }
        )
    )
    # WHEN it is written
    path = tool.write_survivors(tmp_path, result, out_dir=tmp_path / "survivors")
    # THEN it lists the two left, sorted, with their diffs, each headed as a survivor (the
    # untested one says so); and reads back as those names
    assert path == tmp_path / "survivors" / "queues.txt"
    text = path.read_text()
    assert text.startswith("# 2 surviving mutants of rhumbatron/queues not shown equivalent")
    assert "# rhumbatron.queues.a.x_f__mutmut_1: survived\n--- a.py" in text
    assert "-x = 1\n+x = 2" in text
    assert "# rhumbatron.queues.a.x_f__mutmut_2: survived (no test ran it in the pass)\n" in text
    assert "-y\n+z" in text
    assert tool.listed_survivors(path) == [
        "rhumbatron.queues.a.x_f__mutmut_1",
        "rhumbatron.queues.a.x_f__mutmut_2",
    ]


def test_the_committed_survivors_are_the_recorded_survivors() -> None:
    recorded = json.loads((ROOT / "mutation" / "results.json").read_text())
    for package, figures in recorded.items():
        listed = tool.listed_survivors(ROOT / "mutation" / "survivors" / f"{package}.txt")
        assert len(listed) == figures["survived"], package


def test_a_survivor_is_re_checked_with_its_covering_tests_and_the_plans_files_when_needed() -> None:
    plan = tool.PackagePlan("protocol", tests=(), recheck=("tests/unit/test_kinds.py",))
    covering = {
        f"{P}.x_f": ["tests/unit/test_ids.py::test_a", "tests/unit/test_ids.py::test_b"],
        f"{P}.x__spec": ["tests/unit/test_kinds.py::test_c", "tests/unit/test_ids.py::test_d"],
    }
    at_import = {f"{P}.x__spec"}
    # a function the tests call: its covering tests, in a fresh interpreter
    assert tool.recheck_tests(f"{P}.x_f__mutmut_3", plan, covering, at_import) == (
        "tests/unit/test_ids.py::test_a",
        "tests/unit/test_ids.py::test_b",
    )
    # run at import: the plan's files (they reach the tables), and the covering tests of
    # other files
    assert tool.recheck_tests(f"{P}.x__spec__mutmut_1", plan, covering, at_import) == (
        "tests/unit/test_kinds.py",
        "tests/unit/test_ids.py::test_d",
    )
    # no test reached it in mutmut's stats run: the plan's files
    assert tool.recheck_tests(f"{P}.x_g__mutmut_1", plan, covering, at_import) == plan.recheck
    # proofs written for survivors go with every re-check, once
    proved = replace(plan, proofs=("tests/unit/test_proofs.py", "tests/unit/test_kinds.py"))
    assert tool.recheck_tests(f"{P}.x_f__mutmut_3", proved, covering, at_import) == (
        "tests/unit/test_ids.py::test_a",
        "tests/unit/test_ids.py::test_b",
        "tests/unit/test_proofs.py",
        "tests/unit/test_kinds.py",
    )
    assert tool.recheck_tests(f"{P}.x_g__mutmut_1", proved, covering, at_import) == (
        "tests/unit/test_kinds.py",
        "tests/unit/test_proofs.py",
    )
    # a proof in mutmut's selection was run, and the stats saw which of its tests call what:
    # only a called function's covering tests go, a proof outside the selection with them
    selected = replace(
        proved,
        tests=("tests/unit/",),
        proofs=("tests/unit/test_proofs.py", "tests/faults/test_kill.py::test_k"),
    )
    assert tool.recheck_tests(f"{P}.x_f__mutmut_3", selected, covering, at_import) == (
        "tests/unit/test_ids.py::test_a",
        "tests/unit/test_ids.py::test_b",
        "tests/faults/test_kill.py::test_k",
    )
    # one the stats never saw called still gets every proof
    assert tool.recheck_tests(f"{P}.x_g__mutmut_1", selected, covering, at_import) == (
        "tests/unit/test_kinds.py",
        "tests/unit/test_proofs.py",
        "tests/faults/test_kill.py::test_k",
    )


def test_a_modules_own_proofs_go_only_with_its_survivors() -> None:
    plan = tool.PackagePlan(
        "messaging",
        tests=("tests/unit",),
        recheck=("tests/unit/test_r.py",),
        proofs=("tests/faults/test_kill.py::test_k",),
        module_proofs={"log_state": ("tests/integration/test_cluster.py",)},
    )
    m = "rhumbatron.messaging"
    covering = {f"{m}.log_state.x_f": ["tests/unit/test_a.py::t"], f"{m}.sender.x_g": ["u::t"]}
    assert tool.recheck_tests(f"{m}.log_state.x_f__mutmut_1", plan, covering, set()) == (
        "tests/unit/test_a.py::t",
        "tests/faults/test_kill.py::test_k",
        "tests/integration/test_cluster.py",
    )
    # a method's module is found through its class
    assert tool.recheck_tests(f"{m}.log_state.xǁ_Cǁm__mutmut_2", plan, covering, set()) == (
        "tests/unit/test_r.py",
        "tests/faults/test_kill.py::test_k",
        "tests/integration/test_cluster.py",
    )
    assert tool.recheck_tests(f"{m}.sender.x_g__mutmut_1", plan, covering, set()) == (
        "u::t",
        "tests/faults/test_kill.py::test_k",
    )


def test_a_test_is_in_the_selection_when_its_file_or_a_folder_above_it_is_named() -> None:
    plan = tool.PackagePlan(
        "actors",
        tests=("tests/unit", "tests/integration/test_sender.py"),
        recheck=(),
        reads_source=("tests/unit/test_kinds.py", "tests/unit/test_receiver.py::test_api"),
    )
    assert tool.in_selection("tests/unit/test_ids.py", plan)
    assert tool.in_selection("tests/unit/deep/test_x.py::test_a", plan)
    assert tool.in_selection("tests/integration/test_sender.py::test_b", plan)
    assert not tool.in_selection("tests/unit_extra/test_y.py", plan)
    assert not tool.in_selection("tests/integration/test_sender_more.py", plan)
    assert not tool.in_selection("tests/faults/test_queue_faults.py::test_c", plan)
    # a file the selection leaves out (it reads the source, or the repository by path) is not
    # in it, however its folder is named
    assert not tool.in_selection("tests/unit/test_kinds.py::test_k", plan)
    assert not tool.in_selection("tests/unit/test_layering.py", plan)
    # one test left out leaves the rest of its file in
    assert not tool.in_selection("tests/unit/test_receiver.py::test_api", plan)
    assert not tool.in_selection("tests/unit/test_receiver.py::test_api[case]", plan)
    assert tool.in_selection("tests/unit/test_receiver.py::test_api_more", plan)
    assert tool.in_selection("tests/unit/test_receiver.py", plan)


def test_the_re_check_leaves_out_the_tests_mutmuts_selection_leaves_out() -> None:
    # GIVEN a plan with tests that read the source, not the behaviour
    plan = tool.PackagePlan(
        "reactions",
        tests=("tests/unit",),
        recheck=("tests/unit/test_receiver.py",),
        reads_source=("tests/unit/test_kinds.py", "tests/unit/test_receiver.py::test_api"),
    )
    # THEN the re-check deselects them as the workspace's selection does
    assert tool.source_readers_left_out(plan) == (
        "--deselect",
        "tests/unit/test_kinds.py",
        "--deselect",
        "tests/unit/test_receiver.py::test_api",
    )
    config = tool.workspace_config(plan, {})
    assert '"--deselect", "tests/unit/test_receiver.py::test_api"' in config


def test_a_mutants_module_is_named_within_its_package() -> None:
    assert tool.module_of("rhumbatron.messaging.log_state.x__scan", "messaging") == "log_state"
    assert tool.module_of("rhumbatron.messaging.log_state.xǁ_Pǁanswered", "messaging") == (
        "log_state"
    )
    assert tool.module_of("rhumbatron.messaging.x_top", "messaging") == "__init__"


def test_the_functions_run_at_import_are_found_in_a_fresh_interpreter(tmp_path: Path) -> None:
    # GIVEN a workspace whose package builds a table at import through a mutated function
    package = tmp_path / "mutants" / "src" / "rhumbatron"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tables.py").write_text(
        "from mutmut.stats import record_trampoline_hit\n\n"
        "def x_build():\n"
        "    record_trampoline_hit('rhumbatron.tables.x_build')\n"
        "    return {}\n\n"
        "def x_later():\n"
        "    record_trampoline_hit('rhumbatron.tables.x_later')\n\n"
        "TABLE = x_build()\n"
    )
    (package / "broken.py").write_text("raise ImportError('needs a runtime')\n")
    (tmp_path / "mutants" / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["src/rhumbatron"]\n'
    )
    # THEN only the function that ran while importing is listed (a module that cannot be
    # imported is passed over)
    assert tool.import_time_functions(tmp_path) == {"rhumbatron.tables.x_build"}


def test_a_test_that_reads_the_source_text_is_deselected_where_it_would_read_mutants() -> None:
    written = tomllib.loads(tool.workspace_config(tool.PLANS["actors"], {}))
    selection = written["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    assert selection[selection.index("--deselect") + 1] == "tests/unit/test_kinds.py"


def test_every_core_package_has_a_plan_whose_tests_exist() -> None:
    assert set(tool.PLANS) == set(tool.CORE_PACKAGES)
    for plan in tool.PLANS.values():
        for path in (*plan.tests, *plan.recheck):
            assert (ROOT / path).exists(), f"{plan.name}: {path} does not exist"


def test_the_table_here_is_the_recorded_kill_rates() -> None:
    # GIVEN the kill rates the last `make mutation` runs recorded
    recorded = json.loads((ROOT / "mutation" / "results.json").read_text())
    # THEN docs/conformance.md shows exactly them, package by package
    page = (ROOT / "docs" / "conformance.md").read_text()
    shown = page.split("<!-- mutation-table:begin -->")[1].split("<!-- mutation-table:end -->")[0]
    assert shown.strip() == tool.table_of_recorded(recorded)
    assert set(recorded) <= set(tool.CORE_PACKAGES)


@pytest.mark.parametrize(
    ("removed", "added", "equivalent"),
    [
        pytest.param(
            '        for row in db.execute("SELECT agent_id, paths FROM intents"):',
            '        for row in db.execute("select agent_id, paths from intents"):',
            True,
            id="keywords lower-cased",
        ),
        pytest.param(
            '                "WHERE status IN (?, ?) AND agent_id IS NOT NULL ORDER BY task_id",',
            '                "WHERE STATUS IN (?, ?) AND AGENT_ID IS NOT NULL ORDER BY TASK_ID",',
            True,
            id="columns upper-cased",
        ),
        pytest.param(
            "        \"SELECT COUNT(*) FROM outbox WHERE state = 'pending'\",",
            "        \"SELECT COUNT(*) FROM OUTBOX WHERE STATE = 'PENDING'\",",
            False,
            id="a quoted SQL value changes what matches",
        ),
        pytest.param(
            "        \"AND kind = 'command' AND change_id IS NOT NULL \"",
            "        \"and kind = 'command' and change_id is not null \"",
            True,
            id="keywords around a quoted value that stays the same",
        ),
        pytest.param(
            '        raise ValueError(f"no row FROM {table}")',
            '        raise ValueError(f"NO ROW FROM {TABLE}")',
            False,
            id="a message that mentions FROM is no SQL",
        ),
        pytest.param(
            '        "SELECT agent_id FROM claims WHERE day = ?", (day,)',
            '        "SELECT agent_id FROM claims WHERE day = ?", None',
            False,
            id="not a case change",
        ),
    ],
)
def test_only_a_case_change_of_sql_is_equivalent_by_rule(
    removed: str, added: str, equivalent: bool
) -> None:
    diff = f"# m: survived\n--- a.py\n+++ a.py\n@@ -1,1 +1,1 @@\n-{removed}\n+{added}\n"
    assert tool.is_sql_case_change(diff) is equivalent


def test_a_continued_column_list_is_sql_but_a_short_message_is_not() -> None:
    def diff(removed: str, added: str) -> str:
        return f"--- a.py\n+++ a.py\n-{removed}\n+{added}\n"

    assert tool.is_sql_case_change(
        diff(
            '            "tenant_id, decided_at_s FROM clef_flash_decisions "',
            '            "TENANT_ID, DECIDED_AT_S FROM CLEF_FLASH_DECISIONS "',
        )
    )
    assert tool.is_sql_case_change(
        diff('    "probability, reason, source) "', '    "PROBABILITY, REASON, SOURCE) "')
    )
    assert not tool.is_sql_case_change(
        diff('            reason="no API key",', '            reason="NO API KEY",')
    )
    # AND savepoints, transactions, attached files and pragmas are SQL too (their names in
    #   any case)
    for removed, added in (
        ('        c.execute("BEGIN IMMEDIATE")', '        c.execute("begin immediate")'),
        ('        c.execute("COMMIT")', '        c.execute("commit")'),
        ('        db.execute("ROLLBACK TO project")', '        db.execute("rollback to project")'),
        ('        db.execute("RELEASE project")', '        db.execute("RELEASE PROJECT")'),
        (
            '    c.execute("ATTACH DATABASE ? AS old", (p,))',
            '    c.execute("ATTACH DATABASE ? AS OLD", (p,))',
        ),
        ('        c.execute("DETACH DATABASE old")', '        c.execute("detach database old")'),
        (
            '    s.execute("PRAGMA wal_checkpoint(TRUNCATE)")',
            '    s.execute("PRAGMA WAL_CHECKPOINT(TRUNCATE)")',
        ),
    ):
        assert tool.is_sql_case_change(diff(removed, added)), removed


def test_mutmuts_stats_are_forgotten_when_the_code_or_a_test_changed_and_kept_otherwise(
    tmp_path: Path,
) -> None:
    # GIVEN a repository and a workspace whose mutmut holds stats and a copy of the tests
    root, workspace = tmp_path / "repo", tmp_path / "ws"
    (root / "shared" / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "functions").mkdir()
    code, test = root / "shared" / "pkg" / "a.py", root / "tests" / "test_a.py"
    code.write_text("def f(): return 1\n")
    test.write_text("def test_f(): pass\n")
    handler = root / "functions" / "app.py"
    handler.write_text("handler = 1\n")
    stats = workspace / "mutants" / "mutmut-stats.json"
    copied_test = workspace / "mutants" / "tests" / "test_gone.py"
    copied_test.parent.mkdir(parents=True)

    def collected() -> None:
        stats.write_text(
            json.dumps(
                {
                    "tests_by_mangled_function_name": {"pkg.a.x_f": ["tests/test_a.py::test_f"]},
                    "duration_by_test": {"tests/test_a.py::test_f": 0.1},
                    "config_fingerprint": {"test_selection": "abc"},
                }
            )
        )
        copied_test.parent.mkdir(exist_ok=True)
        copied_test.write_text("")

    def forgotten() -> bool:
        kept = json.loads(stats.read_text())
        return (
            kept["tests_by_mangled_function_name"] == kept["duration_by_test"] == {}
            # what mutmut resets its verdicts by is kept
            and kept["config_fingerprint"] == {"test_selection": "abc"}
            and not copied_test.exists()
        )

    # a first run has nothing to compare with: its stats are collected afresh
    collected()
    assert tool.drop_stale_stats(workspace, root) and forgotten()
    # a resumed run on the same code keeps them, as it does after a change to a test that
    # mutmut never runs (this tool's own)
    collected()
    assert not tool.drop_stale_stats(workspace, root) and not forgotten()
    (root / "tests" / "unit").mkdir()
    (root / "tests" / "unit" / "test_mutation_tool.py").write_text("def test_tool(): pass\n")
    assert not tool.drop_stale_stats(workspace, root) and not forgotten()
    # a changed function, a changed old test, a changed Lambda handler, or a test file
    # renamed with the same text forgets them
    for change in (
        lambda: code.write_text("def f(): return g()\n"),
        lambda: test.write_text("def test_f(): assert True\n"),
        lambda: handler.write_text("handler = 2\n"),
        lambda: test.rename(root / "tests" / "test_b.py"),
    ):
        collected()
        change()
        assert tool.drop_stale_stats(workspace, root) and forgotten()


def _meta(codes: dict[str, int | None], hashes: dict[str, str]) -> dict[str, object]:
    """A mutmut per-file record, as mutmut 3 writes it."""
    return {
        "exit_code_by_key": codes,
        "hash_by_function_name": hashes,
        "type_check_error_by_key": {},
        "durations_by_key": {name: 1.5 for name, code in codes.items() if code is not None},
        "estimated_durations_by_key": {name: 2.0 for name in codes},
    }


def test_a_fresh_workspace_starts_from_the_committed_verdicts_and_keeps_its_own(
    tmp_path: Path,
) -> None:
    # GIVEN a workspace part-way through a run of queues: two files of verdicts, a re-check
    # verdict and a cached diff for its function, and one of each for a function since changed
    done, fresh, state = tmp_path / "done", tmp_path / "fresh", tmp_path / "state"
    module = done / "mutants" / "src" / "rhumbatron" / "queues"
    module.mkdir(parents=True)
    (done / "src" / "rhumbatron" / "queues").mkdir(parents=True)
    for name in ("a", "b"):
        (done / "src" / "rhumbatron" / "queues" / f"{name}.py").write_text("")
    a1, a2 = "rhumbatron.queues.a.x_f__mutmut_1", "rhumbatron.queues.a.x_f__mutmut_2"
    b1 = "rhumbatron.queues.b.x_g__mutmut_1"
    meta_a = _meta({a1: 0, a2: None}, {"x_f": "hf"})
    (module / "a.py.meta").write_text(json.dumps(meta_a))
    (module / "b.py.meta").write_text(json.dumps(_meta({b1: 1}, {"x_g": "hg"})))
    (done / "recheck.json").write_text(json.dumps({a1: [1, "hf"], b1: [1, "old"]}))
    (done / "diffs.json").write_text(json.dumps({a1: ["-x\n+y", "hf"], b1: ["-z", "old"]}))
    # WHEN its state is saved, twice
    path = tool.save_state(done, "queues", out_dir=state)
    first = path.read_bytes()
    assert tool.save_state(done, "queues", out_dir=state).read_bytes() == first
    assert path == state / "queues.json.gz" and not list(state.glob("*.tmp"))
    # AND a fresh checkout's workspace, holding a newer record of b of its own, restores it
    own_b = _meta({b1: 0}, {"x_g": "hg2"})
    (fresh / "mutants" / "src" / "rhumbatron" / "queues").mkdir(parents=True)
    fresh_b = fresh / "mutants" / "src" / "rhumbatron" / "queues" / "b.py.meta"
    fresh_b.write_text(json.dumps(own_b))
    assert tool.restore_state(fresh, "queues", state_dir=state) == 1
    # THEN mutmut finds a's record as it was written, and its own record of b untouched
    fresh_a = fresh / "mutants" / "src" / "rhumbatron" / "queues" / "a.py.meta"
    assert json.loads(fresh_a.read_text()) == meta_a
    assert json.loads(fresh_b.read_text()) == own_b
    # AND the re-check verdict and the diff of the unchanged function come back; those of the
    # changed one were not kept
    assert json.loads((fresh / "recheck.json").read_text()) == {a1: [1, "hf"]}
    assert json.loads((fresh / "diffs.json").read_text()) == {a1: ["-x\n+y", "hf"]}
    # AND a package with no committed state restores nothing
    assert tool.restore_state(fresh, "router", state_dir=state) == 0


def test_a_committed_state_that_cannot_be_read_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "actors.json.gz").write_bytes(b"not gzip")
    with pytest.raises(tool.MutationError, match=r"actors\.json\.gz cannot be read"):
        tool.restore_state(tmp_path / "ws", "actors", state_dir=tmp_path)
