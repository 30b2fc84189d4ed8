"""The view store: one file per stream holds the views of its projects; a fetch's projects
commit together; claim, feed row and view change commit together; one bad event rolls back
alone; an older event never moves a row back; the per-project layout is migrated in."""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from rhumbatron.core.settings import Settings
from rhumbatron.domain.facts import Caller, FactContext
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import stream_index
from rhumbatron.router.project_view import PROJECTOR, ProjectView
from rhumbatron.router.records import Outcome, Record
from rhumbatron.router.view_store import StreamViews, view_store_path

CALLER = Caller("acme", "system:test", correlation_id="corr-view")
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def record(event: Event, seq: int) -> Record:
    # apply_delta reads only the event, its key and its stream sequence
    return Record(cast(Any, None), seq, event.event_id, event, None)


def view_of(settings: Settings, project: str) -> ProjectView:
    return ProjectView(StreamViews(settings, stream_index(project)), project)


def refuse_task_t_bad(connection: sqlite3.Connection) -> None:
    """Make the view's task table refuse task t-bad: a stand-in for any apply error."""
    connection.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON view_tasks WHEN NEW.task_id = 't-bad' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )


def task_events(project: str, change_id: str = "c1") -> list[Event]:
    """A task's life in one Change; Change IDs are unique in a deployment (``chg_`` and 80
    random bits), and the stable Event IDs follow from them."""
    ctx = FactContext(CALLER, project, NOW)
    return [
        ctx.fact("task.ready", {}, change_id=change_id, task_id="t1"),
        ctx.fact("task.assigned", {"agentId": "a1"}, change_id=change_id, task_id="t1"),
        ctx.fact("task.completed", {"agentId": "a1"}, change_id=change_id, task_id="t1"),
    ]


def test_claims_feed_rows_and_view_commit_together(offline_settings: Settings) -> None:
    view = view_of(offline_settings, "acme-web")
    ready, assigned, _ = task_events("acme-web")
    outcomes = view.apply_delta([record(ready, 1), record(assigned, 2)], now_s=1.0)
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    db = view.connection
    # the feed rows are the claims: two, and no second row per event
    assert db.execute("SELECT COUNT(*) FROM project_events").fetchone()[0] == 2
    assert db.execute("SELECT COUNT(*) FROM processed_events").fetchone()[0] == 0
    assert view.store.claim_states([ready.event_id]) == {ready.event_id: ("done", None)}
    assert (view.stream_seq_of(assigned.event_id), view.stream_seq_of("evt_unknown")) == (2, None)
    assert view.snapshot()["activeAgents"] == [{"agentId": "a1", "changeId": "c1", "taskId": "t1"}]
    # the same events again: duplicates, nothing changes
    again = view.apply_delta([record(ready, 1)], now_s=2.0)
    assert again[ready.event_id].outcome is Outcome.DUPLICATE
    assert view.snapshot()["eventsApplied"] == 2


def test_the_claims_are_written_before_the_view_changes_in_the_same_transaction(
    offline_settings: Settings,
) -> None:
    # GIVEN a view, and every statement its file runs traced
    view = view_of(offline_settings, "acme-web")
    ready, assigned, _ = task_events("acme-web")
    statements: list[str] = []
    view.connection.set_trace_callback(lambda sql: statements.append(sql.lstrip().upper()))
    # WHEN a fetch of two events is applied
    view.apply_delta([record(ready, 1), record(assigned, 2)], now_s=1.0)
    view.connection.set_trace_callback(None)
    # THEN inside one transaction the claims (the feed rows) were inserted first, then the
    # view's tables were written (S0-235: claim, then applyDelta), and it committed once
    claims = [i for i, sql in enumerate(statements) if sql.startswith("INSERT INTO PROJECT_EVENTS")]
    view_writes = [
        i
        for i, sql in enumerate(statements)
        if sql.startswith(("INSERT INTO VIEW_", "UPDATE VIEW_", "DELETE FROM VIEW_"))
    ]
    assert claims and view_writes
    assert statements[0].startswith("BEGIN")
    assert max(claims) < min(view_writes)
    assert max(view_writes) < statements.index("COMMIT")
    assert statements.count("COMMIT") == 1


def test_the_feed_prune_keeps_a_row_applied_exactly_at_the_cutoff(
    offline_settings: Settings,
) -> None:
    # GIVEN a feed row applied a millisecond before the cutoff and one exactly at it
    view = view_of(offline_settings, "acme-web")
    ready, assigned, _ = task_events("acme-web")
    view.apply_delta([record(ready, 1)], now_s=999.999)
    view.apply_delta([record(assigned, 2)], now_s=1_000.0)
    # WHEN the feed rows older than the cutoff are pruned
    # THEN only the older one goes: a row exactly the retention old is not older than it
    assert view.store.prune_feed(older_than_s=1_000.0, limit=10) == 1
    rows = view.connection.execute("SELECT event_id FROM project_events").fetchall()
    assert [row[0] for row in rows] == [assigned.event_id]


def test_one_event_that_cannot_be_applied_rolls_back_alone(offline_settings: Settings) -> None:
    # GIVEN a view whose task table refuses task t-bad (a stand-in for any apply error)
    view = view_of(offline_settings, "acme-web")
    refuse_task_t_bad(view.connection)
    ctx = FactContext(CALLER, "acme-web", NOW)
    good = ctx.fact("task.ready", {}, change_id="c1", task_id="t-good")
    bad = ctx.fact("task.ready", {}, change_id="c1", task_id="t-bad")
    # WHEN both are applied in one call
    outcomes = view.apply_delta([record(bad, 1), record(good, 2)], now_s=1.0)
    # THEN the bad one failed with its claim and feed row rolled back; the good one applied
    assert outcomes[bad.event_id].outcome is Outcome.FAILED
    assert "refused" in outcomes[bad.event_id].reason
    assert outcomes[good.event_id].outcome is Outcome.APPLIED
    ids = {row[0] for row in view.connection.execute("SELECT event_id FROM project_events")}
    assert ids == {good.event_id}
    assert view.store.claim_states([bad.event_id, good.event_id]) == {good.event_id: ("done", None)}


def test_an_event_redelivered_late_never_moves_a_row_back(offline_settings: Settings) -> None:
    # GIVEN task t1 completed (seq 3) before its earlier 'ready' (seq 1) came back from a nack
    view = view_of(offline_settings, "acme-web")
    ready, assigned, completed = task_events("acme-web")
    view.apply_delta([record(assigned, 2), record(completed, 3)], now_s=1.0)
    view.apply_delta([record(ready, 1)], now_s=2.0)
    # THEN the task stays completed and no agent is left active
    snapshot = view.snapshot()
    assert snapshot["tasksByState"] == {"completed": 1}
    assert snapshot["activeAgents"] == []
    assert snapshot["eventsApplied"] == 3


def projects_on_one_stream(count: int) -> list[str]:
    found = [f"proj-{n}" for n in range(500) if stream_index(f"proj-{n}") == 3]
    return found[:count]


def test_the_projects_of_a_fetch_commit_once_in_their_streams_file(
    offline_settings: Settings,
) -> None:
    # GIVEN two projects of one stream, and a commit counter on the stream's file
    first, second = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    commits: list[str] = []
    store.connection.set_trace_callback(
        lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None
    )
    a = task_events(first)
    b = task_events(second, change_id="c2")

    # WHEN one fetch of both is applied
    outcomes = store.apply([[record(a[0], 1), record(a[1], 3)], [record(b[0], 2)]], now_s=1.0)

    # THEN every record applied, in one commit, into the one file of the stream
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    assert commits == ["COMMIT"]
    assert store.path == view_store_path(offline_settings, 3)
    assert sorted(store.project_ids()) == sorted([first, second])
    # AND each project sees its own rows only
    assert ProjectView(store, first).snapshot()["eventsApplied"] == 2
    assert ProjectView(store, second).snapshot()["tasksByState"] == {"ready": 1}


def test_one_projects_bad_event_rolls_back_alone_and_the_others_commit(
    offline_settings: Settings,
) -> None:
    # GIVEN a store whose task table refuses task t-bad, and two projects in one fetch
    first, second = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    refuse_task_t_bad(store.connection)
    bad = FactContext(CALLER, first, NOW).fact("task.ready", {}, change_id="c1", task_id="t-bad")
    fine = FactContext(CALLER, first, NOW).fact("task.ready", {}, change_id="c1", task_id="t-ok")
    good = task_events(second, change_id="c2")[0]

    # WHEN both are applied in one fetch, the bad event after a good one of its project
    outcomes = store.apply([[record(fine, 1), record(bad, 2)], [record(good, 3)]], now_s=1.0)

    # THEN the bad event failed alone; every other event applied, in its project too
    assert outcomes[bad.event_id].outcome is Outcome.FAILED
    assert outcomes[fine.event_id].outcome is Outcome.APPLIED
    assert outcomes[good.event_id].outcome is Outcome.APPLIED
    assert ProjectView(store, second).snapshot()["eventsApplied"] == 1
    assert ProjectView(store, first).snapshot()["eventsApplied"] == 1
    assert ProjectView(store, first).snapshot()["tasksByState"] == {"ready": 1}


def test_forgetting_a_project_keeps_the_others_and_the_dead_letter_marks(
    offline_settings: Settings,
) -> None:
    # GIVEN two projects applied, and a dead-lettered event marked processed
    first, second = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    store.apply([[record(e, n) for n, e in enumerate(task_events(first), start=1)]], now_s=1.0)
    store.apply([[record(task_events(second, change_id="c2")[0], 9)]], now_s=1.0)
    store.mark_processed(["evt_00000000000000000000000000000bad"], now_s=1.0)

    # WHEN the first project is forgotten
    forgotten = store.forget(first)

    # THEN its rows and its 3 claims (its feed rows) are gone; the other project and the
    # mark stay
    assert forgotten == 3
    assert ProjectView(store, first).snapshot()["eventsApplied"] == 0
    assert ProjectView(store, first).snapshot()["latestEvents"] == []
    assert ProjectView(store, second).snapshot()["eventsApplied"] == 1
    kept = store.claim_states(
        [e.event_id for e in task_events(first)]
        + [task_events(second, change_id="c2")[0].event_id, "evt_00000000000000000000000000000bad"]
    )
    assert set(kept) == {
        task_events(second, change_id="c2")[0].event_id,
        "evt_00000000000000000000000000000bad",
    }


@pytest.mark.parametrize("fate", ["deleted", "replaced"])
def test_a_file_deleted_or_replaced_under_a_warm_store_is_noticed_and_reopened(
    offline_settings: Settings, caplog: pytest.LogCaptureFixture, fate: str
) -> None:
    # GIVEN a warm store with a project applied
    (project,) = projects_on_one_stream(1)
    store = StreamViews(offline_settings, 3)
    ready, assigned, _ = task_events(project)
    store.apply([[record(ready, 1)]], now_s=1.0)
    assert store.check_file() and not store.lost

    # WHEN its file is deleted (or another file takes its path), and the next fetch is applied
    store.path.unlink()
    if fate == "replaced":
        sqlite3.connect(store.path).close()
    with caplog.at_level(logging.ERROR, logger="rhumbatron.router.view_store"):
        noticed = not store.check_file()
        store.apply([[record(assigned, 2)]], now_s=2.0)

    # THEN the store noticed, once, and said so; wrote into the file now at its path (not
    # the one it had open), and says its views are lost (the router rebuilds them from the
    # log)
    assert noticed
    assert [r.getMessage() for r in caplog.records] == [
        f"the view store {store.path} was {fate} under this process; its views are rebuilt "
        "from the stream"
    ]
    assert store.lost
    assert store.path.exists()
    assert ProjectView(store, project).snapshot()["eventsApplied"] == 1


def legacy_view_file(settings: Settings, project: str) -> Path:
    """``projects/<project>/view.sqlite`` as the code before the view store wrote it: a view
    named Web with two events applied, a task, a feed row and its claim (``evt_1``)."""
    old = settings.state_dir / "projects" / project / "view.sqlite"
    old.parent.mkdir(parents=True)
    legacy = sqlite3.connect(old)
    legacy.executescript(_LEGACY_SCHEMA)
    legacy.execute(
        "INSERT INTO view_project (project_id, tenant_id, name, events_applied) "
        "VALUES (?, 'acme', 'Web', 2)",
        (project,),
    )
    legacy.execute(
        "INSERT INTO view_tasks VALUES "
        "('t1', 'c1', 'assigned', 'a1', 2, '2026-03-02T10:00:00.000Z')"
    )
    legacy.execute(
        "INSERT INTO project_events VALUES ('evt_1', 2, 'task.assigned', 'c1', 't1', "
        "'agent:a1', '2026-03-02T10:00:00.000Z', 1.0)"
    )
    legacy.execute(
        "INSERT INTO processed_events VALUES (?, 'evt_1', 'done', NULL, 1.0)", (PROJECTOR,)
    )
    legacy.commit()
    legacy.close()
    return old


def test_a_per_project_view_file_is_migrated_into_its_streams_store(
    offline_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a state directory of the per-project layout: projects/<id>/view.sqlite with a
    # view, a feed and claims, as the code before the view store wrote it
    (project,) = projects_on_one_stream(1)
    old = legacy_view_file(offline_settings, project)

    # WHEN the stream's store opens
    store = StreamViews(offline_settings, stream_index(project))
    view = ProjectView(store, project)

    # THEN the project's rows and claims are in the store, and the old file is renamed, not
    # left to be silently ignored
    snapshot = view.snapshot()
    assert (snapshot["name"], snapshot["eventsApplied"]) == ("Web", 2)
    assert snapshot["tasksByState"] == {"assigned": 1}
    assert view.stream_seq_of("evt_1") == 2
    again = store.apply([[record(task_events(project, change_id="c9")[0], 1)]], now_s=2.0)
    assert {o.outcome for o in again.values()} == {Outcome.APPLIED}
    assert store.claim_states(["evt_1"]) == {"evt_1": ("done", None)}
    assert not old.exists()
    assert old.with_name("view.sqlite.migrated").exists()
    # AND the operator is told what moved where, and where the old file is kept
    [said] = [r.getMessage() for r in caplog.records if "migrated the view" in r.message]
    assert said == (
        f"migrated the view of project {project} from {old} into {store.path} "
        "(the old file is kept as view.sqlite.migrated)"
    )


def test_a_streams_store_migrates_only_its_own_projects_files(offline_settings: Settings) -> None:
    # GIVEN per-project view files of two projects on different streams
    (ours,) = projects_on_one_stream(1)
    theirs = next(f"proj-{n}" for n in range(500) if stream_index(f"proj-{n}") != 3)
    ours_file, theirs_file = (legacy_view_file(offline_settings, p) for p in (ours, theirs))
    # WHEN stream 3's store opens
    store = StreamViews(offline_settings, 3)
    _ = store.connection
    # THEN it takes its own project's file, and leaves the other stream's where it is, for
    #   that stream's store to take
    assert store.project_ids() == [ours]
    assert not ours_file.exists() and theirs_file.exists()


_LEGACY_SCHEMA = """
CREATE TABLE processed_events (consumer TEXT NOT NULL, event_id TEXT NOT NULL,
    status TEXT NOT NULL, lease_until_s REAL, processed_at_s REAL NOT NULL,
    PRIMARY KEY (consumer, event_id)) WITHOUT ROWID;
CREATE TABLE view_project (project_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, name TEXT,
    status TEXT NOT NULL DEFAULT 'active', canonical_generation INTEGER NOT NULL DEFAULT 0,
    canonical_candidate_id TEXT, events_applied INTEGER NOT NULL DEFAULT 0, last_event_at TEXT);
CREATE TABLE view_changes (change_id TEXT PRIMARY KEY, title TEXT, status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '', updated_seq INTEGER NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE view_tasks (task_id TEXT PRIMARY KEY, change_id TEXT, status TEXT NOT NULL,
    agent_id TEXT, updated_seq INTEGER NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE view_agents (agent_id TEXT PRIMARY KEY, change_id TEXT, task_id TEXT,
    since TEXT NOT NULL, updated_seq INTEGER NOT NULL);
CREATE TABLE view_candidates (candidate_id TEXT PRIMARY KEY, change_id TEXT,
    status TEXT NOT NULL, base_generation INTEGER, updated_seq INTEGER NOT NULL,
    updated_at TEXT NOT NULL);
CREATE TABLE view_releases (release_id TEXT PRIMARY KEY, generation INTEGER NOT NULL,
    status TEXT NOT NULL, updated_seq INTEGER NOT NULL);
CREATE TABLE project_events (event_id TEXT PRIMARY KEY, stream_seq INTEGER NOT NULL,
    event_type TEXT NOT NULL, change_id TEXT, task_id TEXT, actor TEXT NOT NULL,
    occurred_at TEXT NOT NULL, applied_at_s REAL NOT NULL);
"""


async def test_a_projector_given_more_projects_than_its_budget_defers_the_rest_whole(
    offline_settings: Settings,
) -> None:
    from rhumbatron.router.handlers import ProjectViewProjector, RunContext

    # GIVEN a projector with one apply call left in its run, and records of two projects
    first, second = projects_on_one_stream(2)
    projector = ProjectViewProjector(offline_settings)
    a = task_events(first)
    b = task_events(second, change_id="c2")
    records = [record(a[0], 1), record(b[0], 2), record(a[1], 3)]
    run = RunContext(3, now_s=1.0, apply_calls_left=1)
    try:
        # WHEN it handles them
        outcomes = await projector.handle(records, run)
        store = projector.views(3)
        # THEN the first project's records applied (one call); the second's were deferred
        # whole: not applied and not claimed, so their next delivery applies them
        assert [outcomes[r.key].outcome for r in records] == [
            Outcome.APPLIED,
            Outcome.DEFERRED,
            Outcome.APPLIED,
        ]
        assert run.apply_calls_left == 0
        assert store.claim_states([b[0].event_id]) == {}
        assert ProjectView(store, second).snapshot()["eventsApplied"] == 0
    finally:
        projector.close()


def seqs(records: list[Record]) -> list[int]:
    return [r.stream_seq for r in records]


def test_a_fetch_is_split_where_the_runs_apply_calls_end_each_part_in_stream_order(
    offline_settings: Settings,
) -> None:
    from rhumbatron.router.handlers import ProjectViewProjector, RunContext

    # GIVEN records of three projects, interleaved, and one that did not decode
    p1, p2, p3 = projects_on_one_stream(3)
    a, b, c = task_events(p1), task_events(p2, change_id="c2"), task_events(p3, change_id="c3")
    undecodable = Record(cast(Any, None), 4, "seq:4", None, "undecodable record: x")
    records = [
        record(a[0], 1),
        record(b[0], 2),
        record(c[0], 3),
        undecodable,
        record(b[1], 5),
        record(a[1], 6),
        record(c[1], 7),
    ]
    projector = ProjectViewProjector(offline_settings)
    try:
        # WHEN a run with two apply calls left splits them
        run = RunContext(3, 1.0, apply_calls_left=2)
        now, later = projector.split_by_budget(records, run)
        # THEN the first two projects (by their first record) and the undecodable record are
        # taken now; the third project waits whole; the run itself is not charged
        assert (seqs(now), seqs(later)) == ([1, 2, 4, 5, 6], [3, 7])
        assert run.apply_calls_left == 2
        # AND with as many calls as projects, or more, nothing waits
        for calls in (3, 4):
            run = RunContext(3, 1.0, apply_calls_left=calls)
            assert projector.split_by_budget(records, run) == (records, [])
            assert run.apply_calls_left == calls
        # AND with none left, only the undecodable record is taken
        spent = projector.split_by_budget(records, RunContext(3, 1.0, apply_calls_left=0))
        assert (seqs(spent[0]), seqs(spent[1])) == ([4], [1, 2, 3, 5, 6, 7])
        # AND the budget a fetch of the decoded records would leave says the same: the calls
        # left after it, and how many records must wait
        decoded = [r for r in records if r.event is not None]
        for calls, after in ((4, (1, 0)), (3, (0, 0)), (2, (0, 2)), (1, (0, 4)), (0, (0, 6))):
            run = RunContext(3, 1.0, apply_calls_left=calls)
            assert projector.budget_after(decoded, run) == after, calls
            assert run.apply_calls_left == calls
    finally:
        projector.close()


def test_a_changes_title_state_and_reason_follow_its_lifecycle(
    offline_settings: Settings,
) -> None:
    # GIVEN a project created, and five Changes: one moved to verifying and then settled
    #   into releasing with a reason, one failed with a reason, one completed, one only
    #   created, one moved to verifying with a reason
    view = view_of(offline_settings, "acme-web")
    ctx = FactContext(CALLER, "acme-web", NOW)

    def created(change_id: str, title: str) -> Event:
        request = {"title": title, "clientRequestId": f"req-{change_id}", "requestedBy": "u:1"}
        return ctx.fact("change.created", request, change_id=change_id)

    def moved(to: str, **reason: str) -> dict[str, str]:
        return {"fromStatus": "open", "toStatus": to, **reason}

    life = [
        ctx.fact("project.created", {"name": "Web shop"}),
        created("c1", "Add login"),
        ctx.fact("change.status_changed", moved("verifying"), change_id="c1"),
        ctx.fact("change.settled", moved("releasing", reason="verified"), change_id="c1"),
        created("c2", "Dark mode"),
        ctx.fact("change.failed", {"reason": "tests red"}, change_id="c2"),
        created("c3", "Beta"),
        ctx.fact("change.completed", {}, change_id="c3"),
        created("c4", "Later"),
        created("c5", "Docs"),
        ctx.fact("change.status_changed", moved("verifying", reason="tasks done"), change_id="c5"),
    ]
    # WHEN they are applied in order (stream sequences 0 to 10)
    outcomes = view.apply_delta([record(e, seq) for seq, e in enumerate(life)], now_s=1.0)
    # THEN the view bears the project's name, each Change keeps its title, and reads its
    #   last state with that event's reason
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    assert view.snapshot()["name"] == "Web shop"
    changes = "SELECT change_id, title, status, reason, updated_seq FROM view_changes ORDER BY 1"
    assert [tuple(row) for row in view.connection.execute(changes)] == [
        ("c1", "Add login", "releasing", "verified", 3),
        ("c2", "Dark mode", "failed", "tests red", 5),
        ("c3", "Beta", "completed", "", 7),
        ("c4", "Later", "open", "", 8),
        ("c5", "Docs", "verifying", "tasks done", 10),
    ]
    by_state = {"completed": 1, "failed": 1, "open": 1, "releasing": 1, "verifying": 1}
    assert view.snapshot()["changesByState"] == by_state


def test_candidates_promotions_releases_and_the_canonical_generation_are_projected(
    offline_settings: Settings,
) -> None:
    # GIVEN a Change's candidate composed, verified and promoted, the canonical generation
    # moved to it, and a release of that generation started and completed; a second
    # candidate whose promotion was refused
    view = view_of(offline_settings, "acme-web")
    ctx = FactContext(CALLER, "acme-web", NOW)
    one, two = {"candidateId": "cand-1"}, {"candidateId": "cand-2"}
    composed = {"baseGeneration": 0, "compositionKey": "k"}
    life = [
        ctx.fact("candidate.created", one | composed, change_id="c1", key="k1"),
        ctx.fact("candidate.verified", one, change_id="c1", key="k2"),
        ctx.fact("promotion.requested", one | {"expectedGeneration": 0}, change_id="c1", key="k3"),
        ctx.fact(
            "promotion.completed",
            one | {"expectedGeneration": 0, "outcome": "promoted"},
            change_id="c1",
            key="p1",
        ),
        ctx.fact(
            "canonical.advanced",
            {"generation": 1, "previousGeneration": 0, "candidateId": "cand-1"},
        ),
        ctx.fact(
            "release.started", {"releaseId": "rel-1", "generation": 1}, change_id="c1", key="k4"
        ),
        ctx.fact(
            "release.completed", {"releaseId": "rel-1", "generation": 1}, change_id="c1", key="k5"
        ),
        ctx.fact("candidate.created", two | composed, change_id="c1", key="k6"),
        ctx.fact(
            "promotion.completed",
            two | {"expectedGeneration": 0, "outcome": "rejected"},
            change_id="c1",
            key="p2",
        ),
    ]

    # WHEN they are applied in order (stream sequences 10 to 18)
    outcomes = view.apply_delta([record(e, seq) for seq, e in enumerate(life, 10)], now_s=1.0)

    # THEN the promoted candidate reads promoted (its base generation kept from its creation),
    # the refused one is still as composed, the project is at generation 1 from cand-1, and
    # the release reads completed
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}
    snapshot = view.snapshot()
    assert snapshot["candidates"] == [
        {"candidateId": "cand-1", "changeId": "c1", "status": "promoted"},
        {"candidateId": "cand-2", "changeId": "c1", "status": "created"},
    ]
    db = view.connection
    bases = "SELECT candidate_id, base_generation FROM view_candidates ORDER BY 1"
    assert [tuple(row) for row in db.execute(bases)] == [("cand-1", 0), ("cand-2", 0)]
    assert snapshot["canonicalGeneration"] == 1
    canonical = "SELECT canonical_candidate_id FROM view_project WHERE project_id = 'acme-web'"
    assert db.execute(canonical).fetchone()[0] == "cand-1"
    releases = "SELECT release_id, generation, status, updated_seq FROM view_releases"
    assert [tuple(row) for row in db.execute(releases)] == [("rel-1", 1, "completed", 16)]

    # AND events from before them, arriving late, move nothing back: another candidate's
    # advance to the same generation, the release's start, the first candidate's verification
    late = [
        ctx.fact(
            "canonical.advanced",
            {"generation": 1, "previousGeneration": 0, "candidateId": "cand-0"},
        ),
        ctx.fact(
            "release.started",
            {"releaseId": "rel-1", "generation": 1, "reason": "x"},
            change_id="c1",
            key="k7",
        ),
        ctx.fact("candidate.verified", one | {"reason": "again"}, change_id="c1", key="k8"),
    ]
    view.apply_delta([record(e, seq) for seq, e in zip((2, 3, 4), late, strict=True)], now_s=2.0)
    assert db.execute(canonical).fetchone()[0] == "cand-1"
    assert [tuple(row) for row in db.execute(releases)] == [("rel-1", 1, "completed", 16)]
    assert view.snapshot()["candidates"][0]["status"] == "promoted"


def test_a_bad_event_sends_only_its_own_projects_events_one_by_one(
    offline_settings: Settings,
) -> None:
    # GIVEN two projects of one stream in one fetch, the second holding an event its view
    # refuses (a stand-in for any apply error), and a trace of the file's savepoints
    good, faulty = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    refuse_task_t_bad(store.connection)
    steps: list[str] = []
    store.connection.set_trace_callback(
        lambda sql: (
            steps.append(sql.strip())
            if sql.strip().split()[0].upper() in {"SAVEPOINT", "ROLLBACK", "RELEASE"}
            else None
        )
    )
    a = task_events(good)
    ctx = FactContext(CALLER, faulty, NOW)
    bad = ctx.fact("task.ready", {}, change_id="c2", task_id="t-bad")
    fine = ctx.fact("task.ready", {}, change_id="c2", task_id="t-fine")

    # WHEN the fetch is applied
    outcomes = store.apply(
        [[record(a[0], 1), record(a[1], 2)], [record(bad, 3), record(fine, 4)]], now_s=1.0
    )

    # THEN the fetch as a whole is rolled back, each project goes again as one group, and
    # only the faulty project's events go one at a time; the bad one alone fails
    assert steps == [
        "SAVEPOINT fetch",
        "ROLLBACK TO fetch",
        "RELEASE fetch",
        "SAVEPOINT project",
        "RELEASE project",
        "SAVEPOINT project",
        "ROLLBACK TO project",
        "RELEASE project",
        "SAVEPOINT event",
        "ROLLBACK TO event",
        "RELEASE event",
        "SAVEPOINT event",
        "RELEASE event",
    ]
    assert {key: o.outcome for key, o in outcomes.items()} == {
        a[0].event_id: Outcome.APPLIED,
        a[1].event_id: Outcome.APPLIED,
        bad.event_id: Outcome.FAILED,
        fine.event_id: Outcome.APPLIED,
    }
    assert store.claim_states([a[0].event_id, a[1].event_id, fine.event_id, bad.event_id]) == {
        a[0].event_id: ("done", None),
        a[1].event_id: ("done", None),
        fine.event_id: ("done", None),
    }


def break_the_file_at_task_t_disk(connection: sqlite3.Connection) -> None:
    """Make the view meet an error of the file itself (a stand-in for a full disk or a lock:
    SQLite's OperationalError) when task ``t-disk`` is written: a function that fails, called
    by a trigger (trigger ``broken``)."""

    def disk_full(_: object) -> None:
        raise OSError("no space left on device")

    connection.create_function("disk_full", 1, disk_full)
    connection.execute(
        "CREATE TRIGGER broken BEFORE INSERT ON view_tasks WHEN NEW.task_id = 't-disk' "
        "BEGIN SELECT disk_full(1); END"
    )


def test_a_file_error_in_one_projects_group_rolls_the_whole_fetch_back_and_is_raised(
    offline_settings: Settings,
) -> None:
    # GIVEN a fetch whose first project holds an event its view refuses (so the projects go
    # again one group at a time) and whose second project's group then meets an error of
    # the file itself (a stand-in for a full disk or a lock: SQLite's OperationalError)
    first, second = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    refuse_task_t_bad(store.connection)
    break_the_file_at_task_t_disk(store.connection)
    bad = FactContext(CALLER, first, NOW).fact("task.ready", {}, change_id="c1", task_id="t-bad")
    disk = FactContext(CALLER, second, NOW).fact("task.ready", {}, change_id="c2", task_id="t-disk")

    # WHEN it is applied, THEN the file's own error is raised as it was met (the caller
    # retries the whole fetch, counting no failure) and nothing of the fetch is kept
    with pytest.raises(sqlite3.OperationalError, match="user-defined function raised exception"):
        store.apply([[record(bad, 1)], [record(disk, 2)]], now_s=1.0)
    assert store.claim_states([bad.event_id, disk.event_id]) == {}
    # AND the file takes the next fetch as usual
    fine = task_events(first, change_id="c3")[:1]
    outcomes = store.apply([[record(fine[0], 3)]], now_s=2.0)
    assert outcomes[fine[0].event_id].outcome is Outcome.APPLIED


def test_a_file_error_in_the_fetchs_one_statement_apply_is_raised_as_met_and_keeps_nothing(
    offline_settings: Settings,
) -> None:
    # GIVEN a fetch of two projects, every event of which its view takes, whose apply (one
    #   statement for the whole fetch) meets an error of the file itself
    first, second = projects_on_one_stream(2)
    store = StreamViews(offline_settings, 3)
    break_the_file_at_task_t_disk(store.connection)
    fine = FactContext(CALLER, first, NOW).fact("task.ready", {}, change_id="c1", task_id="t1")
    disk = FactContext(CALLER, second, NOW).fact("task.ready", {}, change_id="c2", task_id="t-disk")

    # WHEN it is applied, THEN that error is raised as it was met (not tried again project by
    #   project, which would fail the events for it) and nothing of the fetch is kept
    with pytest.raises(sqlite3.OperationalError, match="user-defined function raised exception"):
        store.apply([[record(fine, 1)], [record(disk, 2)]], now_s=1.0)
    assert store.claim_states([fine.event_id, disk.event_id]) == {}
    # AND the file takes the fetch again once the error is gone
    store.connection.execute("DROP TRIGGER broken")
    outcomes = store.apply([[record(fine, 1)], [record(disk, 2)]], now_s=2.0)
    assert {o.outcome for o in outcomes.values()} == {Outcome.APPLIED}


def test_an_agent_that_woke_is_active_unless_its_wakeup_was_false(
    offline_settings: Settings,
) -> None:
    # GIVEN one agent that woke for a Change, and one whose wakeup was a false one
    view = view_of(offline_settings, "acme-web")
    ctx = FactContext(CALLER, "acme-web", NOW)
    woke = ctx.fact("agent.woke", {"agentId": "a2"}, change_id="c1", key="a2")
    false = ctx.fact("agent.woke", {"agentId": "a3", "falseWakeup": True}, change_id="c1", key="a3")
    # WHEN both are applied
    view.apply_delta([record(woke, 1), record(false, 2)], now_s=1.0)
    # THEN only the first is an active agent, on its Change, with no task yet
    assert view.snapshot()["activeAgents"] == [{"agentId": "a2", "changeId": "c1", "taskId": None}]


@pytest.mark.parametrize("ending", ["task.completed", "task.failed", "task.blocked"])
def test_a_task_that_ends_frees_its_agent_and_keeps_who_held_it(
    offline_settings: Settings, ending: str
) -> None:
    # GIVEN task t1 assigned to agent a1, and task t2 to agent a2
    view = view_of(offline_settings, "acme-web")
    ctx = FactContext(CALLER, "acme-web", NOW)
    events = [
        ctx.fact("task.assigned", {"agentId": "a1"}, change_id="c1", task_id="t1"),
        ctx.fact("task.assigned", {"agentId": "a2"}, change_id="c1", task_id="t2"),
    ]
    # WHEN t1 completes, fails or is blocked
    payload = {"agentId": "a1"} if ending == "task.completed" else {"reason": "no tests"}
    events.append(ctx.fact(ending, payload, change_id="c1", task_id="t1"))
    view.apply_delta([record(event, seq) for seq, event in enumerate(events, 1)], now_s=1.0)

    # THEN its agent's slot is free and the other agent stays active
    assert view.snapshot()["activeAgents"] == [{"agentId": "a2", "changeId": "c1", "taskId": "t2"}]
    # AND each task row still names the agent it was assigned to
    rows = view.connection.execute("SELECT task_id, status, agent_id FROM view_tasks ORDER BY 1")
    assert [tuple(row) for row in rows] == [
        ("t1", ending.split(".")[1], "a1"),
        ("t2", "assigned", "a2"),
    ]
