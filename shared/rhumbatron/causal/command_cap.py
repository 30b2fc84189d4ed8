"""The 1,000-command cap: at most so many counted commands per Change per UTC day.

The spec counts exactly ``change.dispatch``, ``candidate.create``, ``change.settle`` and
``agent.wake`` (``COMMAND_TYPES[...].counts_toward_change_cap``); ``index.build`` and
``candidates.recompose`` are not counted, and neither is a command without a Change. The
wakes caused by ``canonical.advanced`` count like any other (DECISIONS "Caps and causal
routing"). It is a circuit breaker against a routing loop, not a quota: a Change that reaches
it is misbehaving, so each dropped command is logged as an **error** naming the Change, the
type and the cap, and counted (in ``change_command_counts.dropped`` and as a
``commands_dropped_by_cap`` data point for the ``METRICS`` binding).

The count is kept in :class:`~rhumbatron.causal.store.CausalStore` and moves by one
conditional upsert per command, so two routers admitting at once never exceed the cap.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from rhumbatron.causal.store import CausalStore, CommandCount
from rhumbatron.core.clock import utc_day
from rhumbatron.core.settings import Settings
from rhumbatron.metrics.platform_metrics import DataPoint
from rhumbatron.protocol.command_types import command_type_spec

if TYPE_CHECKING:
    from rhumbatron.metrics.recorder import MetricsRecorder
    from rhumbatron.protocol.envelopes import Command

__all__ = ["DROPPED_METRIC", "CommandCap"]

logger = logging.getLogger(__name__)

#: The data point each dropped command yields.
DROPPED_METRIC = "commands_dropped_by_cap"


class CommandCap:
    """Admits or drops counted commands per Change per UTC day (see the module docstring).

    ``metrics``, when given, records a ``commands_dropped_by_cap`` point for each drop; the
    drop is counted in the store either way (:meth:`count`).
    """

    def __init__(
        self, settings: Settings, store: CausalStore, *, metrics: MetricsRecorder | None = None
    ) -> None:
        self._settings = settings
        self._store = store
        self._metrics = metrics

    @property
    def limit(self) -> int:
        """Counted commands a Change may send per UTC day."""
        return self._settings.change_command_cap_per_day

    def admit(
        self,
        change_id: str | None,
        command_type: str,
        now: datetime,
        *,
        command_id: str | None = None,
    ) -> bool:
        """Whether a ``command_type`` command of ``change_id`` may go out at ``now``.

        True without counting for a type the cap does not count, or without a Change.
        Otherwise one atomic increment of the Change's count for ``now``'s UTC day; past the
        cap the command is dropped: False, an ERROR log line and a counted drop. With a
        ``command_id``, asking again for the same command on the same day (a redelivered
        Event) returns the first answer and counts nothing. Raises
        :class:`~rhumbatron.errors.UnknownTypeError` for a type not in ``COMMAND_TYPES``.
        """
        spec = command_type_spec(command_type)
        if not spec.counts_toward_change_cap or change_id is None:
            return True
        day = utc_day(now)
        admitted, first_time = self._store.admit_command(day, change_id, self.limit, command_id)
        if not admitted and first_time:
            logger.error(
                "dropped %s command %s of Change %s: the cap of %d commands per Change per "
                "UTC day is reached for %s; the Change is likely looping, inspect its events",
                command_type,
                command_id or "(no id)",
                change_id,
                self.limit,
                day,
            )
            if self._metrics is not None:
                self._metrics.record([self.dropped_point(command_type, command_id)])
        return admitted

    def admit_command(self, command: Command, now: datetime) -> bool:
        """:meth:`admit` for a :class:`~rhumbatron.protocol.envelopes.Command` envelope."""
        return self.admit(
            command.change_id, command.command_type, now, command_id=command.command_id
        )

    def count(self, change_id: str, day: str) -> CommandCount:
        """Admitted and dropped counted commands of ``change_id`` on UTC ``day``."""
        return self._store.command_count(day, change_id)

    @staticmethod
    def dropped_point(command_type: str, command_id: str | None = None) -> DataPoint:
        """The ``commands_dropped_by_cap`` point of one drop (keyed by command ID if any)."""
        return DataPoint(
            name=DROPPED_METRIC,
            # Not the Change as a dimension: each value would be a CloudWatch metric of its
            # own. The ERROR log line names the Change.
            dimensions={"command_type": command_type},
            event_id=command_id,
        )
