"""The soak's figures: one time series per process (RSS), per-batch time and state bytes, each
summarised by its range and its least-squares slope per 10 minutes (flat lines are the target)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MB = 2**20


def slope_per_10min(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, value)`` points, in value per 10 minutes.

    None with fewer than two points or no spread in time.
    """
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    return slope * 600.0


def series(samples: Sequence[dict[str, Any]]) -> dict[str, tuple[str, list[tuple[float, float]]]]:
    """``{name: (unit, [(seconds, value), ...])}`` from the samples, in plot order.

    RSS per process tree (MB; a tree absent from a sample, e.g. the sink between instances, is
    skipped there), the median batch time since the previous sample (s), state bytes (KB), and
    the files under the output's ``_pidfence/`` and ``_delta_log/`` (samples that counted them).
    """
    out: dict[str, tuple[str, list[tuple[float, float]]]] = {}
    names: list[str] = []
    for sample in samples:
        names.extend(n for n in sample["rss"] if n not in names)
    for name in names:
        points = [
            (float(s["t_s"]), s["rss"][name] / MB)
            for s in samples
            if s["rss"].get(name)  # 0: not running at that moment
        ]
        out[f"RSS {name}"] = ("MB", points)
    out["batch time (median)"] = (
        "s",
        [
            (float(s["t_s"]), float(s["batch_s_median"]))
            for s in samples
            if s.get("batch_s_median") is not None
        ],
    )
    out["state bytes"] = ("KB", [(float(s["t_s"]), s["state_bytes"] / 1024) for s in samples])
    for key, name in (("pidfence_files", "_pidfence/"), ("delta_log_files", "_delta_log/")):
        points = [(float(s["t_s"]), float(s[key])) for s in samples if key in s]
        if points:
            out[f"files under {name}"] = ("files", points)
    return out


def figure_rows(samples: Sequence[dict[str, Any]], warmup_s: float = 0.0) -> list[dict[str, Any]]:
    """One row per series: first, last, min, max, slope per 10 min over the run and over its
    second half (after ``warmup_s`` the JVMs have grown their heaps; the second half shows
    whether a line keeps rising)."""
    rows = []
    for name, (unit, points) in series(samples).items():
        if not points:
            continue
        values = [v for _, v in points]
        end = points[-1][0]
        half = [p for p in points if p[0] >= max(warmup_s, end / 2)]
        whole = slope_per_10min([p for p in points if p[0] >= warmup_s])
        second = slope_per_10min(half)
        rows.append(
            {
                "series": name,
                "unit": unit,
                "samples": len(points),
                "first": round(values[0], 2),
                "last": round(values[-1], 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
                "slope/10min": None if whole is None else round(whole, 2),
                "slope/10min 2nd half": None if second is None else round(second, 2),
            }
        )
    return rows


def batch_time_stats(batches: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median, p95 and max of every streaming batch's time (the final drain pass excluded)."""
    times = sorted(
        float(b["seconds"]) for b in batches if b.get("seconds") is not None and b.get("streaming")
    )
    if not times:
        return {}
    return {
        "batches": len(times),
        "median_s": round(times[len(times) // 2], 3),
        "p95_s": round(times[min(len(times) - 1, int(len(times) * 0.95))], 3),
        "max_s": round(times[-1], 3),
    }
