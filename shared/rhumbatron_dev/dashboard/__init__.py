"""The local dashboard of ``rhumbatron up``: the CloudWatch dashboard's panels, live, on
loopback.

* :mod:`~rhumbatron_dev.dashboard.routes`: :func:`dashboard_router`, the ``/dashboard`` routes
  ``rhumbatron up`` mounts next to the operator API (the cloud API never does).
* :mod:`~rhumbatron_dev.dashboard.summary`: each panel's data, read from the local stack.
* :mod:`~rhumbatron_dev.dashboard.stats`: :class:`LocalRunStats`, the local roles' ticks.
* :mod:`~rhumbatron_dev.dashboard.page`: the page and its script (plain HTML and vanilla JS).

Importing this package imports FastAPI, as :mod:`rhumbatron.api` does.
"""

from __future__ import annotations

from rhumbatron_dev.dashboard.routes import DashboardForbiddenError, dashboard_router
from rhumbatron_dev.dashboard.stats import LocalRunStats, RoleStats
from rhumbatron_dev.dashboard.summary import collect_summary, project_feed

__all__ = [
    "DashboardForbiddenError",
    "LocalRunStats",
    "RoleStats",
    "collect_summary",
    "dashboard_router",
    "project_feed",
]
