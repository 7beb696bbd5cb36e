"""How far the sink is behind Kafka: the topics' watermarks, asked from the driver.

A call (one per metrics scrape, never per record) is one metadata request per topic and one
watermark request per partition, each with a short timeout, so a scrape is answered even when
Kafka is not. Lag itself is :func:`partition_lag`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

#: (topic, partition) -> (low, high) watermark.
Watermarks = dict[tuple[str, int], tuple[int, int]]

log = logging.getLogger(__name__)


class KafkaWatermarks:
    """Asks Kafka for every partition's watermarks of ``topics``; a callable.

    Args:
        bootstrap: Kafka bootstrap servers.
        topics: the topics the sink reads.
        timeout_s: longest wait for each answer.
    """

    def __init__(self, bootstrap: str, topics: Sequence[str], timeout_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.topics = tuple(topics)
        self.timeout_s = timeout_s
        self._consumer: Any = None

    def __call__(self) -> Watermarks | None:
        """Every partition's watermarks now; None (logged) when Kafka did not answer."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        try:
            if self._consumer is None:
                self._consumer = Consumer(
                    {
                        "bootstrap.servers": self.bootstrap,
                        "group.id": "pidfence-sink-metrics",
                        "enable.auto.commit": False,
                        "log_level": 0,  # a Kafka outage is one warning per scrape, below
                    }
                )
            found: Watermarks = {}
            for topic in self.topics:
                meta = self._consumer.list_topics(topic, timeout=self.timeout_s).topics[topic]
                for partition in sorted(meta.partitions):
                    tp = TopicPartition(topic, partition)
                    low, high = self._consumer.get_watermark_offsets(
                        tp, timeout=self.timeout_s, cached=False
                    )
                    found[(topic, partition)] = (int(low), int(high))
        except KafkaException as exc:
            log.warning("lag unknown: Kafka at %s did not answer (%s)", self.bootstrap, exc)
            return None
        return found

    def close(self) -> None:
        """Close the Kafka client (idempotent)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def partition_lag(
    watermarks: Watermarks,
    next_offsets: Mapping[tuple[str, int], int],
    starts: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Offsets each partition's high watermark is ahead of the next offset the sink reads.

    Args:
        watermarks: Kafka's, now.
        next_offsets: after the newest committed batch that read the partition.
        starts: where the run started reading a partition no committed batch read yet
            (a partition in neither: its low watermark).
    """
    lag = {}
    for tp, (low, high) in watermarks.items():
        nxt = next_offsets.get(tp, starts.get(tp, low))
        lag[tp] = max(0, high - nxt)
    return lag
