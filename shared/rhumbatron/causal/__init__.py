"""Causal routing: which Agents wake, and which commands go out, after each fresh Event.

* :mod:`~rhumbatron.causal.overlap` and :mod:`~rhumbatron.causal.rules`: the deterministic
  rules (the spec's flowchart) as pure functions.
* :mod:`~rhumbatron.causal.clef_flash`: Clef-flash, one Claude Haiku call with a forced tool
  call for a prefix-only resource overlap, capped per UTC day, recorded for replays.
* :mod:`~rhumbatron.causal.command_cap`: at most 1,000 counted commands per Change per UTC day.
* :mod:`~rhumbatron.causal.store`: ``<state>/causal.sqlite``, the decisions and the counters.

Importing this package imports neither the ``anthropic`` SDK nor the rules: import the module
you need (``from rhumbatron.causal.clef_flash import ClefFlash``).
"""

from __future__ import annotations

__all__: list[str] = []
