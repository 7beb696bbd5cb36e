"""Bounded bookkeeping (fold.py): hundreds of batches, flat files under ``_pidfence/``, and the
history readers and a state rebuild still see every batch."""

from __future__ import annotations

import itertools
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from pidfence.spark_sink import fold as folding
from pidfence.spark_sink import read_gaps, read_log, read_written
from pidfence.spark_sink import segments as fold_mod
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.delta.table import OWN_DIR
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.positions import INDEX_EVERY
from pidfence.spark_sink.segments import Listing, Span, segments
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter
from tests.unit.test_sink_process import expected_log, kafka_rows, make_stream, micro_batches

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "4"}
QUERY = "0f1e2d3c-fold"


def _run(
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    chunks: list[list],
    first: int = 0,
    retain: int = 20,
) -> None:
    opts = SinkOptions.parse({"path": str(path), "retainBatches": str(retain), **SETTINGS})
    w = PidfenceStreamWriter(opts, QUERY)
    for b, chunk in enumerate(chunks, start=first):
        monkeypatch.setattr(writer_mod, "_task_context", lambda b=b: (b, 0, QUERY))
        w.commit([w.write(iter(kafka_rows(chunk).to_batches()))], b)


def _own_files(path: Path) -> int:
    return sum(1 for p in (path / OWN_DIR).rglob("*") if p.is_file())


def test_bookkeeping_stays_flat_and_history_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = make_stream(31, 1920)
    chunks = micro_batches(records, 5)  # 384 batches
    counts = []
    for start in range(0, 384, 128):
        _run(monkeypatch, tmp_path, chunks[start : start + 128], first=start)
        counts.append(_own_files(tmp_path))
    # At the same point between two folds the count is the same, however many batches ran
    # (segments merge four at a time: at most a couple more).
    assert counts[2] <= counts[1] + 2, counts
    assert len(list((tmp_path / OWN_DIR / "_manifests").glob("*.json"))) <= 20 + 64 + 1
    assert len(segments(Store.at(str(tmp_path / OWN_DIR)))) <= 8
    # Exact output, and the sink's own account of every batch, folded or not.
    log = read_log(str(tmp_path))
    expected = expected_log(records)
    assert log["offset"].to_pylist() == expected
    written = read_written(str(tmp_path))
    assert written["offset"].to_pylist() == expected
    assert [m.batch for m in Output.reading(str(tmp_path)).manifests()] == list(range(384))
    read_gaps(str(tmp_path))


def test_a_lowered_retention_folds_the_backlog_a_fold_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output run with a long ``retainBatches``, then a short one: the backlog is folded in
    segments of one fold's width (the driver holds one at a time), and history stays whole."""
    records = make_stream(7, 385)
    chunks = micro_batches(records, 2)  # 193 batches
    _run(monkeypatch, tmp_path, chunks[:130], retain=1000)
    assert segments(Store.at(str(tmp_path / OWN_DIR))) == []
    written: list[tuple[int, int]] = []
    add_segment = folding.add_segment

    def recorded(own: Store, epoch: int, base: Listing, span: Span, *rest: Any) -> Listing | None:
        written.append(span)
        return add_segment(own, epoch, base, span, *rest)

    monkeypatch.setattr(folding, "add_segment", recorded)
    _run(monkeypatch, tmp_path, chunks[130:], first=130)  # folds at 192, up to batch 172
    assert written and written[0][0] == 0 and written[-1][1] == 172, written
    assert all(b - a + 1 <= INDEX_EVERY for a, b in written), written
    assert all(b + 1 == c for (_, b), (c, _) in itertools.pairwise(written)), written
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected_log(records)
    assert read_written(str(tmp_path))["offset"].to_pylist() == expected_log(records)
    assert [m.batch for m in Output.reading(str(tmp_path)).manifests()] == list(range(193))


def test_a_fold_stalled_past_another_instances_folds_never_unlists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instance A passes its epoch check and stalls; instance B folds the same output further
    and deletes the folded batches' manifests. A then wakes: it must not name an older list of
    segments (the history B folded would be named by none), nor fold batches it can no longer
    read."""
    records = make_stream(9, 261)
    chunks = micro_batches(records, 2)  # 131 batches
    _run(monkeypatch, tmp_path, chunks, retain=1000)
    opts = SinkOptions.parse({"path": str(tmp_path), **SETTINGS})
    a, b = (Output(opts.path, opts.rejects_path, QUERY) for _ in range(2))
    checked, go = threading.Event(), threading.Event()
    check_epoch = fold_mod.check_epoch

    def stalling(own: Store, epoch: int) -> None:
        check_epoch(own, epoch)
        if threading.current_thread().name == "A" and not checked.is_set():
            checked.set()
            assert go.wait(120)

    monkeypatch.setattr(fold_mod, "check_epoch", stalling)
    failed: list[BaseException] = []

    def fold_a() -> None:
        try:
            folding.fold(a, 130, 20)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failed.append(exc)

    thread = threading.Thread(target=fold_a, name="A")
    thread.start()
    assert checked.wait(120)
    folding.fold(b, 130, 20)  # B folds batches 0..110 and deletes their manifests
    folded_by_b = segments(b.own)
    go.set()
    thread.join(120)
    assert not failed, failed
    assert segments(b.own) == folded_by_b == [(0, 63), (64, 110)]
    assert [m.batch for m in Output.reading(str(tmp_path)).manifests()] == list(range(131))
    assert read_written(str(tmp_path))["offset"].to_pylist() == expected_log(records)


def test_lost_state_files_rebuild_through_folded_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = make_stream(32, 700)
    chunks = micro_batches(records, 5)  # 140 batches: batches 0..108 are folded at 128
    _run(monkeypatch, tmp_path, chunks[:135])
    assert segments(Store.at(str(tmp_path / OWN_DIR)))
    shutil.rmtree(tmp_path / OWN_DIR / "_state")
    _run(monkeypatch, tmp_path, chunks[135:], first=135)
    assert read_log(str(tmp_path))["offset"].to_pylist() == expected_log(records)
