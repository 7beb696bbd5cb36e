"""Batches written and committed the way the sink's output does it, for the Delta layer's tests:
a task's data file per partition under ``data/QUERY/BATCH/``, then one commit of them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pidfence.spark_sink.delta.commit import commit_files, table_rows
from pidfence.spark_sink.delta.stats import file_stats
from pidfence.spark_sink.delta.table import TableKind
from pidfence.spark_sink.storage import Store, batch_name

#: One batch's files as a commit names them: (path relative to the table root, stats JSON).
Files = list[tuple[str, str | None]]


def data_dir(query_id: str, batch_id: int) -> str:
    """Where the sink writes a batch's data files, relative to the table root."""
    return f"data/{query_id}/{batch_name(batch_id)}"


def stage_file(
    path: str, kind: TableKind, query: str, batch: int, topic: str, partition: int, rows: pa.Table
) -> tuple[str, str | None]:
    """A task's data file of one partition, written where the sink writes it (not yet added)."""
    table = Store.at(path)
    rows = table_rows(rows, kind)
    rel = f"{data_dir(query, batch)}/{topic}-{partition}.parquet"
    table.write_table(table.join(rel), rows, "snappy")
    return rel, file_stats(rows)


def commit_batch(
    path: str, kind: TableKind, query: str, batch: int, files: Files, **options: Any
) -> bool:
    """The driver's commit of those files (see :func:`commit_files`)."""
    return commit_files(Store.at(path), kind, query, batch, files, **options)
