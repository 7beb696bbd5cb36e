"""Readers of the committed Delta output log and rejects log (only what Delta's log adds).

Any Delta reader sees exactly these rows: ``deltalake.DeltaTable(P).to_pyarrow_table()``,
``polars.read_delta(P)``, ``DeltaTable(P).to_pyarrow_dataset()``, or Spark with the
``delta-spark`` jars (``spark.read.format("delta").load(P)``). The helpers below add pidfence's
sort order and the per-partition reads that rebuild producer state from the committed output.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import DeltaTable

from pidfence.spark_sink.delta_table import (
    REJECTS_PUBLIC_SCHEMA,
    TableKind,
    open_table,
    schema_of,
)

_LOG_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
_REJECT_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("kafka_offset", "ascending")]


def _dataset(dt: DeltaTable) -> pds.Dataset:
    return dt.to_pyarrow_dataset()


def _read(
    path: str,
    kind: TableKind,
    where: pc.Expression | None,
    columns: list[str] | None,
    storage_options: dict[str, str] | None,
) -> pa.Table:
    dt = open_table(path, kind, create=False, storage_options=storage_options)
    schema = schema_of(kind)
    names = columns or schema.names
    table = _dataset(dt).to_table(columns=names, filter=where)
    return table.cast(pa.schema([schema.field(n) for n in names]))


def read_delta_log(path: str, *, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The committed output log, sorted by (topic, partition, log_offset)."""
    return _read(path, "log", None, None, storage_options).sort_by(_LOG_ORDER)


def read_delta_rejects(path: str, *, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The committed rejects (with ``verdict``), sorted by (topic, partition, kafka_offset).

    Args:
        path: the rejects table's root (the sink's ``rejectsPath``, default ``<path>/_rejects``).
    """
    names = REJECTS_PUBLIC_SCHEMA.names
    return _read(path, "rejects", None, names, storage_options).sort_by(_REJECT_ORDER)


def _partition(topic: str, partition: int) -> pc.Expression:
    return (pc.field("topic") == topic) & (pc.field("partition") == partition)


def log_rows_from(
    path: str,
    topic: str,
    partition: int,
    log_offset: int,
    *,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """One partition's committed log rows at or after ``log_offset``, in log order.

    What a state roll-forward replays: everything appended after the snapshot's ``next_log``.
    Files are pruned by their min/max statistics, so only the newest files are read.
    """
    where = _partition(topic, partition) & (pc.field("log_offset") >= log_offset)
    return _read(path, "log", where, None, storage_options).sort_by("log_offset")


def rejects_from(
    path: str,
    topic: str,
    partition: int,
    after_kafka_offset: int,
    verdicts: list[str] | None = None,
    *,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """One partition's committed rejects after ``after_kafka_offset`` (optionally of some verdicts),
    with every column of the rejects table (``pf`` and ``batch`` too)."""
    where = _partition(topic, partition) & (pc.field("kafka_offset") > after_kafka_offset)
    if verdicts is not None:
        where = where & pc.field("verdict").isin(verdicts)
    return _read(path, "rejects", where, None, storage_options).sort_by("kafka_offset")


def log_heads(
    path: str, *, storage_options: dict[str, str] | None = None
) -> dict[tuple[str, int], int]:
    """Next ``log_offset`` per (topic, partition) of the committed log (reads three columns)."""
    table = _read(path, "log", None, ["topic", "partition", "log_offset"], storage_options)
    if table.num_rows == 0:
        return {}
    grouped = table.group_by(["topic", "partition"]).aggregate([("log_offset", "max")])
    return {
        (str(row["topic"]), int(row["partition"])): int(row["log_offset_max"]) + 1
        for row in grouped.to_pylist()
    }
