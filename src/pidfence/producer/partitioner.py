"""Partition choice: cached partition counts, Kafka's murmur2 for keys, sticky unkeyed records.

The producer picks each record's partition itself, because it must know which seq counter to
advance before the record is handed to librdkafka.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import confluent_kafka

from pidfence.producer.blocking import may_block
from pidfence.producer.errors import BrokerUnavailable, UnknownPartition, UnknownTopic
from pidfence.producer.murmur2 import key_partition


def partition_count(
    list_topics: Callable[..., Any], bootstrap: str, topic: str, timeout_s: float = 10.0
) -> int:
    """Partitions of ``topic`` from a metadata request (``list_topics``: a Kafka client's).

    Raises:
        UnknownTopic: the topic does not exist.
        BrokerUnavailable: no broker answered within the timeout.
    """
    try:
        meta = list_topics(topic, timeout=timeout_s)
    except confluent_kafka.KafkaException as exc:
        raise BrokerUnavailable(
            f"no Kafka broker at {bootstrap} answered a metadata request "
            f"({exc}); check --bootstrap and that Kafka runs, then retry"
        ) from exc
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise UnknownTopic(topic)
    return len(info.partitions)


class Partitioner:
    """Partition counts from metadata (fetched once per topic) and the partition of a record.

    Unkeyed records are sticky: ``sticky_records`` to one partition, then the next one. That
    position per topic (:meth:`sticky_state`) and the number the first partition derives from
    (``seed``: the lineage's first pid) go into every checkpoint and are restored on resume
    (:meth:`restore`), so a replay from a checkpoint puts each record where the first run did.

    Args:
        list_topics: ``confluent_kafka.Producer.list_topics``.
        bootstrap: for error messages.
        timeout_s: metadata wait at the first use of a topic.
        sticky_records: unkeyed records per partition before moving on round-robin.
    """

    def __init__(
        self,
        list_topics: Callable[..., Any],
        bootstrap: str,
        timeout_s: float,
        sticky_records: int,
    ) -> None:
        self._list_topics = list_topics
        self._bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._sticky_records = sticky_records
        self.counts: dict[str, int] = {}
        self._sticky: dict[str, list[int]] = {}  # topic -> [partition, records left]
        #: A topic's first unkeyed record goes to ``seed % partitions`` (0: the pid's own).
        self.seed = 0

    def count(self, topic: str) -> int:
        """Partitions of ``topic`` (cached after the first call).

        Raises:
            UnknownTopic: the topic does not exist.
            BrokerUnavailable: no broker answered within the timeout.
        """
        count = self.counts.get(topic)
        if count is not None:
            return count
        may_block()
        self.counts[topic] = count = partition_count(
            self._list_topics, self._bootstrap, topic, self._timeout_s
        )
        return count

    def pick(self, topic: str, key: bytes | None, pid: int) -> int:
        """The partition of a record without an explicit one (murmur2 of the key, else sticky).

        Unkeyed records start at ``seed % partitions`` (``pid`` when no seed is set) so many
        producers of one topic do not all begin on partition 0.
        """
        count = self.count(topic)
        if key is not None:
            return key_partition(key, count)
        sticky = self._sticky.get(topic)
        if sticky is None:
            sticky = self._sticky[topic] = [(self.seed or pid) % count, self._sticky_records]
        elif sticky[1] <= 0:
            sticky[0] = (sticky[0] + 1) % count
            sticky[1] = self._sticky_records
        sticky[1] -= 1
        return sticky[0]

    def sticky_state(self, unpicked: str | None = None) -> dict[str, tuple[int, int]]:
        """Each topic's sticky position: (partition, records left before moving on).

        ``unpicked``: a topic whose last unkeyed pick belongs to a record not handed over yet
        (a rollover comes first): its position as it was before that pick. A pick that moved
        on from partition ``p - 1`` with no records left leads to the same next pick as the
        topic's first one, so one step back is ``(p - 1, 0)`` in both cases.
        """
        state = {topic: (p, left) for topic, (p, left) in self._sticky.items()}
        if unpicked is not None and unpicked in state:
            p, left = state[unpicked]
            if left + 1 < self._sticky_records:
                state[unpicked] = (p, left + 1)
            else:
                state[unpicked] = ((p - 1) % self.counts[unpicked], 0)
        return state

    def restore(self, state: Mapping[str, tuple[int, int]], seed: int) -> None:
        """Continue a checkpoint's sticky positions and seed (see :meth:`sticky_state`)."""
        self.seed = seed
        self._sticky = {topic: [p, left] for topic, (p, left) in state.items()}

    def check(self, topic: str, partition: int) -> None:
        """Raise :class:`UnknownPartition` unless ``partition`` exists in ``topic``."""
        count = self.counts.get(topic)
        if count is None:
            count = self.count(topic)
        if not 0 <= partition < count:
            raise UnknownPartition(
                f"partition {partition} does not exist in {topic!r}: it has {count} "
                f"partitions (0..{count - 1}); produce to one of them or add partitions"
            )
