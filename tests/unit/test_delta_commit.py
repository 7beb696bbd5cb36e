"""Batch commits through Delta transaction ids: once per (query, batch), conflicts, races."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.spark_sink.delta import commit as commit_mod
from pidfence.spark_sink.delta.care import compact
from pidfence.spark_sink.delta.commit import committed_version
from pidfence.spark_sink.delta.errors import RestoredPastSink, StagedFileMissing
from pidfence.spark_sink.delta.table import TableKind, open_table
from pidfence.spark_sink.readers import read_log, read_table
from tests.unit.delta_kit import Files, commit_batch, data_dir, stage_file
from tests.unit.test_delta_table import log_rows

Q = "4f1c2a9e-query"
PER_BATCH = 4


def batch_rows(batch: int, partitions: int = 2) -> dict[int, pa.Table]:
    """The rows of one batch per partition (log offsets continue from earlier batches)."""
    return {p: log_rows("t", p, batch * PER_BATCH, PER_BATCH) for p in range(partitions)}


def stage(path: str, batch: int, query: str = Q, kind: TableKind = "log") -> Files:
    """Executor side of one batch: one file per partition."""
    return [
        stage_file(path, kind, query, batch, "t", p, rows) for p, rows in batch_rows(batch).items()
    ]


def run_batch(path: str, batch: int, query: str = Q, **kwargs: object) -> bool:
    """A whole batch: write, then commit (the table is created first, as the sink does)."""
    open_table(path, "log")
    return commit_batch(path, "log", query, batch, stage(path, batch, query), **kwargs)  # type: ignore[arg-type]


def expected(batches: list[int]) -> pa.Table:
    """The log holding these batches once each."""
    parts = [rows for b in sorted(set(batches)) for rows in batch_rows(b).values()]
    if not parts:
        return log_rows("t", 0, 0, 0)
    return pa.concat_tables(parts).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    )


def test_each_batch_commits_once_with_its_transaction_id(tmp_path: Path) -> None:
    path = str(tmp_path)
    open_table(path, "log")
    assert run_batch(path, 0)
    assert run_batch(path, 1)
    dt = DeltaTable(path)
    assert committed_version(dt, Q) == 1
    assert dt.version() == 2  # create + one commit per batch
    # The re-run of a committed batch (and of an older one) is a no-op: no new version.
    assert not run_batch(path, 1)
    assert not run_batch(path, 0)
    dt.update_incremental()
    assert dt.version() == 2
    assert read_log(path).equals(expected([0, 1]))
    # Each commit adds exactly its batch's files, and carries the transaction id.
    files = sorted(pa.table(DeltaTable(path).get_add_actions()).column("path").to_pylist())
    assert files == sorted(f"{data_dir(Q, b)}/t-{p}.parquet" for b in (0, 1) for p in (0, 1))
    history = DeltaTable(path).history(1)[0]
    assert history["pidfence.batch"] == 1
    assert history["pidfence.query"] == Q
    # Named as Spark's Delta sink names its commits (DESCRIBE HISTORY shows both).
    assert history["operationParameters"]["queryId"] == Q
    assert history["operationParameters"]["epochId"] == "1"
    assert history["userMetadata"] == f"pidfence-sink query {Q} batch 1"
    assert history["isBlindAppend"] is True


def test_queries_have_their_own_transaction_ids(tmp_path: Path) -> None:
    # A new checkpoint (new query id) restarts batch ids at 0; its batch 0 is not the old one's.
    path = str(tmp_path)
    assert run_batch(path, 0, "old")
    assert commit_batch(
        path, "log", "new", 0, [stage_file(path, "log", "new", 0, "t", 5, log_rows("t", 5, 0, 2))]
    )
    dt = DeltaTable(path)
    assert committed_version(dt, "old") == 0
    assert committed_version(dt, "new") == 0
    assert read_log(path).num_rows == 2 * PER_BATCH + 2


def test_empty_batch_commits_its_transaction_id(tmp_path: Path) -> None:
    path = str(tmp_path)
    open_table(path, "log")
    assert commit_batch(path, "log", Q, 0, [])
    assert committed_version(DeltaTable(path), Q) == 0
    assert not commit_batch(path, "log", Q, 0, [])


def test_crash_after_publish_then_rerun_commits_once(tmp_path: Path) -> None:
    path = str(tmp_path)
    run_batch(path, 0)

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "checked":
            raise Crash(point)

    with pytest.raises(Crash):
        run_batch(path, 1, hook=crash)
    # The files are in data/ but not in the table: no reader sees them.
    assert (tmp_path / data_dir(Q, 1) / "t-0.parquet").exists()
    assert read_log(path).equals(expected([0]))
    # The commit alone re-run (files already in place, no stats: read from their footers),
    # then the whole batch re-run.
    files: Files = [(f"{data_dir(Q, 1)}/t-{p}.parquet", None) for p in (0, 1)]
    assert commit_batch(path, "log", Q, 1, files)
    assert not run_batch(path, 1)
    assert read_log(path).equals(expected([0, 1]))


def test_missing_staged_file_commits_nothing(tmp_path: Path) -> None:
    path = str(tmp_path)
    open_table(path, "log")
    files = stage(path, 0)
    (tmp_path / files[0][0]).unlink()
    with pytest.raises(StagedFileMissing, match="Re-run the batch") as info:
        commit_batch(path, "log", Q, 0, files)
    assert info.value.retriable
    assert committed_version(DeltaTable(path), Q) is None
    assert run_batch(path, 0)
    assert read_log(path).equals(expected([0]))


def _inject(action: Callable[[], None]) -> Callable[[str], None]:
    done: list[bool] = []

    def hook(point: str) -> None:
        if point == "checked" and not done:
            done.append(True)
            action()

    return hook


def test_a_foreign_append_during_the_batch_loses_nothing_and_the_batch_lands(
    tmp_path: Path,
) -> None:
    # Another writer appends between the sink's check and its commit: the sink's commit loses
    # the race, checks what landed (a blind append) and commits on top of it.
    path = str(tmp_path)
    run_batch(path, 0)
    foreign = log_rows("t", 9, 0, 1, tag="foreign")
    hook = _inject(lambda: write_deltalake(path, foreign, mode="append"))
    assert run_batch(path, 1, hook=hook)
    assert committed_version(DeltaTable(path), Q) == 1
    rows = read_log(path)
    assert rows.num_rows == expected([0, 1]).num_rows + 1
    assert rows.filter(pa.compute.equal(rows["partition"], 9)).num_rows == 1
    # And between batches, as often as it likes.
    write_deltalake(path, log_rows("t", 9, 1, 2, tag="foreign"), mode="append")
    assert run_batch(path, 2)
    assert committed_version(DeltaTable(path), Q) == 2


def test_a_restore_past_a_batch_that_lost_a_race_stops_the_next_batch(tmp_path: Path) -> None:
    # The batch loses its race to a foreign append and lands one version later than it read.
    # The sink must know the version it really landed at: a RESTORE to the foreign append's
    # version takes batch 1's rows away, and the next batch must stop rather than commit on top.
    path = str(tmp_path)
    run_batch(path, 0)  # version 1
    foreign = log_rows("t", 9, 0, 1, tag="foreign")
    hook = _inject(lambda: write_deltalake(path, foreign, mode="append"))  # version 2
    assert run_batch(path, 1, hook=hook)  # version 3
    assert [c["operation"] for c in DeltaTable(path).history(2)] == ["WRITE", "WRITE"]
    DeltaTable(path).restore(2)  # version 4: batch 1's rows gone
    with pytest.raises(RestoredPastSink, match="batch 1 \\(version 3\\)"):
        run_batch(path, 2)
    assert DeltaTable(path).version() == 4  # nothing committed


@pytest.mark.parametrize("last_attempt", [False, True])
def test_same_batch_committed_concurrently_lands_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last_attempt: bool
) -> None:
    # A second committer of the very same batch wins the race: the loser's call is a no-op,
    # also when that race was its last attempt (it committed nothing, yet lost nothing either).
    if last_attempt:
        monkeypatch.setattr(commit_mod, "MAX_ATTEMPTS", 1)
    path = str(tmp_path)
    run_batch(path, 0)
    staged = stage(path, 1)
    hook = _inject(lambda: commit_batch(path, "log", Q, 1, staged))
    assert not commit_batch(path, "log", Q, 1, staged, hook=hook)
    dt = DeltaTable(path)
    assert committed_version(dt, Q) == 1
    assert dt.version() == 2
    assert read_log(path).equals(expected([0, 1]))


def test_concurrent_compaction_does_not_fail_the_batch(tmp_path: Path) -> None:
    path = str(tmp_path)
    for b in range(3):
        run_batch(path, b)
    hook = _inject(lambda: compact(path))
    assert run_batch(path, 3, hook=hook)
    ops = [c["operation"] for c in DeltaTable(path).history(2)]
    assert ops == ["WRITE", "OPTIMIZE"]
    assert read_log(path).equals(expected([0, 1, 2, 3]))
    assert run_batch(path, 4)


def test_rejects_table_commits_the_same_way(tmp_path: Path) -> None:
    from tests.unit.test_delta_table import reject_rows

    path = str(tmp_path / "_rejects")
    open_table(path, "rejects")
    rows = reject_rows("t", 0, 0, 3, "FENCE")
    staged = stage_file(path, "rejects", Q, 0, "t", 0, rows)
    assert commit_batch(path, "rejects", Q, 0, [staged])
    assert not commit_batch(path, "rejects", Q, 0, [staged])
    assert read_table(path, "rejects").equals(rows)


# Operations of the property test: ("run", b) writes and commits batch b; ("replay", b) re-runs
# batch b (any b already run); ("crash", b) writes b and checks its files, then dies before the
# Delta commit; ("compact",) compacts the table.
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("run")),
        st.tuples(st.just("replay"), st.integers(0, 20)),
        st.tuples(st.just("crash")),
        st.tuples(st.just("compact")),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS)
def test_property_every_batch_lands_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[object, ...]]
) -> None:
    """For any interleaving of runs, replays, crashes before the commit and compactions, the
    table holds each batch that completed a commit exactly once, and nothing else."""
    path = str(tmp_path_factory.mktemp("prop"))
    open_table(path, "log")
    next_batch = 0
    done: list[int] = []

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "checked":
            raise Crash(point)

    for op in ops:
        if op[0] == "run":
            assert run_batch(path, next_batch)
            done.append(next_batch)
            next_batch += 1
        elif op[0] == "replay" and done:
            assert not run_batch(path, done[int(str(op[1])) % len(done)])
        elif op[0] == "crash":
            with pytest.raises(Crash):
                run_batch(path, next_batch, hook=crash)
            # Spark re-runs the batch after the restart.
            assert run_batch(path, next_batch)
            done.append(next_batch)
            next_batch += 1
        elif op[0] == "compact" and done:
            compact(path)
        assert read_log(path).equals(expected(done))
    if done:
        assert committed_version(DeltaTable(path), Q) == done[-1]
