"""Every Delta reader sees exactly the committed rows; the per-partition reads of state rebuilds."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field, PrimitiveType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.spark_sink.delta.stats import file_stats, footer_stats
from pidfence.spark_sink.delta.table import DELTA_LOG_SCHEMA, DELTA_REJECTS_SCHEMA, open_table
from pidfence.spark_sink.readers import read_log as read_delta_log
from pidfence.spark_sink.readers import read_table
from pidfence.spark_sink.schema import HEADERS_TYPE, TS_TYPE, conform
from pidfence.spark_sink.storage import Store
from tests.unit.delta_kit import commit_batch, stage_file
from tests.unit.test_delta_commit import Q, expected, run_batch, stage
from tests.unit.test_delta_table import log_rows, reject_rows

_ORDER = [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]


@pytest.fixture
def table_with_uncommitted(tmp_path: Path) -> str:
    """Batches 0-2 committed; batch 3 checked for a commit that never came; 4 only written."""
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
    return conform(table, schema).sort_by(_ORDER)


def test_read_delta_log_is_the_committed_rows(table_with_uncommitted: str) -> None:
    assert read_delta_log(table_with_uncommitted).equals(expected([0, 1, 2]))


def test_deltalake_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    table = DeltaTable(table_with_uncommitted).to_pyarrow_table()
    assert _normal(table).equals(expected([0, 1, 2]))


def test_pyarrow_dataset_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    dataset = DeltaTable(table_with_uncommitted).to_pyarrow_dataset()
    assert len(dataset.files) == 6  # 3 batches x 2 partitions; nothing uncommitted
    assert _normal(dataset.to_table()).equals(expected([0, 1, 2]))


def test_polars_reads_exactly_the_committed_rows(table_with_uncommitted: str) -> None:
    frame = pl.read_delta(table_with_uncommitted)
    assert frame.height == expected([0, 1, 2]).num_rows
    assert _normal(frame.to_arrow()).equals(expected([0, 1, 2]))
    lazy = pl.scan_delta(table_with_uncommitted).filter(pl.col("partition") == 1).collect()
    assert sorted(lazy["log_offset"].to_list()) == list(range(12))


def test_headers_survive_every_reader(table_with_uncommitted: str) -> None:
    want = expected([0, 1, 2]).column("headers").to_pylist()
    assert read_delta_log(table_with_uncommitted).column("headers").to_pylist() == want
    frame = pl.read_delta(table_with_uncommitted).sort(["topic", "partition", "log_offset"])
    assert frame["headers"].to_list() == want


def test_columns_another_writer_added(table_with_uncommitted: str) -> None:
    path = table_with_uncommitted
    DeltaTable(path).alter.add_columns([Field("region", PrimitiveType("string"), nullable=True)])
    row = expected([0]).slice(0, 1).append_column("region", pa.array(["eu"]))
    write_deltalake(
        path,
        row.set_column(
            row.schema.get_field_index("log_offset"), "log_offset", pa.nulls(1, pa.int64())
        ),
        mode="append",
    )
    table = read_delta_log(path)
    assert table.column_names == [*DELTA_LOG_SCHEMA.names, "region"]
    assert table.num_rows == expected([0, 1, 2]).num_rows + 1


def test_rejects_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "_rejects")
    open_table(path, "rejects")
    assert read_table(path, "rejects").num_rows == 0
    rows = pa.concat_tables(
        [reject_rows("t", 0, 0, 3, "FENCE"), reject_rows("t", 0, 3, 2, "DUPLICATE")]
    )
    commit_batch(path, "rejects", Q, 0, [stage_file(path, "rejects", Q, 0, "t", 0, rows)])
    table = read_table(path, "rejects")
    assert table.schema.equals(DELTA_REJECTS_SCHEMA)
    assert table.equals(rows)


def test_empty_log_reads(tmp_path: Path) -> None:
    open_table(str(tmp_path), "log")
    assert read_delta_log(str(tmp_path)).equals(DELTA_LOG_SCHEMA.empty_table())


_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b.c", "t-1", "x" * 40]),
        st.integers(0, 3),
        st.integers(-(2**40), 2**40),
        st.one_of(st.none(), st.integers(0, 2**20)),
        st.integers(0, 2**50),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_rows, probe=st.integers(-(2**40), 2**40))
def test_property_statistics_bound_every_row_and_never_hide_one(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[str, int, int, int | None, int]],
    probe: int,
) -> None:
    """The statistics a commit writes bound every value (timestamps rounded outwards to ms);
    footer and in-memory statistics agree; a filtered read through deltalake's dataset (which
    prunes files by them) returns exactly the rows a full read filtered afterwards returns."""
    n = len(rows)
    table = pa.table(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array([b"v"] * n, pa.binary()),
            "topic": pa.array([r[0] for r in rows], pa.string()),
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
            "timestamp": pa.array([r[4] for r in rows], pa.int64()).cast(TS_TYPE),
            "timestampType": pa.array([1] * n, pa.int32()),
            "headers": pa.array([[{"key": "k", "value": b"v"}]] * n, HEADERS_TYPE),
            "pid": pa.array([r[3] for r in rows], pa.int64()),
            "generation": pa.array([0] * n, pa.int64()),
            "seq": pa.array([0] * n, pa.int64()),
            "log_offset": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    path = str(tmp_path_factory.mktemp("stats"))
    open_table(path, "log")
    staged = stage_file(path, "log", Q, 0, "t", 0, table)
    rel, raw = staged
    assert raw is not None
    stats = json.loads(raw)
    assert stats["numRecords"] == len(rows)
    for name in ("partition", "log_offset", "offset"):
        values = table[name].to_pylist()
        assert stats["minValues"][name] == min(values)
        assert stats["maxValues"][name] == max(values)
    assert stats["nullCount"]["pid"] == sum(r[3] is None for r in rows)
    lo = datetime.fromisoformat(stats["minValues"]["timestamp"])
    hi = datetime.fromisoformat(stats["maxValues"]["timestamp"])
    assert all(lo <= t <= hi for t in table["timestamp"].to_pylist())
    assert json.loads(footer_stats(Store.at(path), rel)) == stats
    commit_batch(path, "log", Q, 0, [staged])
    full = read_delta_log(path)
    for where in (
        pc.field("log_offset") >= probe,
        pc.field("topic") == rows[0][0],
        (pc.field("partition") == rows[-1][1]) & (pc.field("offset") < probe),
        pc.field("pid").is_null(),
        pc.field("timestamp") >= pa.scalar(rows[0][4], pa.int64()).cast(TS_TYPE),
    ):
        pruned = DeltaTable(path).to_pyarrow_dataset().to_table(filter=where)
        assert pruned.num_rows == full.filter(where).num_rows


def test_footer_statistics_of_a_file_in_several_row_groups_bound_all_its_rows(
    tmp_path: Path,
) -> None:
    """A re-run commit takes a file's statistics from its footer: every row group counts (here
    the smallest offsets are in the last group, the nulls in the first)."""
    rows = log_rows("t", 0, 0, 12).sort_by([("log_offset", "descending")])
    pids = pa.array([None] * 3 + [7] * 9, pa.int64())
    rows = rows.set_column(rows.schema.get_field_index("pid"), "pid", pids)
    store = Store.at(str(tmp_path))
    store.write_table(store.join("f.parquet"), rows, "snappy", group_rows=4)
    assert pq.read_metadata(store.join("f.parquet")).num_row_groups == 3
    stats = json.loads(footer_stats(store, "f.parquet"))
    assert stats == json.loads(file_stats(rows))
    assert (stats["minValues"]["log_offset"], stats["nullCount"]["pid"]) == (0, 3)
