"""Spark's own account of each micro-batch (``StreamingQueryProgress``), read from the driver.

The per-batch lines of ``pidfence sink`` and the metrics' batch histograms both read it here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchProgress:
    """What Spark reported for one batch.

    Attributes:
        rows: records the batch read (``numInputRows``).
        seconds: the batch's wall time (``triggerExecution``; None if unknown).
        lag: the Kafka source's ``maxOffsetsBehindLatest`` after the batch (None if unknown).
    """

    rows: int = 0
    seconds: float | None = None
    lag: int | None = None


def progress_by_batch(query: Any) -> dict[int, BatchProgress]:
    """The query's recent progress (Spark keeps the last 100 batches' by default), by batch."""
    out: dict[int, BatchProgress] = {}
    for progress in query.recentProgress:
        data = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
        lags = [
            int(float(value))
            for source in data.get("sources", [])
            if (value := (source.get("metrics") or {}).get("maxOffsetsBehindLatest")) is not None
        ]
        ms = (data.get("durationMs") or {}).get("triggerExecution")
        out[int(data["batchId"])] = BatchProgress(
            int(data.get("numInputRows") or 0),
            None if ms is None else float(ms) / 1000,
            sum(lags) if lags else None,
        )
    return out
