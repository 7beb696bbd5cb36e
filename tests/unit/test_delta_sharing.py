"""The sink shares its Delta table with other writers, as Delta's own streaming sink does.

Blind appends, properties, added columns, constraints its rows satisfy, DELETE, OPTIMIZE,
VACUUM, checkpoints: the next batch commits. Removed or retyped columns, a RESTORE to before the
last batch, a table that is gone, a constraint its rows violate: the batch stops with a
non-retriable error naming the commit and the fix.
"""

from __future__ import annotations

import shutil
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field, PrimitiveType

from pidfence.spark_sink.delta.care import compact
from pidfence.spark_sink.delta.checkpoints import last_checkpoint
from pidfence.spark_sink.delta.commit import committed_version
from pidfence.spark_sink.delta.constraints import check_rows
from pidfence.spark_sink.delta.errors import (
    ConstraintViolated,
    RestoredPastSink,
    SchemaChanged,
    TableGone,
)
from pidfence.spark_sink.delta.history import check_lineage, last_own_version, restored_version
from pidfence.spark_sink.delta.table import open_table
from pidfence.spark_sink.readers import read_log as read_delta_log
from pidfence.spark_sink.storage import Store
from tests.unit.delta_kit import commit_batch
from tests.unit.test_delta_commit import PER_BATCH, Q, expected, run_batch, stage
from tests.unit.test_delta_table import log_rows


def _sink_rows(path: str) -> int:
    rows = read_delta_log(path)
    return int(pa.compute.sum(pa.compute.equal(rows["pid"], 7)).as_py() or 0)


def test_properties_columns_constraints_and_table_care_never_stop_the_sink(
    tmp_path: Path,
) -> None:
    path = str(tmp_path)
    run_batch(path, 0)
    dt = DeltaTable(path)
    dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 60 days"})
    dt.alter.add_columns([Field("note", PrimitiveType("string"), nullable=True)])
    dt.alter.add_constraint({"known_partition": "partition >= 0 AND `offset` >= 0"})
    assert run_batch(path, 1)
    write_deltalake(
        path, log_rows("t", 8, 0, 2).append_column("note", pa.array(["x", "y"])), mode="append"
    )
    DeltaTable(path).optimize.z_order(["pid", "seq"])
    DeltaTable(path).vacuum(0, enforce_retention_duration=False, dry_run=False)
    DeltaTable(path).delete("partition = 0 AND log_offset < 2")
    assert run_batch(path, 2)
    assert committed_version(DeltaTable(path), Q) == 2
    rows = read_delta_log(path)
    assert rows.column_names[-1] == "note"  # the added column reads, after the sink's
    assert rows.num_rows == 3 * 2 * PER_BATCH + 2 - 2
    assert rows.filter(pa.compute.is_valid(rows["note"])).num_rows == 2


@pytest.mark.parametrize("files", [1, 2])
def test_a_constraint_the_rows_violate_stops_the_batch_with_its_name(
    tmp_path: Path, files: int
) -> None:
    # A batch of one partition's file is checked as one of several files is.
    path = str(tmp_path)
    run_batch(path, 0)
    DeltaTable(path).alter.add_constraint({"small": "log_offset < 6"})
    with pytest.raises(ConstraintViolated, match=r"constraint small \(log_offset < 6\) rejects"):
        commit_batch(path, "log", Q, 1, stage(path, 1)[:files])
    assert committed_version(DeltaTable(path), Q) == 0
    DeltaTable(path).alter.drop_constraint("small")
    assert run_batch(path, 1)


@pytest.mark.parametrize(
    ("expression", "rejected"),
    [
        ("Offset >= 10 AND PARTITION = 0 AND Log_Offset < 4", False),  # names ignore case
        ("topic = 'value'", False),  # a literal spelled like a column stays a literal
        ("topic <> 'value'", True),
    ],
)
def test_constraints_read_column_names_in_any_case_and_literals_as_written(
    expression: str, rejected: bool
) -> None:
    rows = log_rows("value", 0, 0, 4)  # the topic is named like a column
    expect: AbstractContextManager[Any] = (
        pytest.raises(ConstraintViolated, match="rejects 4 of batch 3")
        if rejected
        else nullcontext()
    )
    with expect:
        check_rows(rows, {"c": expression}, "out", 3)


def test_a_retyped_column_stops_the_sink_naming_the_commit(tmp_path: Path) -> None:
    path = str(tmp_path)
    run_batch(path, 0)
    rows = read_delta_log(path)
    retyped = rows.set_column(
        rows.schema.get_field_index("seq"), "seq", rows["seq"].cast(pa.string())
    )
    write_deltalake(path, retyped, mode="overwrite", schema_mode="overwrite")
    version = DeltaTable(path).version()
    with pytest.raises(SchemaChanged, match=f"version {version} \\(WRITE\\)") as info:
        run_batch(path, 1)
    assert "column seq is string, the sink writes int64" in str(info.value)
    assert not info.value.retriable


def table_with_two_batches(tmp_path: Path) -> str:
    """A log table holding the sink's batches 0 and 1 (versions 1 and 2); its path."""
    path = str(tmp_path)
    run_batch(path, 0)
    run_batch(path, 1)
    return path


def test_restore_to_before_the_last_batch_stops_the_sink_and_a_later_restore_is_fine(
    tmp_path: Path,
) -> None:
    path = table_with_two_batches(tmp_path)  # versions 1 and 2
    write_deltalake(path, log_rows("t", 9, 0, 1), mode="append")  # version 3
    DeltaTable(path).restore(2)  # version 4: back to the sink's own last batch: fine
    assert run_batch(path, 2)  # version 5
    DeltaTable(path).restore(3)  # version 6: before batch 2
    with pytest.raises(RestoredPastSink) as info:
        run_batch(path, 3)
    line = str(info.value)
    assert "version 6 (RESTORE" in line and "version 3" in line and "batch 2 (version 5)" in line
    assert "RESTORE the table to version 5 or later" in line
    assert not info.value.retriable
    DeltaTable(path).restore(5)  # version 7: the fix the line names
    assert run_batch(path, 3)
    assert (
        read_delta_log(path)
        .filter(pa.compute.equal(read_delta_log(path)["pid"], 7))
        .equals(expected([0, 1, 2, 3]))
    )


def test_restored_version_by_number_or_by_timestamp() -> None:
    by_version = {3: {"timestamp": 1000}, 4: {"timestamp": 2000}, 5: {"timestamp": 3000}}
    assert restored_version({"operationParameters": {"version": "4"}}, by_version) == 4
    stamp = {"operationParameters": {"timestamp": "1970-01-01 00:00:02.500"}}
    assert restored_version(stamp, by_version) == 4
    exact = {"operationParameters": {"timestamp": "1970-01-01 00:00:02"}}
    assert restored_version(exact, by_version) == 4  # a commit's own time restores to it
    early = {"operationParameters": {"timestamp": "1970-01-01T00:00:00Z"}}
    assert restored_version(early, by_version) == -1
    assert restored_version({"operationParameters": {}}, by_version) is None


def test_lineage_follows_restores_of_restores(tmp_path: Path) -> None:
    path = table_with_two_batches(tmp_path)  # 1, 2 (own)
    write_deltalake(path, log_rows("t", 9, 0, 1), mode="append")  # 3
    DeltaTable(path).restore(1)  # 4: before own
    DeltaTable(path).restore(3)  # 5: to 3, which descends from 2
    check_lineage(DeltaTable(path), path, 2)
    DeltaTable(path).restore(4)  # 6: to the state after the bad restore
    with pytest.raises(RestoredPastSink):
        check_lineage(DeltaTable(path), path, 2)


def test_the_sinks_last_batch_is_found_behind_table_care_and_other_writers(
    tmp_path: Path,
) -> None:
    # A process that did not make the commit itself walks the history back: past more than one
    # step of other writers' commits, and past pidfence's own table care, which is no batch.
    path = table_with_two_batches(tmp_path)  # versions 1 and 2
    compact(path)  # version 3: marked as pidfence's, not a batch commit
    for i in range(16):  # versions 4-19
        write_deltalake(path, log_rows("t", 9, i, 1), mode="append")
    assert last_own_version(DeltaTable(path), f"{path}#a-process-that-never-committed") == 2


def test_a_deleted_table_is_gone_not_recreated(tmp_path: Path) -> None:
    path = str(tmp_path)
    run_batch(path, 0)
    staged = stage(path, 1)
    shutil.rmtree(tmp_path / "_delta_log")
    with pytest.raises(TableGone, match="start a new --output"):
        commit_batch(path, "log", Q, 1, staged)
    assert not (tmp_path / "_delta_log").exists()


def test_a_table_deleted_and_created_again_is_gone_for_the_sink_that_had_it_open(
    tmp_path: Path,
) -> None:
    """The process has the table open (cached) at version 4; someone deletes it and makes a
    new pidfence table at the same path: the sink's next batch stops with the cause, where it
    raised the Delta library's own "file not found" for the version it had read."""
    path, other = str(tmp_path / "out"), str(tmp_path / "other")
    for b in range(4):
        run_batch(path, b)  # versions 1-4, the process keeps the table open
    open_table(other, "log")  # a new pidfence table: version 0
    shutil.rmtree(path)
    shutil.copytree(other, path)
    staged = stage(path, 4)
    with pytest.raises(TableGone, match="deleted and created again") as info:
        commit_batch(path, "log", Q, 4, staged)
    assert "start a new --output" in str(info.value) and not info.value.retriable


def test_checkpoints_at_deltas_default_interval_or_the_tables(tmp_path: Path) -> None:
    path = str(tmp_path / "a")
    for b in range(12):
        run_batch(path, b)
    assert last_checkpoint(Store.at(path)) == 10  # Delta Lake's default interval, 10
    other = str(tmp_path / "b")
    run_batch(other, 0)
    DeltaTable(other).alter.set_table_properties({"delta.checkpointInterval": "3"})
    for b in range(1, 5):
        run_batch(other, b)
    # Never more than the table's interval behind (delta-rs's own ALTER hook checkpoints too).
    assert DeltaTable(other).version() - last_checkpoint(Store.at(other)) < 3
    assert _sink_rows(other) == 5 * 2 * PER_BATCH
