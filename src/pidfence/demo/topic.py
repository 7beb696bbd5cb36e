"""Read a whole Kafka topic into an Arrow table (the raw side of the demo's comparison)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pidfence.services.kafka import create_topic
from pidfence.spark_sink.schema import PLACE_FIELDS, WRITER_FIELDS
from pidfence.wire import PF_HEADER_KEY

RAW_SCHEMA = pa.schema(
    [
        *PLACE_FIELDS,
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("pf", pa.binary()),
        *WRITER_FIELDS,
        ("flags", pa.int64()),
    ]
)


def _decoded(header: bytes | None) -> tuple[int, int, int, int]:
    """(pid, generation, seq, flags); zeros for a missing or undecodable header."""
    from pidfence.wire import MalformedHeader, decode_pf

    if header is None:
        return 0, 0, 0, 0
    try:
        pf = decode_pf(header)
    except MalformedHeader:
        return 0, 0, 0, 0
    return pf.pid, pf.generation, pf.seq, pf.flags


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> pa.Table:
    """Every record now in ``topic`` (offsets from low to high watermark), with its ``pf`` header
    raw and decoded (``pid``, ``generation``, ``seq``, ``flags``; 0 when missing or malformed).

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
                rows["offset"].append(offset)
                rows["timestamp"].append(msg.timestamp()[1])
                rows["key"].append(msg.key())
                rows["value"].append(msg.value())
                header = headers.get(PF_HEADER_KEY)
                rows["pf"].append(header)
                fields = _decoded(header)
                for name, field in zip(("pid", "generation", "seq", "flags"), fields, strict=True):
                    rows[name].append(field)
                if offset + 1 >= ends[partition]:
                    pending.pop(partition, None)
        return pa.table(rows, schema=RAW_SCHEMA)
    finally:
        consumer.close()


#: What pidfence sets on the raw topics it creates: the broker stamps each record's time, so a
#: certificate's expiry is judged at the append time, not at a time the writer chose.
RAW_TOPIC_CONFIG: dict[str, str] = {"message.timestamp.type": "LogAppendTime"}


def create_raw_topic(bootstrap: str, name: str, partitions: int, replication: int = 1) -> str:
    """Create a raw topic (:data:`RAW_TOPIC_CONFIG`) and wait for its leaders."""
    return create_topic(bootstrap, name, partitions, replication, dict(RAW_TOPIC_CONFIG))
