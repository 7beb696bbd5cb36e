"""The Delta output wired through the sink: writer, readers, report, cleanup, CLI.

The writer runs without Spark (``write()`` and ``commit()`` called directly, as in
``test_delta_layout``); the checks read the output with the sink's own readers and with
``deltalake`` alone.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from typer.testing import CliRunner

from pidfence.cli import app
from pidfence.spark_sink import output as output_mod
from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink.batch_report import BatchLine, BatchWatcher, SinkRunSummary, summarise
from pidfence.spark_sink.delta.table import OWN_DIR, NotPidfenceTable
from pidfence.spark_sink.manifest import BatchManifest, PartCommit
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.readers import read_table
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.unit.test_delta_layout import Crash, commit_files_dying_at
from tests.unit.test_sink_process import (
    make_stream,
    micro_batches,
    write_as_task,
)

QUERY = "5a5a5a5a-wiring-query"
DELTA = {"compactEvery": "2"}


_write = partial(write_as_task, query=QUERY)


# ------------------------------------------------------------------------------ report


def test_batch_line_counts_forged_records_by_reason() -> None:
    def part(rows_in: int, appended: int, counts: dict[str, int], **forged: int) -> PartCommit:
        return PartCommit("t", 0, rows_in, appended, 0, 0, 0, 0, 0, counts, "", "", forged=forged)

    manifest = BatchManifest(
        4,
        QUERY,
        (
            part(20, 10, {"APPENDED": 10, "DUPLICATE": 4, "FORGED": 4}, unknown_key=3, missing=1),
            part(5, 2, {"APPENDED": 1, "NON_IDEMPOTENT": 1, "FORGED": 2}, missing=1, unknown_key=1),
            part(1, 1, {"APPENDED": 1}),
        ),
    )
    summary = SinkRunSummary()
    summary.add_manifest(manifest)
    assert summary.forged == {"missing": 2, "unknown_key": 4}
    assert summary.dropped == {"DUPLICATE": 4, "FORGED": 6}
    line = BatchLine(4, 26, 13, summary.dropped, 7, 1.25, summary.forged)
    assert line.human() == (
        "batch 4: 26 in → 13 appended, 10 dropped "
        "(FORGED 6 (missing 2, unknown_key 4), DUPLICATE 4), lag 7, 1.2 s"
    )
    # Without FORGED records the line is what it always was.
    plain = BatchLine(1, 3, 2, {"DUPLICATE": 1}, None)
    assert plain.human() == "batch 1: 3 in → 2 appended, 1 dropped (DUPLICATE 1)"


# ------------------------------------------------------------------------------ writer


def test_writer_on_delta_refuses_another_writers_table_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_deltalake(str(out), pa.table({"a": [1, 2]}))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    options = SinkOptions.parse({"path": str(out), **DELTA})
    with pytest.raises(NotPidfenceTable, match="did not create") as err:
        PidfenceStreamWriter(options, QUERY)
    assert not err.value.retriable
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_delta_output_read_by_every_reader_and_reported_once_per_committed_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    options = SinkOptions.parse({"path": str(out), **DELTA})
    w = PidfenceStreamWriter(options, QUERY)
    assert (out / "_delta_log").is_dir() and (out / OWN_DIR / "_owner.json").is_file()
    records = make_stream(21, 300)
    chunks = micro_batches(records, 60)
    real = output_mod.commit_files
    die_before_log = commit_files_dying_at("log")

    watcher = BatchWatcher(str(out))

    class NoProgress:
        recentProgress: list[Any] = []

    for b, chunk in enumerate(chunks[:-1]):
        w.commit([_write(monkeypatch, w, b, chunk)], b)
    last = len(chunks) - 1
    # The last batch's manifest and rejects are written, its log commit never lands.
    msg = _write(monkeypatch, w, last, chunks[last])
    monkeypatch.setattr(output_mod, "commit_files", die_before_log)
    with pytest.raises(Crash):
        w.commit([msg], last)
    monkeypatch.setattr(output_mod, "commit_files", real)
    assert (out / OWN_DIR / "_manifests" / f"{last:020d}.json").is_file()
    assert Output.reading(str(out)).committed_ids() == list(range(last))
    lines = watcher.poll(NoProgress(), final=True)
    assert [line.batch for line in lines] == list(range(last))
    assert summarise(str(out)).batches == list(range(last))
    before = read_log(str(out))
    assert before.num_rows == DeltaTable(str(out)).to_pyarrow_table().num_rows

    # The re-run of the batch commits it; the watcher reports it once.
    w.commit([_write(monkeypatch, w, last, chunks[last], attempt=1)], last)
    assert [line.batch for line in watcher.poll(NoProgress(), final=True)] == [last]
    # Its rejects were committed before the crash: the re-run's copies are gone, and every
    # data file left is one its table adds.
    for table in (out, out / "_rejects"):
        added = set(DeltaTable(str(table)).file_uris())
        assert {str(p) for p in (table / "data").rglob("*.parquet")} == added
    assert watcher.poll(NoProgress(), final=True) == []
    log, rejects = read_log(str(out)), read_rejects(str(out))
    assert log == read_table(str(out), "log").sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("log_offset", "ascending")]
    )
    assert rejects.num_rows == read_table(str(out / "_rejects"), "rejects").num_rows
    assert log.num_rows + rejects.num_rows <= len(records)
    assert log["log_offset"].to_pylist() == list(range(log.num_rows))
    by_deltalake = DeltaTable(str(out)).to_pyarrow_table().sort_by("log_offset")
    assert by_deltalake["offset"] == log["offset"]
    assert summarise(str(out)).appended == log.num_rows


# ------------------------------------------------------------------------------ CLI care


def test_cli_compact_and_vacuum_keep_the_rows_and_refuse_other_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    w = PidfenceStreamWriter(SinkOptions.parse({"path": str(out), **DELTA}), QUERY)
    records = make_stream(8, 400)
    for b, chunk in enumerate(micro_batches(records, 40)):
        w.commit([_write(monkeypatch, w, b, chunk)], b)
    log, rejects = read_log(str(out)), read_rejects(str(out))
    files = len(DeltaTable(str(out)).file_uris())
    runner = CliRunner()
    result = runner.invoke(app, ["sink", "compact", str(out)])
    assert result.exit_code == 0, result.output
    assert f"log {out}: {files} files → 1" in result.output
    assert "rejects " in result.output
    assert len(DeltaTable(str(out)).file_uris()) == 1
    assert read_log(str(out)) == log and read_rejects(str(out)) == rejects
    result = runner.invoke(app, ["sink", "vacuum", str(out), "--dry-run", "--full"])
    assert result.exit_code == 0, result.output
    assert "would delete 0 files" in result.output  # replaced files are within retention
    result = runner.invoke(
        app, ["sink", "vacuum", str(out), "--retention-hours", "0"], catch_exceptions=False
    )
    assert result.exit_code == 2, result.output  # below the table's retention: refused
    assert "minimum retention" in result.output
    assert read_log(str(out)) == log

    plain = tmp_path / "plain"
    plain.mkdir()
    result = runner.invoke(app, ["sink", "compact", str(plain)])
    assert result.exit_code == 3
    assert "holds no Delta table" in result.output
