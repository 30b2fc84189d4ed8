"""The local dashboard of ``rhumbatron up``: the CloudWatch dashboard's panels, live, on
loopback.

* :mod:`~rhumbatron.dashboard.routes`: :func:`dashboard_router`, the ``/dashboard`` routes
  ``rhumbatron up`` mounts next to the operator API (the cloud API never does).
* :mod:`~rhumbatron.dashboard.summary`: each panel's data, read from the local stack.
* :mod:`~rhumbatron.dashboard.stats`: :class:`LocalRunStats`, the local roles' ticks.
* :mod:`~rhumbatron.dashboard.page`: the page and its script (plain HTML and vanilla JS).

Importing this package imports FastAPI, as :mod:`rhumbatron.api` does.
"""

from __future__ import annotations

from rhumbatron.dashboard.routes import DashboardForbiddenError, dashboard_router
from rhumbatron.dashboard.stats import LocalRunStats, RoleStats
from rhumbatron.dashboard.summary import collect_summary, project_feed

__all__ = [
    "DashboardForbiddenError",
    "LocalRunStats",
    "RoleStats",
    "collect_summary",
    "dashboard_router",
    "project_feed",
]
