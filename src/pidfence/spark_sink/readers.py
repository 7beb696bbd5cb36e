"""Readers of the committed output log and rejects log (pyarrow), whichever table format.

A Delta table at the output path is read through its Delta log (:mod:`delta_readers`); otherwise
the manifests name the committed files.
"""

from __future__ import annotations

import pyarrow as pa

from pidfence.spark_sink.layout import part_file
from pidfence.spark_sink.output import is_delta
from pidfence.spark_sink.process import LOG_SCHEMA, REJECTS_SCHEMA
from pidfence.spark_sink.storage import Store, manifest_ids, read_manifest


def committed_files(store: Store, rejects: Store, table: str = "log") -> list[str]:
    """Paths of the committed files of the log (``table="log"``) or of the rejects.

    Only files a manifest names: a re-run's or a failed attempt's files are never read.
    """
    files: list[str] = []
    root = rejects if table == "rejects" else store
    for bid in manifest_ids(store):
        for part in read_manifest(store, bid)["parts"]:
            rel = part_file(bid, part, table)
            if rel is not None:
                files.append(root.join(rel))
    return files


def _read(path: str, rejects_path: str | None, table: str) -> pa.Table:
    if is_delta(path):
        return _read_delta(path, rejects_path, table)
    store = Store.at(path)
    rejects = Store.at(rejects_path or f"{path.rstrip('/')}/_rejects")
    owner = rejects if table == "rejects" else store
    schema = REJECTS_SCHEMA if table == "rejects" else LOG_SCHEMA
    pieces = [owner.read_table(f) for f in committed_files(store, rejects, table)]
    if not pieces:
        return schema.empty_table()
    return pa.concat_tables([p.select(schema.names).cast(schema) for p in pieces])


def _read_delta(path: str, rejects_path: str | None, table: str) -> pa.Table:
    from deltalake.exceptions import TableNotFoundError

    from pidfence.spark_sink.delta_readers import read_delta_log, read_delta_rejects

    if table != "rejects":
        return read_delta_log(path).cast(LOG_SCHEMA)
    try:
        rows = read_delta_rejects(rejects_path or f"{path.rstrip('/')}/_rejects")
    except TableNotFoundError:
        return REJECTS_SCHEMA.empty_table()
    return rows.cast(REJECTS_SCHEMA)


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

    Args:
        path: the sink's ``path`` option.
    """
    return _read(path, None, "log").sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    )


def read_rejects(path: str, rejects_path: str | None = None) -> pa.Table:
    """The committed rejects (with ``verdict``), sorted by (topic, partition, kafka_offset).

    Args:
        path: the sink's ``path`` option.
        rejects_path: the sink's ``rejectsPath`` option if it was set.
    """
    return _read(path, rejects_path, "rejects").sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("kafka_offset", "ascending")]
    )
