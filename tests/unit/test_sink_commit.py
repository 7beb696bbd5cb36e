"""Commit protocol, replays, cleanup and state recovery of the sink writer (no Spark)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pidfence.spark_sink import SplitPartitionError, read_log, read_rejects
from pidfence.spark_sink import output as output_mod
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.delta.errors import DeltaTableError
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.errors import OutputOwnedError, SinkOptionError
from pidfence.spark_sink.manifest import BatchManifest
from pidfence.spark_sink.options import SinkOptions, parse_duration_ms
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from tests.unit.test_sink_process import (
    Record,
    expected_log,
    kafka_rows,
    make_stream,
    micro_batches,
    reference,
)

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "2"}
QUERY = "0f1e2d3c-query-a"


def _writer(path: Path) -> PidfenceStreamWriter:
    return PidfenceStreamWriter(SinkOptions.parse({"path": str(path), **SETTINGS}))


def _write(
    monkeypatch: pytest.MonkeyPatch, w: PidfenceStreamWriter, batch: int, table: pa.Table
) -> SinkCommitMessage:
    monkeypatch.setattr(writer_mod, "_task_context", lambda: (batch, 0, QUERY))
    return w.write(iter(table.to_batches(max_chunksize=17)))


def _committed(
    monkeypatch: pytest.MonkeyPatch, path: Path, chunks: list[list[Record]]
) -> PidfenceStreamWriter:
    """A writer at ``path`` that has written and committed each chunk as one micro-batch."""
    w = _writer(path)
    for b, chunk in enumerate(chunks):
        w.commit([_write(monkeypatch, w, b, kafka_rows(chunk))], b)
    return w


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_log_across_batches_equals_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = make_stream(11, 500)
    _committed(monkeypatch, tmp_path, micro_batches(records, 50))
    expected, dropped = reference(records, capacity=64, lifetime_ms=10_000_000, reorder_window=3)
    log = read_log(str(tmp_path))
    assert log["offset"].to_pylist() == expected
    assert log["log_offset"].to_pylist() == list(range(len(expected)))
    rej = read_rejects(str(tmp_path))
    assert dict(zip(rej["offset"].to_pylist(), rej["verdict"].to_pylist(), strict=True)) == (
        dropped
    )


def test_replayed_batch_rewrites_identical_files_and_commit_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = micro_batches(make_stream(3, 200), 50)
    w = _committed(monkeypatch, tmp_path, chunks)
    before = _files(tmp_path)
    last = len(chunks) - 1
    msg = _write(monkeypatch, w, last, kafka_rows(chunks[last]))  # Spark re-runs the last batch
    w.commit([msg], last)
    w.commit([msg], last)
    assert _files(tmp_path) == before


def test_uncommitted_batch_is_invisible_and_cleaned_by_its_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = micro_batches(make_stream(4, 120), 60)
    w = _committed(monkeypatch, tmp_path, chunks[:1])
    visible = read_log(str(tmp_path))
    dead = _write(monkeypatch, w, 1, kafka_rows(chunks[1]))  # written, never committed
    assert read_log(str(tmp_path)).equals(visible)
    data = tmp_path / "data" / QUERY / f"{1:020d}"
    assert dead.tag is not None and any(dead.tag in p.name for p in data.iterdir())
    # Spark re-runs the batch: its commit removes the dead attempt's files.
    w.commit([_write(monkeypatch, w, 1, kafka_rows(chunks[1]))], 1)
    assert not any(dead.tag in p.name for p in tmp_path.rglob("*.parquet"))
    assert read_log(str(tmp_path)).num_rows > visible.num_rows


def _intent_left_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[list[Any], list[Any], PidfenceStreamWriter, SinkCommitMessage]:
    """Batch 0 committed; batch 1 written, then its driver died after the batch's manifest (its
    intent), before any Delta commit: (records, chunks, writer, batch 1's message)."""
    records = make_stream(4, 120)
    chunks = micro_batches(records, 60)
    w = _committed(monkeypatch, tmp_path, chunks[:1])
    first = _write(monkeypatch, w, 1, kafka_rows(chunks[1]))

    def driver_dies(*args: Any, **kwargs: Any) -> bool:
        raise OSError("driver died")

    monkeypatch.setattr(output_mod, "commit_files", driver_dies)
    with pytest.raises(OSError, match="driver died"):
        w.commit([first], 1)
    monkeypatch.undo()
    return records, chunks, w, first


def test_an_intent_naming_a_file_that_is_gone_is_replaced_by_the_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver died after the batch's manifest (its intent), before any Delta commit; then a
    file the intent names went (a VACUUM outside pidfence, another instance's cleanup). The rerun
    commits its own files instead of failing on the missing one at every rerun (exit 75
    forever, before)."""
    records, chunks, w, first = _intent_left_behind(monkeypatch, tmp_path)
    assert first.tag is not None
    gone = [p for p in (tmp_path / "data").rglob("*.parquet") if first.tag in p.name]
    assert gone
    for path in gone:
        path.unlink()
    w.commit([_write(monkeypatch, w, 1, kafka_rows(chunks[1]))], 1)
    expected, _ = reference(records, capacity=64, lifetime_ms=10_000_000, reorder_window=3)
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected


def test_a_rerun_commits_the_intent_it_finds_whole_and_the_rejects_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver died after the batch's manifest (its intent), before any Delta commit. The
    rerun commits the files the intent names, not its own: a twin driver, or an attempt that
    decided otherwise (another authority answer), must never make a batch mean two things.
    The rejects table commits before the log table, whose commit is the batch's."""
    _, chunks, w, first = _intent_left_behind(monkeypatch, tmp_path)
    second = _write(monkeypatch, w, 1, kafka_rows(chunks[1]))
    order: list[str] = []
    commit_files = output_mod.commit_files

    def recorded(table: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        order.append(kind)
        return commit_files(table, kind, *args, **kwargs)

    monkeypatch.setattr(output_mod, "commit_files", recorded)
    w.commit([second], 1)
    assert first.tag is not None and second.tag is not None
    committed = {p.name for p in (tmp_path / "data").rglob("*.parquet")}
    assert any(first.tag in name for name in committed)
    assert order == ["rejects", "log"]
    log = DeltaTable(str(tmp_path)).file_uris()
    assert any(first.tag in uri for uri in log) and not any(second.tag in uri for uri in log)


def test_decisions_a_manifest_names_are_never_read_as_none_when_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that decided records names its decisions file; if it is gone (and no segment holds
    it) reading it is an error, not "decided nothing", which a rebuild or a fold would take as
    records the state never saw."""
    _committed(monkeypatch, tmp_path, micro_batches(make_stream(4, 120), 60))
    output = Output.reading(str(tmp_path))
    manifest = output.committed(0)
    assert manifest is not None
    part = next(p for p in manifest.parts if p.files.decided is not None)
    assert output.read_decided(0, part) is not None
    (tmp_path / OWN_DIR / part.files.decided).unlink()
    with pytest.raises(DeltaTableError, match=r"decisions are gone.*damaged"):
        output.read_decided(0, part)


def test_abort_removes_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _writer(tmp_path)
    msg = _write(monkeypatch, w, 0, kafka_rows(make_stream(5, 40)))
    w.abort([msg, None], 0)
    assert read_log(str(tmp_path)).num_rows == 0
    assert not any(p.is_file() for p in tmp_path.rglob("*.parquet"))


def test_a_refused_querys_abort_leaves_the_owners_staged_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job started twice with fresh checkpoints: query B's tasks are refused (the
    output is A's), Spark aborts B's batch 0 with no messages. A's batch 0 is staged, not yet
    committed; B's abort must leave it, and A's commit then publishes every record."""
    records = make_stream(5, 40)
    w = _writer(tmp_path)
    staged = _write(monkeypatch, w, 0, kafka_rows(records))
    before = _files(tmp_path)
    monkeypatch.setattr(writer_mod, "_task_context", lambda: (0, 0, "query-b"))
    with pytest.raises(OutputOwnedError):
        w.write(iter(kafka_rows(records).to_batches()))
    refused = PidfenceStreamWriter(SinkOptions.parse({"path": str(tmp_path), **SETTINGS}))
    refused.abort([None], 0)
    assert _files(tmp_path) == before
    w.commit([staged], 0)
    expected, _ = reference(records, capacity=64, lifetime_ms=10_000_000, reorder_window=3)
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected


def test_two_tasks_for_one_partition_publish_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = make_stream(6, 40)
    w = _writer(tmp_path)
    a = _write(monkeypatch, w, 0, kafka_rows(records[:20]))
    b = _write(monkeypatch, w, 0, kafka_rows(records[20:]))
    with pytest.raises(SplitPartitionError, match="two tasks"):
        w.commit([a, b], 0)
    assert not (tmp_path / OWN_DIR / "_manifests").exists()


def test_partitions_in_one_task_are_kept_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = make_stream(7, 80)
    both = pa.concat_tables([kafka_rows(recs, "t", 0), kafka_rows(recs, "t", 1)])
    w = _writer(tmp_path)
    w.commit([_write(monkeypatch, w, 0, both)], 0)
    log = read_log(str(tmp_path))
    per = log.group_by("partition").aggregate([("log_offset", "count")]).to_pylist()
    assert sorted((r["partition"], r["log_offset_count"]) for r in per) == [
        (0, log.num_rows // 2),
        (1, log.num_rows // 2),
    ]


def test_staged_files_and_delta_commits_are_flushed_before_anything_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fsync per staged file: ``publish`` flushes the file system once before the manifest
    names the batch's files, and after each Delta commit (deltalake does not fsync them)."""
    from pidfence.spark_sink import output as output_mod
    from pidfence.spark_sink.storage import Store

    dirty: set[str] = set()
    write_table, put_staged, sync = Store.write_table, Store.put_staged, Store.sync
    put_if_absent, commit_files = Store.put_if_absent, output_mod.commit_files

    def staged(original: Any) -> Any:
        def write(self: Store, path: str, *args: Any) -> None:
            dirty.add(path)
            original(self, path, *args)

        return write

    def flush(self: Store) -> None:
        dirty.clear()
        sync(self)

    def manifest(self: Store, path: str, data: bytes) -> bool:
        if "_manifests" in path:
            named = BatchManifest.decode(data).named()
            unflushed = [p for p in dirty for n in named if p.endswith(f"/{n}")]
            assert not unflushed, f"the manifest names files not flushed yet: {unflushed}"
        return bool(put_if_absent(self, path, data))

    def commit(table: Store, kind: str, *args: Any, **kwargs: Any) -> bool:
        assert "rejects-commit" not in dirty, "the log's commit point before the rejects flushed"
        done = bool(commit_files(table, kind, *args, **kwargs))
        dirty.add(f"{kind}-commit")
        return done

    monkeypatch.setattr(Store, "write_table", staged(write_table))
    monkeypatch.setattr(Store, "put_staged", staged(put_staged))
    monkeypatch.setattr(Store, "sync", flush)
    monkeypatch.setattr(Store, "put_if_absent", manifest)
    monkeypatch.setattr(output_mod, "commit_files", commit)
    records = make_stream(21, 300)  # resends: every batch has rejects
    w = _writer(tmp_path)
    for b, chunk in enumerate(micro_batches(records, 100)):
        w.commit([_write(monkeypatch, w, b, kafka_rows(chunk))], b)
        assert "log-commit" not in dirty, "batch committed before its Delta commit was flushed"
    assert read_rejects(str(tmp_path)).num_rows > 0


@pytest.mark.parametrize("damage", ["delete", "corrupt", "delete_all"])
def test_lost_newest_state_is_rebuilt_from_older_state_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    records = make_stream(8, 600)
    chunks = micro_batches(records, 60)
    w = _committed(monkeypatch, tmp_path, chunks[:-1])
    state_dir = tmp_path / OWN_DIR / "_state" / "t~0"
    newest = sorted(state_dir.iterdir())[-1]
    if damage == "delete":
        newest.unlink()
    elif damage == "corrupt":
        newest.write_bytes(newest.read_bytes()[:-7] + b"garbage")
    else:
        for f in state_dir.iterdir():
            f.unlink()
    last = len(chunks) - 1
    w.commit([_write(monkeypatch, w, last, kafka_rows(chunks[last]))], last)
    # No producer here holds records across the damaged batch, so recovery is exact.
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected_log(records)


def test_state_is_incremental_with_periodic_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(monkeypatch, tmp_path, micro_batches(make_stream(9, 600), 40))
    kinds = [
        n.rpartition(".")[2] for n in sorted(os.listdir(tmp_path / OWN_DIR / "_state" / "t~0"))
    ]
    assert "delta" in kinds and kinds.count("full") <= 2
    # compactEvery=2: never more than 2 deltas after a full.
    run = 0
    for kind in kinds:
        run = 0 if kind == "full" else run + 1
        assert run <= 2


def test_the_docs_table_is_the_declarations() -> None:
    from pidfence.spark_sink.options import options_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "sink.md").read_text()
    assert options_table() in page


def test_options_are_validated() -> None:
    assert parse_duration_ms("15m") == 900_000
    assert parse_duration_ms("250") == 250
    with pytest.raises(SinkOptionError, match=r"^duration 'soon' is not a duration"):
        parse_duration_ms("soon")
    with pytest.raises(SinkOptionError, match=r"^lifetime 'soon'"):
        parse_duration_ms("soon", "lifetime")
    # A minimum holds for the duration, not the number before its unit: 30s passes 1000 ms.
    assert SinkOptions.parse({"path": "/x", "claimLapse": "30s"}).claim_lapse_ms == 30_000
    with pytest.raises(SinkOptionError, match="claimLapse '500ms' is a duration shorter than 1s"):
        SinkOptions.parse({"path": "/x", "claimLapse": "500ms"})
    with pytest.raises(SinkOptionError, match="claimLapse"):
        SinkOptions.parse({"path": "/x", "claimLapse": "999"})
    with pytest.raises(SinkOptionError, match="path"):
        SinkOptions.parse({})
    with pytest.raises(SinkOptionError, match="capacity"):
        SinkOptions.parse({"path": "/x", "capacity": "0"})
    opts = SinkOptions.parse({"path": "/x/", "reorderWindow": "0"})
    assert opts.rejects_path == "/x/_rejects" and opts.reorder_window == 0
    # A store without a conditional create the sink can use is refused for either table.
    with pytest.raises(SinkOptionError, match=r"path gs://b/out: .*no conditional create"):
        SinkOptions.parse({"path": "gs://b/out"})
    with pytest.raises(SinkOptionError, match="rejectsPath abfs://"):
        SinkOptions.parse({"path": "s3://b/out", "rejectsPath": "abfs://c/rejects"})


@pytest.mark.parametrize("where", ["s3a://b/out", "s3://b/out", "file:///tmp/out", "/tmp/out"])
def test_stores_with_a_conditional_create_are_accepted(where: str) -> None:
    """An S3-compatible store by either of its names, or a local disk, holds the output."""
    opts = SinkOptions.parse({"path": where})
    assert opts.path == where and opts.rejects_path == f"{where}/_rejects"


def test_batch_without_a_partition_keeps_its_state_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recs = make_stream(12, 90)
    w = _writer(tmp_path)
    w.commit([_write(monkeypatch, w, 0, kafka_rows(recs[:30], "t", 0))], 0)
    w.commit([_write(monkeypatch, w, 1, kafka_rows(recs[:30], "t", 1))], 1)  # t~0 idle
    w.commit([_write(monkeypatch, w, 2, kafka_rows(recs[30:], "t", 0))], 2)
    # Batch 2 continues batch 0's chain with a delta: no full snapshot, no roll-forward.
    names = sorted(p.name for p in (tmp_path / OWN_DIR / "_state" / "t~0").iterdir())
    assert [(n.split(".")[0], n.split(".")[2]) for n in names] == [
        (f"{0:020d}", "full"),
        (f"{2:020d}", "delta"),
    ]
    expected, _ = reference(recs, capacity=64, lifetime_ms=10_000_000, reorder_window=3)
    log = read_log(str(tmp_path))
    assert log.filter(pc.equal(log["partition"], 0))["offset"].to_pylist() == (expected)


def test_batch_watcher_reports_each_committed_batch_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pidfence.spark_sink.batch_report import BatchWatcher

    class Progress:
        def __init__(self, batch: int) -> None:
            self.json = (
                f'{{"batchId": {batch}, "sources": [{{"metrics": '
                f'{{"maxOffsetsBehindLatest": "{batch * 10}"}}}}]}}'
            )

    class Query:
        recentProgress: list[Progress] = []

    recs = make_stream(13, 60)
    w = _writer(tmp_path)
    watcher = BatchWatcher(str(tmp_path))
    w.commit([_write(monkeypatch, w, 0, kafka_rows(recs[:30]))], 0)
    assert watcher.poll(Query()) == []  # waits for batch 0's progress (its lag)
    Query.recentProgress = [Progress(0)]
    lines = watcher.poll(Query())
    assert [(x.batch, x.records_in, x.lag) for x in lines] == [(0, 30, 0)]
    w.commit([_write(monkeypatch, w, 1, kafka_rows(recs[30:]))], 1)
    lines = watcher.poll(Query(), final=True)
    assert [(x.batch, x.records_in, x.lag) for x in lines] == [(1, 30, None)]
    assert lines[0].appended + sum(lines[0].dropped.values()) <= 30
    assert watcher.poll(Query(), final=True) == []
