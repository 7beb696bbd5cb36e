"""Readers of the committed output log and rejects log (pyarrow), through the Delta log."""

from __future__ import annotations

import pyarrow as pa

from pidfence.spark_sink.schema import LOG_SCHEMA, PLACE_FIELDS, REJECTS_SCHEMA, WRITER_FIELDS


def _read(path: str, rejects_path: str | None, table: str) -> pa.Table:
    """The rows of the log or the rejects table (none while the table does not exist)."""
    from deltalake.exceptions import TableNotFoundError

    from pidfence.spark_sink.delta.readers import read_table

    rejects = table == "rejects"
    try:
        if rejects:
            return read_table(rejects_path or f"{path.rstrip('/')}/_rejects", "rejects")
        return read_table(path, "log")
    except TableNotFoundError:
        return (REJECTS_SCHEMA if rejects else LOG_SCHEMA).empty_table()


def read_gaps(path: str) -> pa.Table:
    """Every gap the committed batches reported (:data:`~pidfence.spark_sink.gaps.GAP_SCHEMA`),
    in batch order: Kafka offsets the sink never read and seqs producers never delivered.

    Args:
        path: the sink's ``path`` option.
    """
    from pidfence.spark_sink.gaps import manifest_gaps
    from pidfence.spark_sink.output import reading_layout

    layout = reading_layout(path)
    pairs = []
    for bid in layout.committed_ids():
        manifest = layout.committed(bid)
        if manifest is not None:
            pairs.append((bid, manifest))
    return manifest_gaps(pairs)


def read_log(path: str) -> pa.Table:
    """The committed output log, sorted by (topic, partition, log_offset).

    Columns: :data:`~pidfence.spark_sink.schema.LOG_SCHEMA` (the Kafka source's, then ``pid,
    generation, seq, log_offset``), then any column another writer added to a Delta output.
    Rows another writer appended to a Delta output are included (``pidfence verify`` tells them
    apart with :func:`read_written`).

    Args:
        path: the sink's ``path`` option.
    """
    return _read(path, None, "log").sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    )


def read_rejects(path: str, rejects_path: str | None = None) -> pa.Table:
    """The committed rejects (the log's columns plus ``verdict``), sorted by (topic,
    partition, offset).

    Args:
        path: the sink's ``path`` option.
        rejects_path: the sink's ``rejectsPath`` option if it was set.
    """
    return _read(path, rejects_path, "rejects").sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )


WRITTEN_SCHEMA = pa.schema(
    [
        *PLACE_FIELDS,
        ("log_offset", pa.int64()),
        ("offset", pa.int64()),
        *WRITER_FIELDS,
        ("batch", pa.int64()),
    ]
)


def read_written(path: str, rejects_path: str | None = None) -> pa.Table:
    """Every row the sink appended, by identity, from its own account of its commits.

    Whatever happened to the table since (rows others appended, rows users deleted), this is
    what the sink wrote: ``topic, partition, log_offset, offset, pid, generation, seq`` and the
    ``batch`` that committed it, sorted by (topic, partition, log_offset).

    Args:
        path: the sink's ``path`` option.
        rejects_path: the sink's ``rejectsPath`` option if it was set.
    """
    from pidfence.spark_sink.decisions import appended
    from pidfence.spark_sink.output import reading_layout

    layout = reading_layout(path, rejects_path)
    pieces = []
    for bid in layout.committed_ids():
        manifest = layout.committed(bid)
        for part in manifest["parts"] if manifest is not None else []:
            decided = layout.read_decided(bid, part)
            if decided is None:
                continue
            rows = appended(decided)
            n = rows.num_rows
            pieces.append(
                pa.table(
                    {
                        "topic": pa.array([str(part["topic"])] * n, pa.string()),
                        "partition": pa.array([int(part["partition"])] * n, pa.int32()),
                        "log_offset": rows.column("log_offset"),
                        "offset": rows.column("offset"),
                        "pid": rows.column("pid"),
                        "generation": rows.column("generation"),
                        "seq": rows.column("seq"),
                        "batch": pa.array([bid] * n, pa.int64()),
                    },
                    schema=WRITTEN_SCHEMA,
                )
            )
    if not pieces:
        return WRITTEN_SCHEMA.empty_table()
    return pa.concat_tables(pieces).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    )
