"""Faults of actor files: a process killed inside a transaction (F17), a transaction that
raises or carries a bad Event, two writers on one file (F19), WAL on a network filesystem
(F21). Real SQLite files in temp dirs; a crashing writer is a separate process."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink, alarm_due_at
from rhumbatron.actors.resource_shard import ResourceShard
from rhumbatron.actors.shard_commands import AcquireClaim, AppendChangeEvents
from rhumbatron.actors.storage import is_network_filesystem
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.changes import ChangeFact
from rhumbatron.domain.facts import FactContext
from rhumbatron.domain.transition import Transition, Upsert
from rhumbatron.errors import (
    ActorBusyError,
    DomainError,
    EnvelopeError,
    OutboxError,
    UnknownTypeError,
    UnsafeStorageError,
)
from rhumbatron.protocol.envelopes import Event
from rhumbatron.protocol.ids import new_event_id
from rhumbatron.runtime.bootstrap import bootstrap

from .worker import CALLER, outbox_rows, run_worker, worker_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

JOURNAL_MODES = pytest.mark.parametrize("journal_mode", ["WAL", "DELETE"])
PROJECT = "proj-actor"


def _offline(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(state_dir=tmp_path / "state", nats_url="nats://127.0.0.1:1", **overrides)


def _shard(settings: Settings, resource: str = "file:a.py", **kwargs: object) -> ResourceShard:
    ref = ResourceShard.ref_for(PROJECT, resource, settings.resource_shard_count)
    return ResourceShard(ref, settings, clock=ManualClock(), **kwargs)  # type: ignore[arg-type]


def _same_shard_resource(settings: Settings, resource: str) -> str:
    """Another resource key that lives in the same shard as ``resource``."""
    count = settings.resource_shard_count
    wanted = ResourceShard.ref_for(PROJECT, resource, count)
    for n in range(10_000):
        candidate = f"file:other-{n}.py"
        if candidate != resource and ResourceShard.ref_for(PROJECT, candidate, count) == wanted:
            return candidate
    raise AssertionError("no second resource in the same shard")


def _claimed(shard: ResourceShard) -> list[str]:
    return [r["resource"] for r in shard.connection.execute("SELECT resource FROM claims")]


def _outbox_resources(shard: ResourceShard) -> list[str | None]:
    return [Event.parse(r["envelope"]).resource for r in outbox_rows(shard)]


# --------------------------------------------------------------------------- F17


@JOURNAL_MODES
def test_process_killed_inside_a_transaction_leaves_state_and_outbox_together(
    tmp_path: Path, journal_mode: str
) -> None:
    settings = _offline(tmp_path, journal_mode=journal_mode)
    first = "file:a.py"
    second = _same_shard_resource(settings, first)

    # GIVEN an actor file where one claim committed (its state row and its outbox row)
    done = run_worker(["claim", PROJECT, first], worker_env(settings))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"events_added": 1}

    # WHEN a process is killed inside the transaction of a second claim, after it wrote the
    # claim row and appended claim.acquired to the outbox, before COMMIT
    crashed = run_worker(["claim", PROJECT, second], worker_env(settings, crash_at="in_txn"))
    assert crashed.returncode == 137, crashed.stderr
    assert crashed.stdout == ""

    # THEN the file holds the first claim with its outbox row, and neither row of the second
    shard = _shard(settings, first)
    try:
        assert shard.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert _claimed(shard) == [first]
        assert _outbox_resources(shard) == [first]

        # ... and the next transaction on the file works as usual
        result = shard.apply(
            CALLER, AcquireClaim(resource=second, agent_id="agent-2", ttl=timedelta(minutes=5))
        )
        assert result.events_added == 1
        assert sorted(_claimed(shard)) == sorted([first, second])
        assert _outbox_resources(shard) == [first, second]
        assert shard.connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        shard.close()


# --------------------------------------------------------------------------- transactions


def test_decision_raising_after_building_facts_leaves_no_state_and_no_outbox_row(
    tmp_path: Path,
) -> None:
    # GIVEN an actor with one committed claim
    alarms = RecordingAlarmSink()
    shard = _shard(_offline(tmp_path), alarms=alarms)
    shard.apply(
        CALLER, AcquireClaim(resource="file:a.py", agent_id="agent-1", ttl=timedelta(hours=1))
    )
    alarms.drain()
    alarm_before = alarm_due_at(shard.connection)

    def decide(db: sqlite3.Connection) -> Transition:
        ctx = FactContext(CALLER, PROJECT, shard.clock.now())
        ctx.fact(
            "claim.released",
            {"claimId": "clm_1", "agentId": "agent-1"},
            resource="file:a.py",
        )
        db.execute("DELETE FROM claims")  # a write inside the transaction, before the failure
        raise RuntimeError("decision failed after building its facts")

    # WHEN a decision writes, builds a fact, then raises
    with pytest.raises(RuntimeError, match="decision failed"):
        shard.transact(decide)

    # THEN nothing of it is left: the claim is still there, one outbox row, no new alarm
    assert _claimed(shard) == ["file:a.py"]
    assert len(outbox_rows(shard)) == 1
    assert alarm_due_at(shard.connection) == alarm_before
    assert alarms.announced == []
    shard.close()


def test_transition_with_a_fact_the_actor_does_not_own_rolls_back_its_patch(
    tmp_path: Path,
) -> None:
    # GIVEN a shard, and a transition whose patch is valid but whose fact belongs to the root
    shard = _shard(_offline(tmp_path))
    ctx = FactContext(CALLER, PROJECT, shard.clock.now())
    root_fact = ctx.fact("project.created", {"name": "Demo"})
    row = {
        "resource": "file:a.py",
        "claim_id": "clm_x",
        "agent_id": "agent-1",
        "mode": "exclusive",
        "expires_at": 0.0,
    }
    transition = Transition(patch=(Upsert("claims", row, key=("resource",)),), facts=(root_fact,))

    # WHEN the shard runs it THEN it is refused, naming the owner, and the patch is undone
    with pytest.raises(DomainError, match="project_root"):
        shard.transact(lambda db: transition)
    assert _claimed(shard) == []
    assert outbox_rows(shard) == []
    shard.close()


def test_event_over_max_event_bytes_raises_and_rolls_back_the_whole_transaction(
    tmp_path: Path,
) -> None:
    # GIVEN an actor limited to 2 KiB Events, with one committed change event
    shard = _shard(_offline(tmp_path, max_event_bytes=2048), "change:c1")
    small = ChangeFact("agent.woke", {"agentId": "agent-1"}, key="w1")
    shard.apply(CALLER, AppendChangeEvents(change_id="c1", status="running", facts=(small,)))

    # WHEN a change transition appends a small fact and one of ~4 KB
    big = ChangeFact(
        "change.status_changed",
        {"fromStatus": "running", "toStatus": "verifying", "reason": "x" * 4000},
        key="big",
    )
    later = ChangeFact("agent.woke", {"agentId": "agent-2"}, key="w2")
    with pytest.raises(OutboxError) as raised:
        shard.apply(
            CALLER, AppendChangeEvents(change_id="c1", status="verifying", facts=(later, big))
        )

    # THEN the error names the size and the setting; neither fact nor the status moved
    assert "RHUMBATRON_MAX_EVENT_BYTES=2048" in str(raised.value)
    assert len(outbox_rows(shard)) == 1
    state = shard.change_state("c1")
    assert state is not None
    assert state.status == "running"
    shard.close()


def test_malformed_event_is_refused_at_construction_and_never_reaches_the_outbox(
    tmp_path: Path,
) -> None:
    shard = _shard(_offline(tmp_path), "change:c1")
    good = {
        "event_id": new_event_id(),
        "event_type": "agent.woke",
        "event_version": 1,
        "tenant_id": "tenant-1",
        "project_id": PROJECT,
        "change_id": "c1",
        "actor": "system:test",
        "correlation_id": "corr-1",
        "timestamp": shard.clock.now(),
        "payload": {"agentId": "agent-1"},
    }
    assert Event.create(**good).event_type == "agent.woke"

    # WHEN an Event is built with a bad field, an unknown type, or a bad payload
    # THEN construction raises, naming the field and the value
    with pytest.raises(EnvelopeError, match=r"eventId='not-an-id'"):
        Event.create(**{**good, "event_id": "not-an-id"})
    with pytest.raises(UnknownTypeError, match=r"agent\.slept"):
        Event.create(**{**good, "event_type": "agent.slept"})
    with pytest.raises(EnvelopeError, match="agentId"):
        Event.create(**{**good, "payload": {"agentId": ""}})

    # WHEN a transition's fact has a payload its type does not accept
    # THEN the transaction raises and leaves neither the change row nor an outbox row
    bad = ChangeFact("agent.woke", {"agentId": ""}, key="w1")
    with pytest.raises(EnvelopeError, match="agentId"):
        shard.apply(CALLER, AppendChangeEvents(change_id="c1", status="running", facts=(bad,)))
    assert outbox_rows(shard) == []
    assert shard.change_state("c1") is None
    shard.close()


# --------------------------------------------------------------------------- F19


@JOURNAL_MODES
def test_second_writer_waits_the_busy_timeout_then_gets_a_clear_error(
    tmp_path: Path, journal_mode: str
) -> None:
    # GIVEN an actor file with a 200 ms busy timeout, held by another writer
    settings = _offline(tmp_path, journal_mode=journal_mode, sqlite_busy_timeout_ms=200)
    shard = _shard(settings)
    shard.connection  # noqa: B018 -- creates the file and its schema
    other = sqlite3.connect(shard.path, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")
    try:
        # WHEN the actor runs a transaction
        started = time.monotonic()
        with pytest.raises(ActorBusyError) as raised:
            shard.apply(
                CALLER,
                AcquireClaim(resource="file:a.py", agent_id="agent-1", ttl=timedelta(minutes=5)),
            )
        waited = time.monotonic() - started

        # THEN it waited about the busy timeout, then failed naming the file and the setting
        assert 0.15 <= waited < 5
        message = str(raised.value)
        assert str(shard.path) in message
        assert "RHUMBATRON_SQLITE_BUSY_TIMEOUT_MS" in message
        assert _claimed(shard) == []
        assert outbox_rows(shard) == []
    finally:
        other.execute("ROLLBACK")
        other.close()

    # WHEN the other writer lets go THEN the same transaction succeeds
    result = shard.apply(
        CALLER, AcquireClaim(resource="file:a.py", agent_id="agent-1", ttl=timedelta(minutes=5))
    )
    assert result.events_added == 1
    assert _claimed(shard) == ["file:a.py"]
    shard.close()


# --------------------------------------------------------------------------- F21


def test_wal_on_a_network_filesystem_is_refused_at_startup(tmp_path: Path) -> None:
    # GIVEN a state dir on a network filesystem and the default WAL journal
    state_dir = tmp_path / "state"
    settings = load_settings(state_dir=state_dir, network_filesystem=True)
    assert settings.journal_mode == "WAL"

    # WHEN the runtime starts THEN it refuses, naming the setting to change, before any file
    with pytest.raises(UnsafeStorageError) as raised:
        bootstrap(settings)
    assert "RHUMBATRON_JOURNAL_MODE=WAL" in str(raised.value)
    assert "RHUMBATRON_JOURNAL_MODE=DELETE" in str(raised.value)
    assert not state_dir.exists()

    # WHEN the journal mode is DELETE THEN it starts and actors use that journal
    safe = load_settings(state_dir=state_dir, network_filesystem=True, journal_mode="DELETE")
    app = bootstrap(safe)
    shard = app.resource_shard(PROJECT, "file:a.py")
    assert shard.connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    shard.close()


def test_network_filesystem_is_detected_from_the_mount_table(tmp_path: Path) -> None:
    # GIVEN a mount table with an NFS (EFS) mount, a CIFS mount whose path has a space, and a
    # local tmpfs mounted inside the NFS one
    root = tmp_path.resolve()
    efs = root / "efs"
    spaced = root / "share X"  # a space in its path, and a last letter rstrip must keep
    nested = efs / "cache"
    sibling = root / "efs2"
    for directory in (efs, spaced, nested, sibling):
        directory.mkdir()
    mounts = root / "mounts"
    escaped = str(spaced).replace(" ", "\\040")
    overmounted = root / "overmounted"
    overmounted.mkdir()
    mounts.write_text(
        "overlay / overlay rw,relatime 0 0\n"
        "too short\n"  # fewer than the three fields a mount needs: skipped, not the end
        f"fs-0123.efs.eu-west-1.amazonaws.com:/ {efs} nfs4 rw,vers=4.1 0 0\n"
        f"//server/share {escaped} cifs\n"  # the three fields a mount needs, no more
        f"tmpfs {nested} tmpfs rw 0 0\n"
        # a local disk mounted over an NFS mount: the last mount on a point is the one seen
        f"fs-0123.efs.eu-west-1.amazonaws.com:/ {overmounted} nfs4 rw 0 0\n"
        f"/dev/sdb1 {overmounted} ext4 rw 0 0\n"
    )

    # WHEN / THEN paths under the network mounts are network paths, even before they exist
    assert is_network_filesystem(efs / "state" / "projects", mounts_file=mounts)
    assert is_network_filesystem(efs, mounts_file=mounts)
    assert is_network_filesystem(spaced / "state", mounts_file=mounts)
    # ... the longest mount point wins, and a sibling with a common prefix is not inside
    assert not is_network_filesystem(nested / "db.sqlite", mounts_file=mounts)
    assert not is_network_filesystem(sibling / "state", mounts_file=mounts)
    assert not is_network_filesystem(root / "local", mounts_file=mounts)
    assert not is_network_filesystem(overmounted / "state", mounts_file=mounts)
    # ... and an unreadable mount table detects nothing
    assert not is_network_filesystem(efs, mounts_file=root / "missing")
    # ... a directory that exists deep under a network mount is on it too
    (efs / "state" / "projects").mkdir(parents=True)
    (spaced / "state").mkdir()
    assert is_network_filesystem(efs / "state" / "projects", mounts_file=mounts)
    assert is_network_filesystem(spaced / "state", mounts_file=mounts)

    # GIVEN a root filesystem that is itself NFS (a diskless host), and a table without one
    nfs_root = root / "nfs-root-mounts"
    nfs_root.write_text("server:/export / nfs4 rw 0 0\n")
    no_root = root / "no-root-mounts"
    no_root.write_text(f"fs-0123.efs.eu-west-1.amazonaws.com:/ {efs} nfs4 rw 0 0\n")
    # THEN every path is a network path on the first, and a path under no mount is not one
    assert is_network_filesystem(root / "local", mounts_file=nfs_root)
    assert not is_network_filesystem(root / "local", mounts_file=no_root)

    # GIVEN a local state directory that is a link to one not made yet on the network mount
    link = root / "state-link"
    link.symlink_to(efs / "not-made-yet")
    # THEN it is on the network mount: the files will be created there, through the link
    assert is_network_filesystem(link, mounts_file=no_root)
    assert is_network_filesystem(link / "projects", mounts_file=no_root)
