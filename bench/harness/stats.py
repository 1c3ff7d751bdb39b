"""Latency statistics as the benchmarks' JSON records them: percentiles, maximum and mean in ms."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def timing_stats(samples_s: Sequence[float], points: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """``n``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``p999_ms`` (one key per point, the dot dropped),
    ``max_ms`` and ``mean_ms`` of samples given in seconds."""
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    out: dict[str, float] = {"n": len(a)}
    for q in points:
        out[f"p{q:g}_ms".replace(".", "")] = float(np.percentile(a, q))
    out["max_ms"] = float(a.max())
    out["mean_ms"] = float(a.mean())
    return out
