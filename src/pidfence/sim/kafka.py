"""The simulated Kafka topic: append-only partitions that accept everything (at-least-once)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as Kafka stores it (``header``, ``cert``: raw ``pf``, ``pfc`` values or None)."""

    offset: int
    header: bytes | None
    key: bytes
    value: bytes
    ts_ms: int
    cert: bytes | None = None


class SimKafka:
    """One topic with ``partitions`` partitions."""

    def __init__(self, partitions: int) -> None:
        self.partitions: list[list[KafkaRecord]] = [[] for _ in range(partitions)]
        # Kafka's time index: the largest timestamp up to each offset (non-decreasing).
        self._max_ts: list[list[int]] = [[] for _ in range(partitions)]

    def offset_for_time(self, partition: int, ts_ms: int) -> int:
        """The first offset whose record (or an earlier one) has a timestamp >= ``ts_ms``, as
        Kafka's ``offsets_for_times`` finds it: every record before it is older."""
        return bisect.bisect_left(self._max_ts[partition], ts_ms)

    def append(
        self,
        partition: int,
        header: bytes | None,
        key: bytes,
        value: bytes,
        ts_ms: int,
        cert: bytes | None = None,
    ) -> int:
        """Append one record; returns its offset."""
        log = self.partitions[partition]
        log.append(KafkaRecord(len(log), header, key, value, ts_ms, cert))
        times = self._max_ts[partition]
        times.append(max(times[-1], ts_ms) if times else ts_ms)
        return len(log) - 1
