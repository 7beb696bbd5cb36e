"""Read a whole Kafka topic into an Arrow table (the raw side of the demo's comparison)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pidfence.wire import PF_HEADER_KEY

RAW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("pf", pa.binary()),
    ]
)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> pa.Table:
    """Every record now in ``topic`` (offsets from low to high watermark), with its ``pf`` header.

    Args:
        bootstrap: Kafka bootstrap servers.
        topic: the topic.
        timeout_s: give up (``TimeoutError``) when the records do not arrive in this time.
    """
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer: Any = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"pidfence-demo-read-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        ends: dict[int, int] = {}
        assignment = []
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high > low:
                ends[partition] = high
                assignment.append(TopicPartition(topic, partition, low))
        rows: dict[str, list[Any]] = {name: [] for name in RAW_SCHEMA.names}
        if assignment:
            consumer.assign(assignment)
        pending = dict(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} incomplete")
            for msg in consumer.consume(num_messages=5000, timeout=1.0):
                if msg.error() is not None:
                    continue
                partition, offset = msg.partition(), msg.offset()
                if offset >= ends[partition]:
                    continue
                headers = dict(msg.headers() or [])
                rows["topic"].append(topic)
                rows["partition"].append(partition)
                rows["kafka_offset"].append(offset)
                rows["timestamp"].append(msg.timestamp()[1])
                rows["key"].append(msg.key())
                rows["value"].append(msg.value())
                rows["pf"].append(headers.get(PF_HEADER_KEY))
                if offset + 1 >= ends[partition]:
                    pending.pop(partition, None)
        return pa.table(rows, schema=RAW_SCHEMA)
    finally:
        consumer.close()
