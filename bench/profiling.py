"""Where a ``publish_due`` run spends its time: cProfile of one extra, untimed run."""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

__all__ = ["ProfileRow", "top_rows"]

ProfileRow = dict[str, Any]

#: Frames worth showing: the package, the NATS client, SQLite, pydantic, the event loop's wait.
_INTERESTING = ("rhumbatron", "nats/", "sqlite3", "pydantic", "epoll", "json")


def top_rows(profile: cProfile.Profile, wall_s: float, limit: int = 25) -> list[ProfileRow]:
    """The ``limit`` most expensive interesting functions by cumulative time.

    ``cum_share`` is the function's cumulative time over the profiled run's wall time.
    """
    stats = pstats.Stats(profile)
    total = max(wall_s, 1e-9)
    rows: list[ProfileRow] = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{path}:{line}({name})"
        if not any(marker in where for marker in _INTERESTING):
            continue
        short = where.rsplit("site-packages/", maxsplit=1)[-1].rsplit("shared/", maxsplit=1)[-1]
        rows.append(
            {
                "function": short,
                "calls": calls,
                "tottime_s": round(tottime, 4),
                "cumtime_s": round(cumtime, 4),
                "cum_share": round(cumtime / total, 3),
            }
        )
    rows.sort(key=lambda row: row["cumtime_s"], reverse=True)
    return rows[:limit]


def format_rows(rows: list[ProfileRow], total_s: float) -> str:
    """The profile rows as a plain-text table."""
    lines = [
        f"cProfile of one publish_due run ({total_s:.2f} s profiled wall time)",
        f"{'cum s':>7}  {'wall%':>5}  {'self s':>7}  {'calls':>7}  function",
    ]
    for row in rows:
        lines.append(
            f"{row['cumtime_s']:>7.3f}  {row['cum_share']:>5.0%}  {row['tottime_s']:>7.3f}  "
            f"{row['calls']:>7}  {row['function']}"
        )
    return "\n".join(lines)
