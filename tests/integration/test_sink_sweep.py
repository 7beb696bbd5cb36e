"""``pidfence sink vacuum`` on the sink's own files (sweep.py): an output aged by hundreds of
batches over partitions that go idle and come back, with what crashes and zombies leave; the
sweep shrinks ``_pidfence/``, keeps what a running or newer sink reads, and the output stays
exact and continues."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest

from pidfence.cli.exits import EXIT_OK
from pidfence.spark_sink import read_log, read_written
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.claims import claim_output, new_tag
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.positions import INDEX_EVERY
from pidfence.spark_sink.segments import listing, segment_stem, segments
from pidfence.spark_sink.storage import Store, batch_name
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.fixtures.commands import run_pidfence
from tests.unit.test_sink_process import kafka_rows, make_stream, micro_batches, reference

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "4"}
QUERY = "0f1e2d3c-sweep"
PARTITIONS = 8
#: Each partition is read in this many consecutive batches, then idles while the others are.
STRETCH = 8


def _own_files(path: Path) -> set[str]:
    own = path / OWN_DIR
    return {str(p.relative_to(own)) for p in own.rglob("*") if p.is_file()}


class Aged:
    """One output, its writer (epoch of a real claim), and the records each partition got."""

    def __init__(self, path: Path, seed: int) -> None:
        self.path = path
        claim = claim_output(Output.reading(str(path)).own, lapse=3600.0)
        assert claim is not None
        self.epoch = claim.epoch
        options = {"path": str(path), "retainBatches": "10", "epoch": str(self.epoch)}
        self.writer = PidfenceStreamWriter(SinkOptions.parse({**options, **SETTINGS}), QUERY)
        self.streams = [make_stream(seed + p, 400) for p in range(PARTITIONS)]
        self.chunks = [micro_batches(s, 5) for s in self.streams]
        self.batch = 0

    def run(self, monkeypatch: pytest.MonkeyPatch, batches: int, first: int | None = None) -> None:
        """Commit ``batches`` more batches; each reads one partition's next chunk: ``first`` in
        the first STRETCH of them, then partitions 1 and up in turn."""
        w = self.writer
        for i, b in enumerate(range(self.batch, self.batch + batches)):
            p = (
                first
                if first is not None and i < STRETCH
                else 1 + (b // STRETCH) % (PARTITIONS - 1)
            )
            monkeypatch.setattr(writer_mod, "_task_context", lambda b=b: (b, 0, QUERY))
            rows = kafka_rows(self.chunks[p].pop(0), partition=p)
            w.commit([w.write(iter(rows.to_batches()))], b)
        self.batch += batches

    def assert_exact(self) -> None:
        """Each partition's log and the sink's own account equal the per-record rules."""
        log, written = read_log(str(self.path)), read_written(str(self.path))
        for p, records in enumerate(self.streams):
            sent = records[: len(records) - 5 * len(self.chunks[p])]
            expected, _ = reference(sent, capacity=64, lifetime_ms=10_000_000, reorder_window=3)
            for table in (log, written):
                mine = table.filter(pc.equal(table["partition"], p))
                assert mine["offset"].to_pylist() == expected, p
        batches = [m.batch for m in Output.reading(str(self.path)).manifests()]
        assert batches == list(range(self.batch))


def _vacuum(path: Path, *extra: str) -> list[str]:
    result = run_pidfence("sink", "vacuum", str(path), *extra, timeout=300)
    assert result.returncode == EXIT_OK, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("bookkeeping "))
    return [line.strip() for line in lines[at + 1 :] if line.startswith("  ")]


def test_vacuum_shrinks_the_sinks_own_files_and_the_output_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aged = Aged(tmp_path, seed=56)
    aged.run(monkeypatch, 300, first=0)  # partition 0 then idles: batch 7 holds its position
    own = Store.at(str(tmp_path / OWN_DIR))
    spans = segments(own)
    assert spans and spans[-1][1] > 100
    # Batch 7 is folded, and the records partition 0 held at its end are in a file of it: the
    # next batch that reads partition 0 starts from them.
    positions = Output.reading(str(tmp_path)).positions(299)
    idle = positions["t~0"]
    assert idle.batch == STRETCH - 1 and idle.part.files.held is not None
    held = tmp_path / OWN_DIR / idle.part.files.held
    assert held.is_file()
    # The folds left nothing of a folded batch but what a partition's position named at the
    # last fold: files kept for a position go at the next fold once the partition moved on.
    at_fold = Output.reading(str(tmp_path)).positions(299 // INDEX_EVERY * INDEX_EVERY)
    named = {rel for pos in at_fold.values() for rel in pos.part.files.named()}
    per_batch = {rel for rel in _own_files(tmp_path) if rel.startswith(("_held/", "_decided/"))}
    folded = {rel for rel in per_batch if int(rel.split("/")[1]) <= spans[-1][1]}
    assert folded == named & folded, sorted(folded - named)

    # What crashes and zombies leave in folded batches: a zombie of this epoch that staged
    # batch 3's files after the batch committed; a segment a merge wrote and never named; a
    # folded batch's manifest a crash left behind. A file of a newer instance's attempt (it
    # claimed the output after the sweep looked) is never touched.
    folded_dir = tmp_path / OWN_DIR / "_decided" / batch_name(3)
    folded_dir.mkdir(parents=True, exist_ok=True)
    source = next((tmp_path / OWN_DIR / "_folded").glob("*.parquet"))
    zombie = folded_dir / f"t~0.{new_tag(aged.epoch)}.parquet"
    newer = folded_dir / f"t~0.{new_tag(aged.epoch + 1)}.parquet"
    for copy in (zombie, newer):
        shutil.copy(source, copy)
    first_segment = listing(own).segments[0]
    segment = tmp_path / OWN_DIR / (segment_stem(first_segment) + ".json")
    unnamed = segment.with_name(segment.name.replace(first_segment.tag, "0badc0de"))
    shutil.copy(segment, unnamed)
    older_list = tmp_path / OWN_DIR / "_folded" / "lists" / f"{batch_name(0)}.json"
    older_list.write_text("[]")  # a list a crash left behind: older than the newest
    manifest = Output.reading(str(tmp_path)).committed(5)
    assert manifest is not None
    left = tmp_path / OWN_DIR / "_manifests" / f"{batch_name(5)}.json"
    left.write_bytes(manifest.encode())

    before = _own_files(tmp_path)
    # Everything was just written: with the default age nothing goes.
    assert _vacuum(tmp_path, "--dry-run") == []
    listed = _vacuum(tmp_path, "--bookkeeping-age", "0", "--dry-run")
    assert _own_files(tmp_path) == before
    _vacuum(tmp_path, "--bookkeeping-age", "0")
    after = _own_files(tmp_path)
    assert after == before - set(listed)
    gone = {str(p.relative_to(tmp_path / OWN_DIR)) for p in (zombie, unnamed, left, older_list)}
    assert gone <= set(listed), sorted(gone - set(listed))
    assert str(newer.relative_to(tmp_path / OWN_DIR)) in after
    assert held.is_file(), "the sweep deleted the held records of an idle partition's position"
    assert len(after) < len(before)
    aged.assert_exact()

    # The sink continues after the sweep, and a state rebuild through the folded history too.
    aged.run(monkeypatch, 40, first=0)
    aged.assert_exact()
    shutil.rmtree(tmp_path / OWN_DIR / "_state")
    aged.run(monkeypatch, 20)
    aged.assert_exact()
