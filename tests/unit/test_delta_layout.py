"""The sink's real writer (write() and commit(), no Spark) and its Delta output.

Each test checks the Delta tables with Delta readers alone: the log equals the per-record rules'
reference, replays and crashes between the commit steps change nothing, and the state rebuilt
from the committed Delta output (after compaction, with every state file lost) continues the log
exactly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pidfence.spark_sink import output as output_mod
from pidfence.spark_sink.delta import commit as commit_mod
from pidfence.spark_sink.delta import table as table_mod
from pidfence.spark_sink.delta import tip as tip_mod
from pidfence.spark_sink.delta.care import compact
from pidfence.spark_sink.delta.errors import RestoredPastSink, TableGone
from pidfence.spark_sink.delta.stats import footer_stats
from pidfence.spark_sink.delta.table import NotPidfenceTable
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output, open_output
from pidfence.spark_sink.readers import read_log as read_delta_log
from pidfence.spark_sink.readers import read_table
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.wire import encode_pf
from tests.unit.test_sink_process import (
    Record,
    commit_batches,
    make_stream,
    micro_batches,
    reference,
    write_as_task,
)

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "2"}
RULES = {"capacity": 64, "lifetime_ms": 10_000_000, "reorder_window": 3}
QUERY = "0f1e2d3c-delta-query"


@pytest.fixture
def writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PidfenceStreamWriter]:
    """The sink's writer, its tables opened as the driver would."""
    options = SinkOptions.parse({"path": str(tmp_path), **SETTINGS})
    open_output(options.path, options.rejects_path, QUERY)
    yield PidfenceStreamWriter(options)


_write = partial(write_as_task, query=QUERY)


def _stream(seed: int, n: int, size: int = 50) -> tuple[list[Record], list[list[Record]]]:
    """A crafted stream of ``n`` records (:func:`make_stream`) and its micro-batches."""
    records = make_stream(seed, n)
    return records, micro_batches(records, size)


_commit_batches = partial(commit_batches, query=QUERY)


def _committed_stream(
    monkeypatch: pytest.MonkeyPatch, writer: PidfenceStreamWriter, seed: int, n: int
) -> tuple[list[Record], list[list[Record]]]:
    """:func:`_stream` of micro-batches of 50, each written and committed."""
    records, chunks = _stream(seed, n)
    _commit_batches(monkeypatch, writer, chunks)
    return records, chunks


def _check(path: Path, records: list[Record]) -> None:
    """The Delta tables, read by deltalake alone, hold exactly the reference output."""
    expected, dropped = reference(records, **RULES)
    log = DeltaTable(str(path)).to_pyarrow_table().sort_by("log_offset")
    assert log["offset"].to_pylist() == expected
    assert log["log_offset"].to_pylist() == list(range(len(expected)))
    rejects = DeltaTable(str(path / "_rejects")).to_pyarrow_table()
    got = dict(zip(rejects["offset"].to_pylist(), rejects["verdict"].to_pylist(), strict=True))
    assert len(got) == rejects.num_rows  # no reject twice
    assert got == {k: v for k, v in dropped.items() if k <= max(o for o, _, _ in records)}


def test_log_equals_reference_in_every_reader(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _committed_stream(monkeypatch, writer, 11, 500)
    _check(tmp_path, records)
    dt = DeltaTable(str(tmp_path))
    assert dt.transaction_version(QUERY) == len(chunks) - 1
    assert pl.read_delta(str(tmp_path)).height == dt.to_pyarrow_table().num_rows
    assert read_delta_log(str(tmp_path)).num_rows == dt.to_pyarrow_table().num_rows
    # Only Delta's own files and pidfence's hidden directory under the table root.
    visible = {p.name for p in tmp_path.iterdir() if not p.name.startswith("_")}
    assert visible == {"data"}


def _versions(path: Path) -> tuple[int, int]:
    return DeltaTable(str(path)).version(), DeltaTable(str(path / "_rejects")).version()


def test_replayed_and_recommitted_batches_change_nothing(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _committed_stream(monkeypatch, writer, 3, 200)
    versions = _versions(tmp_path)
    last = len(chunks) - 1
    msg = _write(monkeypatch, writer, last, chunks[last], attempt=1)  # Spark re-runs the batch
    assert msg.committed
    writer.commit([msg], last)
    writer.commit([msg], last)
    assert _versions(tmp_path) == versions
    _check(tmp_path, records)


class Crash(Exception):
    """The driver dies here."""


def commit_files_dying_at(kind: str) -> Callable[..., bool]:
    """``output.commit_files`` that dies (raises :class:`Crash`) instead of committing ``kind``."""
    real = output_mod.commit_files

    def commit_files(table: Store, what: str, *args: Any, **kwargs: Any) -> bool:
        if what == kind:
            raise Crash(what)
        return real(table, what, *args, **kwargs)  # type: ignore[arg-type]

    return commit_files


def test_crash_between_the_rejects_and_the_log_commit(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _stream(5, 300)
    real = output_mod.commit_files
    die_before_log = commit_files_dying_at("log")

    for b, chunk in enumerate(chunks):
        msg = _write(monkeypatch, writer, b, chunk)
        if b == 2:
            monkeypatch.setattr(output_mod, "commit_files", die_before_log)
            with pytest.raises(Crash):
                writer.commit([msg], b)
            monkeypatch.setattr(output_mod, "commit_files", real)
            # Not committed: the log has batch 1 as its newest; the re-run writes a new attempt.
            assert DeltaTable(str(tmp_path)).transaction_version(QUERY) == 1
            assert DeltaTable(str(tmp_path / "_rejects")).transaction_version(QUERY) == 2
            msg = _write(monkeypatch, writer, b, chunk, attempt=1)
            assert not msg.committed
        writer.commit([msg], b)
    _check(tmp_path, records)


def test_crash_after_staging_then_rerun(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _stream(7, 300)
    for b, chunk in enumerate(chunks):
        msg = _write(monkeypatch, writer, b, chunk)
        if b == 3:
            # The driver died before commit(): Spark re-runs the whole batch after a restart.
            msg = _write(monkeypatch, writer, b, chunk, attempt=1)
        writer.commit([msg], b)
    _check(tmp_path, records)
    files = {p.name for p in (tmp_path / "data" / QUERY / f"{3:020d}").glob("*.parquet")}
    assert len(files) == 1  # the dead attempt's files were discarded with the commit


def test_state_rebuilt_from_the_delta_output_after_compaction(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _stream(13, 600, 40)
    half = len(chunks) // 2
    _commit_batches(monkeypatch, writer, chunks[:half])
    compact(str(tmp_path))
    compact(str(tmp_path / "_rejects"), "rejects")
    # Every state file is lost: the next batch rebuilds the state from the committed output
    # (the compacted Delta rows plus the committed held records).
    shutil.rmtree(tmp_path / "_pidfence" / "_state")
    _commit_batches(monkeypatch, writer, chunks[half:], start=half)
    _check(tmp_path, records)


def test_deleted_rows_stay_deleted_when_replayed_upstream_even_with_state_files_lost(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, chunks = _committed_stream(monkeypatch, writer, 17, 300)
    path = str(tmp_path)
    before = read_delta_log(path)
    gone = before.filter(pa.compute.equal(before["pid"], 1))
    assert gone.num_rows > 3
    # The table's owner deletes a producer's rows (GDPR), another writer appends beside the
    # sink, table care rewrites and vacuums every file, and every state file is lost.
    DeltaTable(path).delete("pid = 1")
    write_deltalake(path, before.slice(0, 1), mode="append")
    compact(path)
    DeltaTable(path).vacuum(0, enforce_retention_duration=False, dry_run=False)
    shutil.rmtree(tmp_path / "_pidfence" / "_state")
    # Upstream replays the deleted records (same pf headers, new Kafka offsets).
    end = records[-1][0] + 1
    replay: list[Record] = [
        (end + i, encode_pf(r["pid"], r["generation"], r["seq"]), 10**6 + i)
        for i, r in enumerate(gone.to_pylist())
    ]
    b = len(chunks)
    writer.commit([_write(monkeypatch, writer, b, replay)], b)
    rejects = read_table(str(tmp_path / "_rejects"), "rejects")
    replayed = rejects.filter(pa.compute.greater_equal(rejects["offset"], end))
    # Exactly the rules' decisions over the whole stream: DUPLICATE (or FENCED, a generation
    # since bumped), never appended again.
    _, dropped = reference(records + replay, **RULES)
    want = {o: dropped[o] for o, _, _ in replay}
    got = zip(replayed["offset"].to_pylist(), replayed["verdict"].to_pylist(), strict=True)
    assert dict(got) == want
    assert set(want.values()) <= {"DUPLICATE", "FENCED"} and "DUPLICATE" in want.values()
    after = read_delta_log(path)
    assert after.filter(pa.compute.equal(after["pid"], 1)).num_rows == 0  # still deleted
    assert after.num_rows == before.num_rows - gone.num_rows + 1
    # The sink's log offsets went on from its own commits, not from the rows left.
    manifest = Output(path, str(tmp_path / "_rejects"), QUERY).committed(b)
    assert manifest is not None
    part = manifest.parts[0]
    assert part.log_start == part.log_end == before["log_offset"].to_pylist()[-1] + 1


def test_uncommitted_manifest_is_not_a_committed_batch(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, chunks = _stream(19, 150)
    writer.commit([_write(monkeypatch, writer, 0, chunks[0])], 0)
    msg = _write(monkeypatch, writer, 1, chunks[1])
    real = output_mod.commit_files

    def die(*args: Any, **kwargs: Any) -> bool:
        raise Crash("before any Delta commit")

    monkeypatch.setattr(output_mod, "commit_files", die)
    with pytest.raises(Crash):
        writer.commit([msg], 1)
    monkeypatch.setattr(output_mod, "commit_files", real)
    layout = Output(str(tmp_path), str(tmp_path / "_rejects"), QUERY)
    assert (tmp_path / "_pidfence" / "_manifests" / f"{1:020d}.json").exists()
    assert layout.committed(1) is None
    assert layout.last_committed_before(5) == 0
    assert read_table(str(tmp_path / "_rejects"), "rejects").num_rows == len(
        [k for k in reference(chunks[0], **RULES)[1]]
    )


def test_open_refuses_a_foreign_table(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), pa.table({"x": [1]}))
    with pytest.raises(NotPidfenceTable):
        open_output(str(tmp_path), str(tmp_path / "_rejects"), QUERY)
    assert not (tmp_path / "_rejects").exists()


def test_file_uri_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same output through a URI (as on object stores): deltalake and pyarrow.fs agree.
    uri = f"file://{tmp_path}"
    options = SinkOptions.parse({"path": uri, **SETTINGS})
    open_output(options.path, options.rejects_path, QUERY)
    w = PidfenceStreamWriter(options)
    records, _ = _committed_stream(monkeypatch, w, 29, 150)
    _check(tmp_path, records)


def test_commit_adds_the_statistics_the_tasks_took(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tasks take each file's Delta statistics from the rows they wrote; the driver's commit
    # reads no footer, and adds exactly what the footers say.
    def no_footer(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the commit read a footer")

    monkeypatch.setattr(commit_mod, "footer_stats", no_footer)
    records = make_stream(31, 300)
    for b, chunk in enumerate(micro_batches(records, 100)):
        writer.commit([_write(monkeypatch, writer, b, chunk)], b)
    monkeypatch.undo()
    output = Output(str(tmp_path), str(tmp_path / "_rejects"), QUERY)
    parts = [p for m in output.manifests() for p in m.parts]
    assert all("log" in p.files.stats for p in parts)
    assert any("rejects" in p.files.stats for p in parts)
    for root in (tmp_path, tmp_path / "_rejects"):
        adds = [
            action["add"]
            for commit in sorted((root / "_delta_log").glob("*.json"))
            for action in map(json.loads, commit.read_text().splitlines())
            if "add" in action
        ]
        assert adds
        for add in adds:
            footer = footer_stats(Store.at(str(root)), add["path"])
            assert json.loads(add["stats"]) == json.loads(footer), add["path"]


def test_open_again_in_the_same_process_refuses_what_a_fresh_open_refuses(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark builds a writer per batch: a process that opened the tables re-checks its kept
    # ones, and anything different (a table replaced or deleted) is still refused.
    writer.commit([_write(monkeypatch, writer, 0, make_stream(37, 50))], 0)
    path, rejects = str(tmp_path), str(tmp_path / "_rejects")
    open_output(path, rejects, QUERY, committed_before=True)
    shutil.rmtree(tmp_path / "_rejects")
    with pytest.raises(TableGone):
        open_output(path, rejects, QUERY, committed_before=True)
    shutil.rmtree(tmp_path / "_delta_log")
    write_deltalake(path, pa.table({"x": [1]}))
    with pytest.raises(NotPidfenceTable):
        open_output(path, rejects, QUERY)


def _query_of_three_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copied_after: int | None = None
) -> tuple[PidfenceStreamWriter, list[list[Record]]]:
    """A running query's writer (its checkpoint at ``tmp_path/checkpoint``, its output at
    ``tmp_path/out``) after batches 0-2, each recorded committed as Spark records it; the output
    copied to ``tmp_path/backup`` before batch ``copied_after``. Returns it and its chunks."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = SinkOptions.parse(
        {"path": str(out), "checkpointLocation": str(checkpoint), **SETTINGS}
    )
    open_output(options.path, options.rejects_path, QUERY)
    running = PidfenceStreamWriter(options, QUERY)
    _, chunks = _stream(38, 250)
    (checkpoint / "commits").mkdir(parents=True)
    for batch in range(3):
        if batch == copied_after:
            shutil.copytree(out, tmp_path / "backup")
        _commit_batches(monkeypatch, running, chunks[batch : batch + 1], start=batch)
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")  # Spark, after commit()
    return running, chunks


def _in_a_new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process read of the tables, as a new Python worker would not know it."""
    monkeypatch.setattr(tip_mod, "_TIPS", {})
    monkeypatch.setattr(table_mod, "_CACHE", {})


@pytest.mark.parametrize(
    ("copied_after", "held"), [(0, "holds none of them"), (1, "holds them only up to batch 0")]
)
def test_a_copy_older_than_committed_batches_put_back_while_the_query_runs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copied_after: int, held: str
) -> None:
    # A copy of the output taken before the query's first batch, or after its first, put back
    # after three while the query runs: no restart, so no open() to refuse it. Before, the next
    # commit found the query's batches missing there and appended to the copy: the missing
    # batches were lost.
    running, chunks = _query_of_three_batches(tmp_path, monkeypatch, copied_after)
    out, backup = tmp_path / "out", tmp_path / "backup"
    rows = DeltaTable(str(backup)).to_pyarrow_table().num_rows
    shutil.rmtree(out)
    shutil.copytree(backup, out)
    # This process read the table at a version the copy's log lacks: the next batch stops.
    with pytest.raises(TableGone, match=r"deleted and created again|up to batch 2, and the"):
        _commit_batches(monkeypatch, running, chunks[3:4], start=3)
    # A process that never read it meets a table without the query's newest batches; Spark's
    # checkpoint says it committed them.
    _in_a_new_process(monkeypatch)
    with pytest.raises(TableGone, match=f"up to batch 2, and the Delta table {held}"):
        _commit_batches(monkeypatch, running, chunks[3:4], start=3)
    assert DeltaTable(str(out)).to_pyarrow_table().num_rows == rows


def test_a_restore_before_committed_batches_is_still_named_as_such_in_a_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A RESTORE keeps the query's transaction: the check for missing batches stays silent and
    # the commit's lineage check names it.
    running, chunks = _query_of_three_batches(tmp_path, monkeypatch)
    table = DeltaTable(str(tmp_path / "out"))
    table.restore(table.version() - 1)
    _in_a_new_process(monkeypatch)
    with pytest.raises(RestoredPastSink, match="RESTORE"):
        _commit_batches(monkeypatch, running, chunks[3:4], start=3)


@pytest.mark.parametrize("deleted", ["out", "out/_delta_log"])
def test_a_log_table_deleted_while_the_query_runs_is_gone_in_a_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deleted: str
) -> None:
    # Not deltalake's own TableNotFoundError, which the sink reports retriable (75): a rerun
    # meets the same missing table.
    running, chunks = _query_of_three_batches(tmp_path, monkeypatch)
    shutil.rmtree(tmp_path / deleted)
    _in_a_new_process(monkeypatch)
    with pytest.raises(TableGone, match="gone") as gone:
        _commit_batches(monkeypatch, running, chunks[3:4], start=3)
    assert not gone.value.retriable


def test_a_table_replaced_by_a_copy_older_than_the_querys_batches_is_refused(
    tmp_path: Path, writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of the output taken before the query's first batch (its tables created, nothing
    # committed), put back after two batches: the tables are there and pidfence's, but hold
    # none of the batches the checkpoint committed. Before, a restarted sink went on appending.
    path, rejects = str(tmp_path), str(tmp_path / "_rejects")
    backup = tmp_path.parent / f"{tmp_path.name}-backup"
    shutil.copytree(tmp_path, backup)
    _committed_stream(monkeypatch, writer, 38, 100)
    open_output(path, rejects, QUERY, committed_before=True)  # the query's own table: fine
    for name in ("_delta_log", "_rejects", "_pidfence", "data"):
        shutil.rmtree(tmp_path / name, ignore_errors=True)
    shutil.copytree(backup, tmp_path, dirs_exist_ok=True)

    def restarted(committed_before: bool) -> subprocess.CompletedProcess[str]:
        """The sink's start in a new process, as after a restart."""
        code = (
            "import sys; from pidfence.spark_sink.output import open_output\n"
            "from pidfence.spark_sink.delta.errors import TableGone\n"
            f"try: open_output({path!r}, {rejects!r}, {QUERY!r}, {committed_before})\n"
            "except TableGone as exc: sys.exit(str(exc))"
        )
        return subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
        )

    refused = restarted(committed_before=True)
    assert refused.returncode == 1 and "replaced" in refused.stderr, refused.stderr
    assert restarted(committed_before=False).returncode == 0  # no batch: nothing to lose
