"""Table care: compaction and vacuum never touch an uncommitted batch; log checkpoints."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE
from pidfence.spark_sink.delta import care
from pidfence.spark_sink.delta.care import checkpoint, compact, tables_of, vacuum
from pidfence.spark_sink.delta.errors import DataFileMissing, NotPidfenceTable, VersionVacuumed
from pidfence.spark_sink.delta.table import open_table
from pidfence.spark_sink.readers import read_log as read_delta_log
from tests.unit.delta_kit import commit_batch, data_dir, stage_file
from tests.unit.test_delta_commit import Q, expected, run_batch, stage
from tests.unit.test_delta_table import log_rows


class Crash(Exception):
    """Stands for a driver that dies at a hook point."""


def _crash(point: str) -> None:
    if point == "checked":
        raise Crash(point)


def _files(root: Path, under: str) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / under).rglob("*.parquet")}


@pytest.fixture
def busy_table(tmp_path: Path) -> Path:
    """Batches 0-4 committed, batch 5 checked for its commit that never came, batch 6 written."""
    path = str(tmp_path)
    for b in range(5):
        run_batch(path, b)
    with pytest.raises(Crash):
        run_batch(path, 5, hook=_crash)
    stage(path, 6)
    return tmp_path


def test_compaction_keeps_rows_and_leaves_uncommitted_batches(busy_table: Path) -> None:
    path = str(busy_table)
    staged = _files(busy_table, data_dir(Q, 6))
    pending = _files(busy_table, data_dir(Q, 5))
    metrics = compact(path)
    assert metrics["numFilesRemoved"] == 10
    assert metrics["numFilesAdded"] == 1
    assert len(DeltaTable(path).file_uris()) == 1
    assert read_delta_log(path).equals(expected(list(range(5))))
    assert _files(busy_table, data_dir(Q, 6)) == staged
    assert _files(busy_table, data_dir(Q, 5)) == pending
    # The pending batch still commits after the compaction, once.
    files = stage(path, 5)
    assert commit_batch(path, "log", Q, 5, files)
    assert read_delta_log(path).equals(expected(list(range(6))))


def test_lite_vacuum_deletes_only_replaced_files(busy_table: Path) -> None:
    path = str(busy_table)
    before = _files(busy_table, "data")
    assert vacuum(path, retention_hours=0, enforce_retention=False) == []
    compact(path)
    gone = vacuum(path, retention_hours=0, enforce_retention=False)
    assert len(gone) == 10
    assert all(g.startswith(data_dir(Q, 0)[:-20]) for g in gone)
    # The uncommitted batches 5 and 6 are still there.
    assert _files(busy_table, data_dir(Q, 5)) == {f for f in before if f.startswith(data_dir(Q, 5))}
    assert (busy_table / data_dir(Q, 6) / "t-0.parquet").exists()
    assert read_delta_log(path).equals(expected(list(range(5))))


def test_compaction_meeting_a_file_deleted_by_hand_names_it_and_is_not_retriable(
    busy_table: Path,
) -> None:
    """A data file of the current version deleted outside Delta: compaction let deltalake's
    error out (exit 3 in the CLI, 75 where the store's error was an OSError), naming neither the
    file's place in the table nor a way on. Now: DataFileMissing, the version and the file."""
    path = str(busy_table)
    lost = sorted(_files(busy_table, data_dir(Q, 2)))[0]
    (busy_table / lost).unlink()
    with pytest.raises(DataFileMissing, match="FSCK REPAIR TABLE") as raised:
        compact(path)
    assert f"version {DeltaTable(path).version()} of the Delta table adds {lost}," in str(
        raised.value
    )
    assert not raised.value.retriable
    result = CliRunner().invoke(app, ["sink", "compact", path])
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert f"pidfence sink compact: error: {path}: version" in result.output
    assert lost in result.output and "run the same command again" not in result.output


def test_compaction_of_a_version_vacuumed_underneath_is_retriable(
    busy_table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction read a version whose files a newer commit removed and a vacuum deleted while
    it ran: a rerun reads the newer version and continues (VersionVacuumed, retriable)."""
    path = str(busy_table)
    read = DeltaTable(path).version()
    compact(path)  # the newer commit: every small file removed
    assert vacuum(path, retention_hours=0, enforce_retention=False)  # and deleted
    opened = care.open_table

    def stale_once(*args: object, **kwargs: object) -> DeltaTable:
        monkeypatch.setattr(care, "open_table", opened)
        return DeltaTable(path, version=read)

    monkeypatch.setattr(care, "open_table", stale_once)
    with pytest.raises(VersionVacuumed, match="nothing was committed") as raised:
        compact(path)
    assert raised.value.retriable
    monkeypatch.setattr(care, "open_table", stale_once)
    result = CliRunner().invoke(app, ["sink", "compact", path])
    assert result.exit_code == EXIT_RETRIABLE, result.output
    assert "pidfence sink compact: retriable:" in result.output
    assert read_delta_log(path).equals(expected(list(range(5))))


def test_vacuum_respects_the_retention_period(busy_table: Path) -> None:
    path = str(busy_table)
    compact(path)
    # Default retention (7 days): the files just replaced stay for readers of older versions.
    assert vacuum(path) == []
    assert len(_files(busy_table, data_dir(Q, 0))) == 2


def test_full_vacuum_keeps_uncommitted_batches_and_drops_orphans(busy_table: Path) -> None:
    path = str(busy_table)
    # An orphan: batch 7 wrote an extra partition before a crash; its re-run has only one.
    extra = stage_file(path, "log", Q, 7, "t", 9, log_rows("t", 9, 0, 2))
    with pytest.raises(Crash):
        commit_batch(path, "log", Q, 7, [extra], hook=_crash)
    with pytest.raises(Crash):
        run_batch(path, 5, hook=_crash)  # batch 5 still pending
    planned = vacuum(path, retention_hours=0, enforce_retention=False, full=True, dry_run=True)
    assert planned == []  # batch 7 and 5 are not committed: nothing of them goes
    commit_batch(path, "log", Q, 5, stage(path, 5))
    commit_batch(
        path, "log", Q, 7, [stage_file(path, "log", Q, 7, "t", 0, log_rows("t", 0, 99, 1))]
    )
    planned = vacuum(path, retention_hours=0, enforce_retention=False, full=True, dry_run=True)
    # Batch 6 was written and never committed, and the query went past it: orphans too.
    assert planned == [
        f"{data_dir(Q, 6)}/t-0.parquet",
        f"{data_dir(Q, 6)}/t-1.parquet",
        f"{data_dir(Q, 7)}/t-9.parquet",
    ]
    stage(path, 8)  # written, not committed: never touched
    assert vacuum(path, retention_hours=0, enforce_retention=False, full=True) == planned
    assert not (busy_table / data_dir(Q, 7) / "t-9.parquet").exists()
    assert (busy_table / data_dir(Q, 8) / "t-1.parquet").exists()
    assert read_delta_log(path).num_rows == expected(list(range(6))).num_rows + 1


def test_full_vacuum_keeps_the_batch_of_a_query_that_committed_none_yet(tmp_path: Path) -> None:
    # A new query on the output (a new checkpoint) has written its first batch, not committed
    # it: none of the table's transaction ids names it, and its files still stay.
    path = str(tmp_path)
    run_batch(path, 0)
    new_query = "9a8b7c6d-new-query"
    staged = stage(path, 0, query=new_query)
    assert vacuum(path, retention_hours=0, enforce_retention=False, full=True) == []
    assert all((tmp_path / rel).exists() for rel, _ in staged)
    assert commit_batch(path, "log", new_query, 0, staged)
    assert read_delta_log(path).num_rows == 2 * expected([0]).num_rows


def test_tables_of_an_output_name_its_rejects_table_once_it_exists(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    with pytest.raises(NotPidfenceTable, match="holds no Delta table"):
        tables_of(path)
    run_batch(path, 0)
    assert tables_of(path + "/") == [("log", path)]
    open_table(f"{path}/_rejects", "rejects")
    assert tables_of(path) == [("log", path), ("rejects", f"{path}/_rejects")]


def test_checkpoints_at_deltas_default_interval_and_log_cleanup(tmp_path: Path) -> None:
    # No delta.checkpointInterval in the table: Delta Lake's default, 10 (not delta-rs's 100):
    # versions 10 and 20 get checkpoints, as Spark's Delta writer writes them.
    path = str(tmp_path)
    open_table(path, "log")
    for b in range(21):
        commit_batch(path, "log", Q, b, [])
    log = tmp_path / "_delta_log"
    assert "delta.checkpointInterval" not in DeltaTable(path).metadata().configuration
    names = sorted(p.name for p in log.glob("*.checkpoint*"))
    assert names == [f"{v:020d}.checkpoint.parquet" for v in (10, 20)]
    # The transaction ids survive a reader that starts from the checkpoint.
    dt = DeltaTable(path)
    assert dt.transaction_version(Q) == 20
    assert not commit_batch(path, "log", Q, 19, [])
    assert checkpoint(path) == 21
    assert (log / f"{21:020d}.checkpoint.parquet").exists()
    # Log retention honoured: nothing is younger than 30 days here, so every commit stays.
    assert len(list(log.glob("*.json"))) == 22


@pytest.mark.parametrize(
    ("setting", "cleaned"), [("FALSE", False), ("False", False), ("true", True)]
)
def test_log_cleanup_after_a_checkpoint_honours_the_tables_setting(
    tmp_path: Path, setting: str, cleaned: bool
) -> None:
    # delta.enableExpiredLogCleanup is a boolean as Delta reads it (any case): a table that
    # turned cleanup off keeps its old commits, for time travel, however it spelled "false".
    path = str(tmp_path)
    open_table(path, "log")  # version 0
    DeltaTable(path).alter.set_table_properties(
        {"delta.enableExpiredLogCleanup": setting}, raise_if_not_exists=False
    )  # version 1
    for b in range(8):  # versions 2-9
        commit_batch(path, "log", Q, b, [])
    log = tmp_path / "_delta_log"
    long_ago = time.time() - 2 * 24 * 3600  # past the table's log retention (1 hour)
    for commit in log.glob("*.json"):
        os.utime(commit, (long_ago, long_ago))
    commit_batch(path, "log", Q, 8, [])  # version 10: a checkpoint, then the cleanup
    assert (log / f"{10:020d}.checkpoint.parquet").exists()
    assert (log / f"{0:020d}.json").exists() is not cleaned
    assert DeltaTable(path).transaction_version(Q) == 8
