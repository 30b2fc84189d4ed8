"""Project roots for tests that put events straight onto the streams.

The router checks an event's tenant against its project's root actor (issue #21), and the
reactions refuse an event whose project has no root here. Tests that publish hand-made
events create their projects first, as the API would, through this one helper.
"""

from __future__ import annotations

from collections.abc import Iterable

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
