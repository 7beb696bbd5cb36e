"""The pidfence Delta table spec: schema, create-or-open, refusal of anything that is not ours."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from pidfence.spark_sink.delta.errors import (
    CannotContinue,
    DeltaCommitConflict,
    NotPidfenceTable,
    RestoredPastSink,
    SchemaChanged,
    StagedFileMissing,
    TableGone,
)
from pidfence.spark_sink.delta.table import (
    DELTA_LOG_SCHEMA,
    DELTA_REJECTS_SCHEMA,
    FORMAT_KEY,
    FORMAT_VERSION,
    LOG_RETENTION,
    TABLE_KEY,
    holds_delta,
    open_table,
)
from pidfence.spark_sink.schema import HEADERS_TYPE, LOG_SCHEMA, REJECTS_SCHEMA, TS_TYPE
from pidfence.wire import PidfenceError, encode_pf


def log_rows(topic: str, partition: int, start: int, n: int, tag: str = "") -> pa.Table:
    """``n`` log rows of one partition from ``log_offset`` ``start`` (values carry ``tag``)."""
    offsets = list(range(start, start + n))
    return pa.table(
        {
            "key": pa.array([None if i % 3 == 0 else b"k%d" % i for i in offsets], pa.binary()),
            "value": pa.array([f"{tag}{topic}:{partition}:{i}".encode() for i in offsets]),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array([10 + 2 * i for i in offsets], pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + i for i in offsets], pa.int64()).cast(
                TS_TYPE
            ),
            "timestampType": pa.array([0] * n, pa.int32()),
            "headers": pa.array(
                [
                    [{"key": "pf", "value": encode_pf(7, 1, i)}, {"key": "app", "value": b"x"}]
                    for i in offsets
                ],
                HEADERS_TYPE,
            ),
            "pid": pa.array([7] * n, pa.int64()),
            "generation": pa.array([1] * n, pa.int64()),
            "seq": pa.array(offsets, pa.int64()),
            "log_offset": pa.array(offsets, pa.int64()),
        },
        schema=DELTA_LOG_SCHEMA,
    )


def reject_rows(topic: str, partition: int, start: int, n: int, verdict: str) -> pa.Table:
    """``n`` rejects of one partition (no log offsets) with one verdict."""
    rows = log_rows(topic, partition, start, n)
    rows = rows.set_column(
        rows.schema.get_field_index("log_offset"), "log_offset", pa.nulls(n, pa.int64())
    )
    return rows.append_column("verdict", pa.array([verdict] * n, pa.string()))


def test_schema_is_the_kafka_sources_plus_pidfences_columns() -> None:
    # The Delta tables hold exactly the columns and types of read_log / read_rejects.
    assert DELTA_LOG_SCHEMA.equals(LOG_SCHEMA)
    assert DELTA_REJECTS_SCHEMA.equals(REJECTS_SCHEMA)
    # Spark's Kafka source (includeHeaders=true), same names, types and order, then pidfence's.
    assert LOG_SCHEMA.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
        "pid",
        "generation",
        "seq",
        "log_offset",
    ]
    assert str(LOG_SCHEMA.field("headers").type.value_type) == "struct<key: string, value: binary>"
    assert REJECTS_SCHEMA.names == [*LOG_SCHEMA.names, "verdict"]


def test_create_then_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    dt = open_table(path, "log")
    assert dt.version() == 0
    assert dt.metadata().configuration == {
        TABLE_KEY: "log",
        FORMAT_KEY: FORMAT_VERSION,
        "delta.logRetentionDuration": LOG_RETENTION,
    }
    assert pa.schema(dt.schema().to_arrow()).names == DELTA_LOG_SCHEMA.names
    again = open_table(path, "log")
    assert again.version() == 0
    rejects = open_table(str(tmp_path / "out" / "_rejects"), "rejects")
    assert pa.schema(rejects.schema().to_arrow()).names == REJECTS_SCHEMA.names
    # A Delta reader sees an empty table of the right schema.
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0


def test_holds_delta(tmp_path: Path) -> None:
    assert not holds_delta(str(tmp_path))
    open_table(str(tmp_path), "log")
    assert holds_delta(str(tmp_path))
    assert holds_delta(f"file://{tmp_path}")


def test_open_without_create_fails_on_missing_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        open_table(str(tmp_path / "none"), "log", create=False)
    assert not (tmp_path / "none").exists()


def _versions(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "_delta_log").iterdir())


def test_refuses_another_writers_table_with_other_schema(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1, 2], "name": ["a", "b"]}))
    before = _versions(tmp_path)
    with pytest.raises(NotPidfenceTable, match="pidfence did not create") as info:
        open_table(str(tmp_path), "log")
    assert not info.value.retriable
    assert _versions(tmp_path) == before


def test_refuses_same_schema_written_by_another_writer(tmp_path: Path) -> None:
    # Same columns and types, but not marked as pidfence's: never append to it.
    write_deltalake(str(tmp_path), log_rows("t", 0, 0, 3))
    with pytest.raises(NotPidfenceTable, match="pidfence did not create"):
        open_table(str(tmp_path), "log")


def test_refuses_marked_table_without_the_sinks_columns_but_reads_one_with_added_columns(
    tmp_path: Path,
) -> None:
    DeltaTable.create(
        str(tmp_path / "x"),
        pa.schema([("topic", pa.string()), ("x", pa.int64())]),
        configuration={TABLE_KEY: "log", FORMAT_KEY: FORMAT_VERSION},
        raise_if_key_not_exists=False,
    )
    with pytest.raises(SchemaChanged, match="column key was removed") as info:
        open_table(str(tmp_path / "x"), "log")
    assert "column offset was removed" in str(info.value) and not info.value.retriable
    DeltaTable.create(
        str(tmp_path / "y"),
        DELTA_LOG_SCHEMA.append(pa.field("note", pa.string())),
        configuration={TABLE_KEY: "log", FORMAT_KEY: FORMAT_VERSION},
        raise_if_key_not_exists=False,
    )
    assert open_table(str(tmp_path / "y"), "log").version() == 0


def test_refuses_other_kind(tmp_path: Path) -> None:
    open_table(str(tmp_path / "r"), "rejects")
    with pytest.raises(NotPidfenceTable, match="rejects table, not a log table"):
        open_table(str(tmp_path / "r"), "log")


@pytest.mark.parametrize(("formats", "named"), [({FORMAT_KEY: "99"}, "'99'"), ({}, "None")])
def test_refuses_other_format_or_none(tmp_path: Path, formats: dict[str, str], named: str) -> None:
    # A marked table of an unknown format, or with no format at all, is not one to append to.
    DeltaTable.create(
        str(tmp_path / "f"),
        DELTA_LOG_SCHEMA,
        configuration={TABLE_KEY: "log", **formats},
        raise_if_key_not_exists=False,
    )
    with pytest.raises(NotPidfenceTable, match=f"format {named}"):
        open_table(str(tmp_path / "f"), "log")


def test_refuses_stray_files(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(NotPidfenceTable, match="not empty and not a Delta table"):
        open_table(str(tmp_path / "s"), "log")
    # pidfence's own hidden directories (state, staging, a nested rejects table) are fine.
    (tmp_path / "h" / "_state" / "t~0").mkdir(parents=True)
    (tmp_path / "h" / "_pidfence").mkdir()
    assert open_table(str(tmp_path / "h"), "log").version() == 0
    assert not (tmp_path / "s" / "_delta_log").exists()


def test_errors_are_pidfence_errors_with_retriable_flags() -> None:
    assert issubclass(NotPidfenceTable, PidfenceError)
    assert not NotPidfenceTable.retriable
    for cls in (SchemaChanged, RestoredPastSink, TableGone):
        assert issubclass(cls, CannotContinue) and not cls.retriable
    assert DeltaCommitConflict.retriable
    assert StagedFileMissing.retriable
