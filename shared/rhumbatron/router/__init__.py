"""The event router: subscriptions over the event streams, claims, project views, failures
and dead letters, nudge and sweep, lag, and the router's housekeeping.

Import from the modules (``router.event_router``, ``router.reports``, ``router.nudge`` …):
this package imports none of them, so a module that needs only the claims does not load the
router.
"""
