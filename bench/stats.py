"""Percentiles and printing for the benchmarks."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest-rank."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(values: list[float]) -> dict[str, float]:
    """n, p50, p99 and max, in the values' unit."""
    return {
        "n": len(values),
        "p50": statistics.median(values),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def line(label: str, values_ms: list[float], baseline_ms: float | None = None) -> str:
    """One printed row: p50/p99 in ms, and the p50 as a ratio to the baseline."""
    s = summary(values_ms)
    ratio = f"  p50 = {s['p50'] / baseline_ms:5.1f}x baseline" if baseline_ms else ""
    return (
        f"{label:<48} n={s['n']:<4} p50={s['p50']:7.2f} ms  p99={s['p99']:7.2f} ms"
        f"  max={s['max']:7.2f} ms{ratio}"
    )


def cell(values_ms: list[float]) -> str:
    """A table cell: p50 and p99 in ms."""
    s = summary(values_ms)
    return f"p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms"


def ratio(ours_ms: list[float], baseline_ms: list[float]) -> float:
    """Our p50 over the baseline's p50."""
    return float(statistics.median(ours_ms) / statistics.median(baseline_ms))
