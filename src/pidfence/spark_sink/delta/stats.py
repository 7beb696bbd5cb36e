"""Delta ``stats`` of the files the sink adds: record count, min/max and null counts.

Every column but the binary and nested ones gets bounds (strings in full, not truncated):
deltalake's pyarrow dataset turns a missing bound into a guarantee that prunes the file from any
filter on that column, so a reader filtering on it would silently miss rows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pidfence.spark_sink.schema import TS_TYPE
from pidfence.spark_sink.storage import Store

#: Columns without min/max statistics (Delta keeps none for binary and nested columns).
NO_STATS: Final = frozenset({"key", "value", "headers", "pf"})
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _stat(value: pa.Scalar, bound: str) -> Any:
    if pa.types.is_timestamp(value.type):
        # Delta keeps timestamp statistics in milliseconds: round outwards so they still bound.
        micros = int(value.cast(pa.int64()).as_py())
        millis = micros // 1000 if bound == "min" else -(-micros // 1000)
        stamp = pa.scalar(millis * 1000, pa.int64()).cast(TS_TYPE).as_py()
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
    return value.as_py()


def file_stats(table: pa.Table) -> str:
    """Delta ``stats`` JSON of a file: record count, min/max and null counts.

    Every non-binary column gets bounds (strings in full, not truncated): deltalake's pyarrow
    dataset turns a missing bound into a guarantee that prunes the file from any filter on that
    column, so a reader filtering on it would silently miss rows.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in table.column_names:
        if name in NO_STATS:
            continue
        col = table.column(name)
        nulls[name] = col.null_count
        if table.num_rows and col.null_count < table.num_rows:
            bounds = pc.min_max(col)
            mins[name] = _stat(bounds["min"], "min")
            maxs[name] = _stat(bounds["max"], "max")
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        sort_keys=True,
    )


def _bound(value: Any, bound: str) -> Any:
    if isinstance(value, datetime):
        micros = (value - _EPOCH) // timedelta(microseconds=1)
        return _stat(pa.scalar(micros, pa.int64()).cast(TS_TYPE), bound)
    return value


def footer_stats(table: Store, rel: str) -> str:
    """Delta ``stats`` JSON of a Parquet file from its footer (no data read).

    Falls back to reading the file's non-binary columns when a row group has no statistics for
    one of them (a missing bound would hide the file from filtered reads, see
    :func:`file_stats`).
    """
    meta = pq.read_metadata(table.join(rel), filesystem=table.fs)
    # Leaf paths: a nested column's leaves ("headers.list.element.key") get no statistics.
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in NO_STATS or "." in name:
            continue
        count = 0
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None or not st.has_null_count:
                table = pq.read_table(
                    table.join(rel),
                    filesystem=table.fs,
                    columns=[n for n in names if n not in NO_STATS and "." not in n],
                )
                return file_stats(table)
            count += st.null_count
            if st.has_min_max:
                lo, hi = _bound(st.min, "min"), _bound(st.max, "max")
                mins[name] = lo if name not in mins else min(mins[name], lo)
                maxs[name] = hi if name not in maxs else max(maxs[name], hi)
            elif st.null_count < meta.row_group(g).num_rows:
                table = pq.read_table(
                    table.join(rel),
                    filesystem=table.fs,
                    columns=[n for n in names if n not in NO_STATS and "." not in n],
                )
                return file_stats(table)
        nulls[name] = count
    return json.dumps(
        {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
        sort_keys=True,
    )
