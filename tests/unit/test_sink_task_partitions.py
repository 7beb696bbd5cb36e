"""A task's rows cut into Kafka partitions (``writer.kafka_partitions``): one partition, or
several whole ones when the stream is coalesced, however Spark chunks them into Arrow batches."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pidfence.spark_sink.errors import SplitPartitionError
from pidfence.spark_sink.writer import kafka_partitions


def rows(keys: list[tuple[str, int]]) -> pa.Table:
    """Kafka-shaped rows, one per key, offsets counting up per key, plus a column Spark's
    Kafka source does not give (dropped)."""
    offsets: dict[tuple[str, int], int] = {}
    offset = []
    for key in keys:
        offset.append(offsets.get(key, 0))
        offsets[key] = offset[-1] + 1
    return pa.table(
        {
            "topic": pa.array([t for t, _ in keys], pa.string()),
            "partition": pa.array([p for _, p in keys], pa.int32()),
            "offset": pa.array(offset, pa.int64()),
            "extra": pa.array([0] * len(keys), pa.int8()),
        }
    )


def cut(table: pa.Table, chunk: int) -> list[tuple[str, int, list[int]]]:
    return [
        (topic, partition, part.column("offset").to_pylist())
        for topic, partition, part in kafka_partitions(iter(table.to_batches(chunk)))
    ]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 100])
def test_consecutive_partitions_come_out_whole_whatever_the_arrow_chunks(chunk: int) -> None:
    keys = [("a", 0)] * 4 + [("a", 3)] * 3 + [("b", 3)] * 2 + [("b", 0)]
    assert cut(rows(keys), chunk) == [
        ("a", 0, [0, 1, 2, 3]),
        ("a", 3, [0, 1, 2]),
        ("b", 3, [0, 1]),
        ("b", 0, [0]),
    ]


def test_only_the_kafka_columns_are_kept_and_empty_chunks_are_skipped() -> None:
    table = rows([("a", 0), ("a", 0)])
    empty = pa.RecordBatch.from_pylist([], schema=table.schema)
    ((_, _, part),) = list(kafka_partitions(iter([empty, *table.to_batches(), empty])))
    assert part.column_names == ["topic", "partition", "offset"]
    assert list(kafka_partitions(iter([]))) == []


def test_a_partition_whose_rows_come_back_after_another_is_refused() -> None:
    # A shuffle (repartition) interleaves partitions; publishing either half would split it.
    keys = [("a", 0), ("a", 1), ("a", 0)]
    with pytest.raises(SplitPartitionError, match=r"a\[0\] are not consecutive"):
        cut(rows(keys), 100)
