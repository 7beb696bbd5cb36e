"""Every Delta reader sees exactly the committed rows; the per-partition reads of state rebuilds."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pidfence.spark_sink.delta_commit import commit_batch, stage_file
from pidfence.spark_sink.delta_readers import (
    log_heads,
    log_rows_from,
    read_delta_log,
    read_delta_rejects,
    rejects_from,
)
from pidfence.spark_sink.delta_table import DELTA_LOG_SCHEMA, REJECTS_PUBLIC_SCHEMA, open_table
from tests.unit.test_delta_commit import Q, expected, run_batch, stage
from tests.unit.test_delta_table import reject_rows

_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]


@pytest.fixture
def table_with_uncommitted(tmp_path: Path) -> str:
    """Batches 0-2 committed; batch 3 published into data/ but not committed; 4 only staged."""
    path = str(tmp_path)
    for b in range(3):
        run_batch(path, b)

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        raise Crash(point)

    with pytest.raises(Crash):
        run_batch(path, 3, hook=crash)
    stage(path, 4)
    assert (tmp_path / "data" / Q / f"{3:020d}" / "t-0.parquet").exists()
    return path


def _normal(table: pa.Table, schema: pa.Schema = DELTA_LOG_SCHEMA) -> pa.Table:
    return table.select(schema.names).cast(schema).sort_by(_ORDER)


def test_read_delta_log_is_the_committed_rows(table_with_uncommitted: str) -> None:
    assert read_delta_log(table_with_uncommitted).equals(expected([0, 1, 2]))


def test_deltalake_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    table = DeltaTable(table_with_uncommitted).to_pyarrow_table()
    assert _normal(table).equals(expected([0, 1, 2]))


def test_pyarrow_dataset_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    dataset = DeltaTable(table_with_uncommitted).to_pyarrow_dataset()
    assert len(dataset.files) == 6  # 3 batches x 2 partitions; nothing staged or uncommitted
    assert _normal(dataset.to_table()).equals(expected([0, 1, 2]))


def test_polars_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    frame = pl.read_delta(table_with_uncommitted)
    assert frame.height == expected([0, 1, 2]).num_rows
    assert _normal(frame.to_arrow()).equals(expected([0, 1, 2]))
    lazy = pl.scan_delta(table_with_uncommitted).filter(pl.col("partition") == 1).collect()
    assert sorted(lazy["log_offset"].to_list()) == list(range(12))


def test_per_partition_reads_for_state_rebuild(table_with_uncommitted: str) -> None:
    path = table_with_uncommitted
    assert log_heads(path) == {("t", 0): 12, ("t", 1): 12}
    rows = log_rows_from(path, "t", 1, 5)
    assert rows["log_offset"].to_pylist() == list(range(5, 12))
    assert set(rows["partition"].to_pylist()) == {1}
    assert log_rows_from(path, "t", 0, 12).num_rows == 0
    assert log_rows_from(path, "other", 0, 0).num_rows == 0


def test_rejects_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "_rejects")
    open_table(path, "rejects")
    assert read_delta_rejects(path).num_rows == 0
    rows = pa.concat_tables(
        [reject_rows("t", 0, 0, 3, "FENCE"), reject_rows("t", 0, 3, 2, "DUPLICATE")]
    )
    commit_batch(path, "rejects", Q, 0, [stage_file(path, "rejects", Q, 0, "t", 0, rows)])
    table = read_delta_rejects(path)
    assert table.schema.equals(REJECTS_PUBLIC_SCHEMA)
    assert table.equals(rows)
    fences = rejects_from(path, "t", 0, 11, ["FENCE"])
    assert fences["batch"].to_pylist() == [0, 0]
    assert fences["pf"].null_count == 2
    assert fences["kafka_offset"].to_pylist() == [12, 14]
    assert (
        rejects_from(path, "t", 0, -1)["verdict"].to_pylist() == ["FENCE"] * 3 + ["DUPLICATE"] * 2
    )


def test_empty_log_reads(tmp_path: Path) -> None:
    open_table(str(tmp_path), "log")
    assert read_delta_log(str(tmp_path)).equals(DELTA_LOG_SCHEMA.empty_table())
    assert log_heads(str(tmp_path)) == {}
