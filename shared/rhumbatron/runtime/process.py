"""The process's runtime for the Lambda roles: one per warm container.

One warm Lambda container is one process, and whichever role it runs it keeps one
:class:`~rhumbatron.runtime.bootstrap.Rhumbatron` between invocations, built on first use from
the ``RHUMBATRON_*`` environment: its NATS connection (on the process's one event loop,
:mod:`rhumbatron.core.event_loop`), its open files, and whether the streams were ensured.
``functions/<role>/app.py`` hands :func:`process_runtime` to its role's ``handle``; the role
calls it once the event is valid.

At the container's first warm invocation the runtime freezes the heap its cold start left
(:func:`~rhumbatron.core.heap.freeze_startup_heap`): the collector then never traverses the
imports and the runtime again, which made each full collection of a router's process cost tens
of milliseconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rhumbatron.core import event_loop
from rhumbatron.core.heap import freeze_startup_heap, thaw_heap

if TYPE_CHECKING:
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["process_runtime", "reset_for_tests"]

_log = logging.getLogger(__name__)


@dataclass
class _Process:
    """What a warm container keeps between invocations."""

    app: Rhumbatron | None = None
    #: Whether the cold start's heap was frozen (at the first warm invocation).
    heap_frozen: bool = False


_process = _Process()


def process_runtime() -> Rhumbatron:
    """The process's runtime, built on first use from the ``RHUMBATRON_*`` environment; at
    the first use after that (the first warm invocation), the heap the cold start left is
    frozen, once."""
    if _process.app is not None and not _process.heap_frozen:
        # Not at the cold start itself: its first invocation still imports the modules of
        # the role's work and opens its files, which belong to the heap to freeze.
        freeze_startup_heap()
        _process.heap_frozen = True
    if _process.app is None:
        from rhumbatron.actors.alarms import NoAlarmSink
        from rhumbatron.runtime.bootstrap import bootstrap

        # No alarm sink in the cloud yet: the publisher's every-minute schedule fires due
        # alarms.
        _process.app = bootstrap(alarms=NoAlarmSink())
    return _process.app


def reset_for_tests() -> None:
    """Forget the process's runtime, as a fresh container would (tests only).

    Closes the actor files, the router's files and the NATS connection on the process's
    loop; the next invocation builds everything again from the environment.
    """
    app, _process.app = _process.app, None
    if _process.heap_frozen:
        thaw_heap()
        _process.heap_frozen = False
    if app is not None:
        try:
            event_loop.run(app.close())
        except Exception as exc:  # a test's server may already be gone: nothing left to drain
            _log.debug("closing the Lambda runtime: %s", exc)
