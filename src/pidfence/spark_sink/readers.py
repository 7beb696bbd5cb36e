"""Readers of the committed output: the log and rejects tables' rows (through their Delta logs,
as any Delta reader sees them), the sink's own account of what it appended, and the gaps.

Any Delta reader sees exactly the committed rows: ``deltalake.DeltaTable(P).to_pyarrow_table()``,
``polars.read_delta(P)``, or Spark with the ``delta-spark`` jars. These add pidfence's sort order
and read what other engines made of the tables: columns another writer added come after the
sink's, rows another writer appended are there too (:func:`read_written` tells them apart).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.decisions import appended
from pidfence.spark_sink.delta.table import TableKind, open_table, schema_of
from pidfence.spark_sink.gaps import GapReport, gaps_table
from pidfence.spark_sink.options import rejects_path_of
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.schema import PLACE_FIELDS, WRITER_FIELDS, conform

_LOG_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
#: The column :func:`read_log` adds with ``with_files``: each row's data file (relative to the
#: table root, as the Delta log names it).
FILE_COLUMN = "_pidfence_file"
_REJECT_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]


def read_table(
    path: str,
    kind: TableKind,
    where: pc.Expression | None = None,
    *,
    with_files: bool = False,
) -> pa.Table:
    """A table's current rows in the sink's schema, with columns others added after it (no rows
    while the table does not exist).

    Args:
        path: the table root.
        kind: ``log`` or ``rejects``.
        where: a filter (pushed down to the files' statistics).
        with_files: add :data:`FILE_COLUMN`, the data file each row is in.
    """
    schema = schema_of(kind)
    if with_files:
        schema = schema.append(pa.field(FILE_COLUMN, pa.string()))
    try:
        dt = open_table(path, kind, create=False, reading=True)
    except TableNotFoundError:
        return schema.empty_table()
    dataset = dt.to_pyarrow_dataset()
    if not with_files:
        return conform(dataset.to_table(filter=where), schema, keep_extra=True)
    pieces = []
    for fragment in dataset.get_fragments(filter=where):
        rows = fragment.to_table(schema=dataset.schema, filter=where)
        files = pa.array([fragment.path] * rows.num_rows, pa.string())
        pieces.append(conform(rows.append_column(FILE_COLUMN, files), schema, keep_extra=True))
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def read_log(path: str, *, with_files: bool = False) -> pa.Table:
    """The committed output log, sorted by (topic, partition, log_offset).

    Columns: :data:`~pidfence.spark_sink.schema.LOG_SCHEMA` (the Kafka source's, then ``pid,
    generation, seq, log_offset``), then any column another writer added. Rows another writer
    appended are included (``pidfence verify`` tells them apart with :func:`read_written`).

    Args:
        path: the sink's ``path`` option.
        with_files: add :data:`FILE_COLUMN`: the data file each row is in, relative to the
            table root (``data/QUERY/BATCH/...`` for a file the sink's commit added).
    """
    return read_table(path, "log", with_files=with_files).sort_by(_LOG_ORDER)


def read_rejects(path: str, rejects_path: str | None = None) -> pa.Table:
    """The committed rejects (the log's columns plus ``verdict``), sorted by (topic,
    partition, offset).

    Args:
        path: the sink's ``path`` option.
        rejects_path: the sink's ``rejectsPath`` option if it was set.
    """
    return read_table(rejects_path_of(path, rejects_path), "rejects").sort_by(_REJECT_ORDER)


def read_gaps(path: str) -> pa.Table:
    """Every gap the committed batches reported (:data:`~pidfence.spark_sink.gaps.GAP_SCHEMA`),
    in batch order: Kafka offsets the sink never read and seqs producers never delivered.

    Args:
        path: the sink's ``path`` option.
    """
    rows: list[tuple[str, int, int, GapReport]] = [
        (part.topic, part.partition, manifest.batch, gap)
        for manifest in Output.reading(path).manifests()
        for part in manifest.parts
        for gap in part.gaps
    ]
    return gaps_table(rows)


WRITTEN_SCHEMA = pa.schema(
    [
        *PLACE_FIELDS,
        ("log_offset", pa.int64()),
        ("offset", pa.int64()),
        *WRITER_FIELDS,
        ("batch", pa.int64()),
    ]
)


def read_data_files(path: str) -> set[str]:
    """The log data files the sink's commits added, relative to the table root (a file that
    compaction later replaced included: it is simply no longer in the table)."""
    return {
        part.files.log
        for manifest in Output.reading(path).manifests()
        for part in manifest.parts
        if part.files.log is not None
    }


def read_written(path: str, rejects_path: str | None = None) -> pa.Table:
    """Every row the sink appended, by identity, from its own account of its commits.

    Whatever happened to the table since (rows others appended, rows users deleted), this is
    what the sink wrote: ``topic, partition, log_offset, offset, pid, generation, seq`` and the
    ``batch`` that committed it, sorted by (topic, partition, log_offset).

    Args:
        path: the sink's ``path`` option.
        rejects_path: the sink's ``rejectsPath`` option if it was set.
    """
    output = Output.reading(path, rejects_path)
    pieces = []
    for manifest in output.manifests():
        for part in manifest.parts:
            decided = output.read_decided(manifest.batch, part)
            if decided is None:
                continue
            rows = appended(decided)
            n = rows.num_rows
            columns = {
                "topic": pa.array([part.topic] * n, pa.string()),
                "partition": pa.array([part.partition] * n, pa.int32()),
                **{c: rows.column(c) for c in ("log_offset", "offset", "pid", "generation", "seq")},
                "batch": pa.array([manifest.batch] * n, pa.int64()),
            }
            pieces.append(pa.table(columns, schema=WRITTEN_SCHEMA))
    if not pieces:
        return WRITTEN_SCHEMA.empty_table()
    return pa.concat_tables(pieces).sort_by(_LOG_ORDER)
