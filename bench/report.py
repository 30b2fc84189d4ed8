"""Figures, ratios and targets of a benchmark run; the printed tables and ``results.json``.

A figure's headline value is the median of its repeats. A ratio pairs the two figures'
samples repeat by repeat (the runs of one repeat ran back to back, so they saw the same
machine) and its headline is the median of those paired ratios: a burst of load from another
process slows both sides of a pair and leaves the ratio mostly intact.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Figure", "Ratio", "format_figures", "format_ratios"]


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured quantity and its repeated samples; the headline is their median."""

    name: str
    unit: str
    description: str
    samples: tuple[float, ...]

    @property
    def value(self) -> float:
        """The headline: the median of the samples."""
        return float(statistics.median(self.samples))

    def as_json(self) -> dict[str, Any]:
        """The figure as written to ``results.json``."""
        return {
            "name": self.name,
            "value": _round(self.value),
            "unit": self.unit,
            "statistic": f"median of {len(self.samples)}",
            "samples": [_round(s) for s in self.samples],
            "min": _round(min(self.samples)),
            "max": _round(max(self.samples)),
            "description": self.description,
        }


@dataclass(frozen=True, slots=True)
class Ratio:
    """``numerator / denominator`` paired per repeat, with an optional target floor."""

    name: str
    numerator: Figure
    denominator: Figure
    target: float | None = None

    @property
    def samples(self) -> tuple[float, ...]:
        """One ratio per repeat: the two figures' samples of that repeat, divided."""
        return tuple(
            n / d for n, d in zip(self.numerator.samples, self.denominator.samples, strict=True)
        )

    @property
    def value(self) -> float:
        """The headline: the median of the per-repeat ratios."""
        return float(statistics.median(self.samples))

    @property
    def status(self) -> str:
        """``PASS`` / ``MISS`` against the target; ``-`` when the ratio has none."""
        if self.target is None:
            return "-"
        return "PASS" if self.value >= self.target else "MISS"

    def as_json(self) -> dict[str, Any]:
        """The ratio as written to ``results.json``."""
        return {
            "name": self.name,
            "value": round(self.value, 3),
            "statistic": f"median of {len(self.samples)} per-repeat ratios",
            "samples": [round(s, 3) for s in self.samples],
            "ratio_of_medians": round(self.numerator.value / self.denominator.value, 3),
            "numerator": self.numerator.name,
            "denominator": self.denominator.name,
            "target_at_least": self.target,
            "status": self.status,
        }


def _round(value: float) -> float:
    return round(value, 1) if abs(value) >= 100 else round(value, 2)


def _show(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def format_figures(title: str, figures: Sequence[Figure]) -> str:
    """A plain-text table of figures: name, median, unit, every sample."""
    width = max(len(title), *(len(f.name) for f in figures))
    lines = [f"{title:<{width}}  {'median':>8}  {'unit':<9}  samples", "-" * (width + 60)]
    for figure in figures:
        samples = ", ".join(_show(s) for s in figure.samples)
        lines.append(
            f"{figure.name:<{width}}  {_show(figure.value):>8}  {figure.unit:<9}  {samples}"
        )
    return "\n".join(lines)


def format_ratios(ratios: Sequence[Ratio]) -> str:
    """A plain-text table of ratios with their targets and PASS / MISS."""
    width = max(len("ratio"), *(len(r.name) for r in ratios))
    lines = [
        f"{'ratio':<{width}}  {'median':>7}  {'target':<7}  {'status':<6}  per repeat",
        "-" * (width + 60),
    ]
    for ratio in ratios:
        target = "-" if ratio.target is None else f">= {ratio.target:g}"
        samples = ", ".join(f"{s:.2f}" for s in ratio.samples)
        lines.append(
            f"{ratio.name:<{width}}  {ratio.value:>6.2f}x  {target:<7}  {ratio.status:<6}  "
            f"{samples}"
        )
    return "\n".join(lines)
