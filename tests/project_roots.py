"""Project roots for tests that put events straight onto the streams.

The router checks an event's tenant against its project's root actor, and refuses an event
whose project has no root here, on every subscription and in the replays (issue #21). Tests
that publish hand-made events create their projects first, as the API would, through this one
helper; a test that rebuilds views in a fresh state directory restores the roots first, as
docs/security.md tells an operator to.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from contextlib import closing

from rhumbatron.actors.project_root import ProjectRoot
from rhumbatron.domain.facts import Caller
from rhumbatron.protocol.envelopes import Event
from rhumbatron.runtime.bootstrap import Rhumbatron


def ensure_project_roots(app: Rhumbatron, events: Iterable[Event]) -> None:
    """Create the root of every project ``events`` name, for the tenant they carry, unless
    it exists (a project's ``project.created`` goes to its outbox, not to a stream)."""
    for project_id, tenant_id in sorted({(e.project_id, e.tenant_id) for e in events}):
        if app.project_tenant(project_id) is None:
            owner = Caller(tenant_id, "user:test", f"corr-root-{project_id}")
            app.project_root(project_id).create_project(owner, name=project_id)


def restore_project_roots(backup: Rhumbatron, into: Rhumbatron, project_ids: Iterable[str]) -> None:
    """Restore the roots of ``project_ids`` from ``backup``'s state directory into ``into``'s,
    through SQLite's backup API (a plain file copy would miss what the WAL holds)."""
    for project_id in project_ids:
        ref = ProjectRoot.ref_for(project_id)
        target = ref.path(into.settings.state_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        with (
            closing(sqlite3.connect(ref.path(backup.settings.state_dir))) as source,
            closing(sqlite3.connect(target)) as copy,
        ):
            source.backup(copy)
