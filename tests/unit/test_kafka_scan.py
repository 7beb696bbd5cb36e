"""The recovery scan's reader over a scripted consumer: which raw records it feeds the scan
state (from the checkpoint's time up to the resume's FENCE, or the partition's end), and which
client settings its consumer inherits from the producer's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from pidfence.producer.kafka_scan import KafkaScanner, consumer_conf
from tests.unit.kafka_kit import Message

EOF_ERROR = confluent_kafka.KafkaError(confluent_kafka.KafkaError._PARTITION_EOF)


@dataclass
class PartitionEnd(Message):
    """The event a consumer with ``enable.partition.eof`` returns at a partition's end."""

    def error(self) -> Any:
        return EOF_ERROR


@dataclass
class ScriptedConsumer:
    """A consumer over ``log`` (topic, partition, offset per record) whose time lookup answers
    ``starts`` and whose partitions end at ``high``."""

    log: list[Message]
    starts: dict[tuple[str, int], int]
    high: int
    queue: list[Message] = field(default_factory=list)
    low: int = 0

    def offsets_for_times(self, wanted: list[Any], timeout: float) -> list[Any]:
        return [
            confluent_kafka.TopicPartition(
                tp.topic, tp.partition, self.starts[tp.topic, tp.partition]
            )
            for tp in wanted
        ]

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return self.low, self.high

    def assign(self, parts: list[Any]) -> None:
        for part in parts:
            self.queue += [
                m
                for m in self.log
                if (m.topic(), m.partition()) == (part.topic, part.partition)
                and m.offset() >= part.offset
            ]
            self.queue.append(PartitionEnd(part.topic, part.partition, self.high))

    def poll(self, timeout: float) -> Message | None:
        return self.queue.pop(0) if self.queue else None

    def close(self) -> None:
        pass


def record(partition: int, offset: int) -> Message:
    """A record of topic ``t`` whose key is its offset (so a test sees which ones were read)."""
    return Message("t", partition, offset, key_=offset)


class NotedOffsets:
    """A scan state that keeps the (partition, offset) of each record fed to it."""

    def __init__(self) -> None:
        self.noted: list[tuple[int, int]] = []
        self.deleted_heads: list[Any] = []

    def head_deleted(self, tp: Any) -> None:
        self.deleted_heads.append(tp)

    def note(self, tp: Any, headers: Any, ts_ms: int, key: Any, value: Any) -> None:
        self.noted.append((tp[1], key))


def scan(log: list[Message], until: dict[tuple[str, int], int]) -> list[tuple[int, int]]:
    consumer = ScriptedConsumer(log, {("t", 0): 2, ("t", 1): 2}, high=9)
    state = NotedOffsets()
    KafkaScanner({}, timeout_s=1, consumer_factory=lambda conf: consumer)(
        state, [("t", 0), ("t", 1)], 0, until
    )
    return state.noted


def test_the_scan_reads_from_the_checkpoints_time_to_the_fence_or_the_partitions_end() -> None:
    log = [record(p, offset) for p in (0, 1) for offset in range(9)]
    assert scan(log, {("t", 0): 5}) == [(0, 2), (0, 3), (0, 4), *((1, n) for n in range(2, 9))]


def test_a_record_at_the_scans_end_is_not_read_after_an_offset_gap() -> None:
    # Offset 4 holds a transaction marker (no record); 5 is past the resume's FENCE.
    log = [record(0, offset) for offset in (2, 3, 5, 6)]
    assert scan(log, {("t", 0): 5, ("t", 1): 2}) == [(0, 2), (0, 3)]


def _deleted_heads(starts: dict[tuple[str, int], int], low: int) -> list[Any]:
    """The partitions whose scan reported a deleted head, on a log of offsets 2..8."""
    log = [record(p, offset) for p in (0, 1) for offset in range(2, 9)]
    consumer = ScriptedConsumer(log, starts, high=9, low=low)
    state = NotedOffsets()
    KafkaScanner({}, timeout_s=1, consumer_factory=lambda conf: consumer)(
        state, list(starts), 0, {}
    )
    return state.deleted_heads


def test_a_scan_that_starts_at_the_first_offset_retention_left_says_so() -> None:
    # Offsets 0..1 were deleted: the checkpoint's time maps to offset 2 on partition 0, the first
    # left, so the pid's records there may have gone; on partition 1 it maps past it.
    assert _deleted_heads({("t", 0): 2, ("t", 1): 4}, low=2) == [("t", 0)]
    # Retention moved on between the time lookup and the watermark's: below the first offset.
    assert _deleted_heads({("t", 0): 1}, low=2) == [("t", 0)]
    # Nothing deleted (the log starts at 0): a scan from the start has seen everything.
    assert _deleted_heads({("t", 0): 0}, low=0) == []


def test_the_scans_consumer_keeps_the_producers_connection_and_security_settings() -> None:
    producer = {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "copier",
        "ssl.ca.location": "/ca.pem",
        "client.id": "orders",
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": False,
    }
    assert consumer_conf(producer) == {
        k: v for k, v in producer.items() if k not in ("acks", "linger.ms", "enable.idempotence")
    }
