"""The event router: subscriptions over the event streams, claims, project views, failures
and dead letters, nudge and sweep, lag, and the router's housekeeping."""

from rhumbatron.router.event_router import EventRouter, RunReport, SubscriptionReport, SweepReport
from rhumbatron.router.nudge import InProcessNudge
from rhumbatron.router.project_view import ProjectView

__all__ = [
    "EventRouter",
    "InProcessNudge",
    "ProjectView",
    "RunReport",
    "SubscriptionReport",
    "SweepReport",
]
