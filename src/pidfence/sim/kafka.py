"""The simulated Kafka topic: append-only partitions that accept everything (at-least-once)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as Kafka stores it (``header`` is the raw ``pf`` value or None)."""

    offset: int
    header: bytes | None
    key: bytes
    value: bytes
    ts_ms: int


class SimKafka:
    """One topic with ``partitions`` partitions."""

    def __init__(self, partitions: int) -> None:
        self.partitions: list[list[KafkaRecord]] = [[] for _ in range(partitions)]

    def append(
        self, partition: int, header: bytes | None, key: bytes, value: bytes, ts_ms: int
    ) -> int:
        """Append one record; returns its offset."""
        log = self.partitions[partition]
        log.append(KafkaRecord(len(log), header, key, value, ts_ms))
        return len(log) - 1
