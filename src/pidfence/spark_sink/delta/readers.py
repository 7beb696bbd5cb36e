"""Readers of the committed Delta output log and rejects log (only what Delta's log adds).

Any Delta reader sees exactly these rows: ``deltalake.DeltaTable(P).to_pyarrow_table()``,
``polars.read_delta(P)``, ``DeltaTable(P).to_pyarrow_dataset()``, or Spark with the
``delta-spark`` jars (``spark.read.format("delta").load(P)``). The helpers below add pidfence's
sort order, and read what other engines made of the table: columns another writer added come
after the sink's, rows another writer appended are there too (``pidfence verify`` tells them
apart), and a table of the older format reads as today's schema.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pidfence.spark_sink.delta.table import TableKind, open_table, schema_of
from pidfence.spark_sink.schema import conform

_LOG_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
_REJECT_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]


def read_table(
    path: str,
    kind: TableKind,
    where: pc.Expression | None = None,
    *,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """The table's current rows in the sink's schema, with columns others added after it.

    Args:
        path: the table root.
        kind: ``log`` or ``rejects``.
        where: a filter (pushed down to the files' statistics).
    """
    dt = open_table(path, kind, create=False, storage_options=storage_options, reading=True)
    table = dt.to_pyarrow_dataset().to_table(filter=where)
    return conform(table, schema_of(kind), keep_extra=True)


def read_delta_log(path: str, *, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The committed output log, sorted by (topic, partition, log_offset)."""
    return read_table(path, "log", storage_options=storage_options).sort_by(_LOG_ORDER)


def read_delta_rejects(path: str, *, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The committed rejects (with ``verdict``), sorted by (topic, partition, offset).

    Args:
        path: the rejects table's root (the sink's ``rejectsPath``, default ``<path>/_rejects``).
    """
    return read_table(path, "rejects", storage_options=storage_options).sort_by(_REJECT_ORDER)


def log_heads(
    path: str, *, storage_options: dict[str, str] | None = None
) -> dict[tuple[str, int], int]:
    """Next ``log_offset`` per (topic, partition) of the log's current rows."""
    table = read_table(path, "log", storage_options=storage_options)
    table = table.filter(pc.is_valid(table.column("log_offset")))
    if table.num_rows == 0:
        return {}
    grouped = table.group_by(["topic", "partition"]).aggregate([("log_offset", "max")])
    return {
        (str(row["topic"]), int(row["partition"])): int(row["log_offset_max"]) + 1
        for row in grouped.to_pylist()
    }


__all__ = ["log_heads", "read_delta_log", "read_delta_rejects", "read_table"]
