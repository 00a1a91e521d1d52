"""Small statistics helpers (no numpy needed for a handful of samples)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float], unit: str, higher_is_better: bool) -> dict[str, object]:
    """The record stored per metric: median, p90, p99, mean, max, and the raw samples."""
    return {
        "median": median(values),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else None,
        "max": max(values) if values else None,
        "n": len(values),
        "unit": unit,
        "higher_is_better": higher_is_better,
        "samples": [round(v, 6) for v in values],
    }
