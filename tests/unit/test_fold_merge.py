"""The fold's segment merges: four of one span at a time, never wider than ``WIDEST`` batches."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pidfence.spark_sink import segments as fold_mod
from pidfence.spark_sink.decisions import decided_rows
from pidfence.spark_sink.manifest import BatchManifest, PartCommit, Totals
from pidfence.spark_sink.schema import TS_TYPE
from pidfence.spark_sink.segments import (
    FOLDED,
    MERGE,
    OLD_LIST,
    WIDEST,
    Listing,
    Segment,
    _merge,
    _put_segment,
    add_segment,
    folded_decided,
    folded_manifest,
    listing,
    segment_stem,
    segments,
    with_place,
)
from pidfence.spark_sink.storage import Store

FOLD = 64  # batches per fold (the index period)


def folds(count: int, start: int = 0) -> list[Segment]:
    return [Segment(start + i * FOLD, start + (i + 1) * FOLD - 1, "t") for i in range(count)]


def test_merges_stop_at_the_widest_segment_so_no_fold_rewrites_a_month(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    (tmp_path / FOLDED).mkdir()
    segs: list[Segment] = []
    widest_written = 0
    for seg in folds(4 * WIDEST // FOLD + 5):
        _put_segment(store, seg, [], [])
        segs, gone = _merge(store, [*segs, seg])
        if gone:
            widest_written = max(widest_written, segs[-1].last - segs[-1].first + 1)
    spans = [(seg.first, seg.last) for seg in segs]
    assert widest_written == WIDEST
    widths = [b - a + 1 for a, b in spans]
    # Four segments of WIDEST stay as they are; the rest is one merge level below each.
    assert widths[:MERGE] == [WIDEST] * MERGE
    assert max(widths) == WIDEST
    assert sum(widths) == (4 * WIDEST // FOLD + 5) * FOLD
    assert spans == sorted(spans) and all(b + 1 == c for (_, b), (c, _) in pairwise(spans))


#: Instance B's folds while A stalls: one list (A's number is taken), or three (A's number was
#: written and pruned, so it is free again).
B_FOLDS = {"one": [(192, 200)], "three": [(192, 200), (201, 264), (265, 328)]}


def assert_a_stalled_fold_deletes_nothing(
    own: Store, monkeypatch: pytest.MonkeyPatch, b_folds: list[tuple[int, int]]
) -> None:
    """Instance A passes its epoch check and stalls while instance B (with another
    ``retainBatches``, so other spans) writes the lists of ``b_folds``. A's late list is no
    newest, and A must not delete the segments it merged: B's newest list still names them.
    (Also run on S3: ``tests/integration/test_fold_store.py``.)"""
    listed = Listing(-1, [])
    for seg in folds(3):
        now = add_segment(own, 0, listed, (seg.first, seg.last), [], [])
        assert now is not None
        listed = now
    check_epoch = fold_mod.check_epoch
    stalled: list[bool] = []

    def stalling(store: Store, epoch: int) -> None:
        check_epoch(store, epoch)
        if not stalled:
            stalled.append(True)
            b = listing(own)
            for span in b_folds:
                now = add_segment(own, 0, b, span, [], [])
                assert now is not None
                b = now

    monkeypatch.setattr(fold_mod, "check_epoch", stalling)
    assert add_segment(own, 0, listed, (192, 255), [], []) is None  # would merge 0..255
    newest = listing(own)
    assert newest.number == 2 + len(b_folds)
    assert [(s.first, s.last) for s in newest.segments][:3] == [(0, 63), (64, 127), (128, 191)]
    for seg in newest.segments:
        assert own.exists(own.join(segment_stem(seg) + ".json")), seg


@pytest.mark.parametrize("b_folds", B_FOLDS)
def test_a_fold_stalled_through_another_instances_lists_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, b_folds: str
) -> None:
    assert_a_stalled_fold_deletes_nothing(Store.at(str(tmp_path)), monkeypatch, B_FOLDS[b_folds])


def test_an_output_folded_before_the_numbered_lists_reads_its_segments(tmp_path: Path) -> None:
    own = Store.at(str(tmp_path))
    _put_segment(own, Segment(0, 63, ""), [], [])
    own.put(own.join(OLD_LIST), b"[[0, 63]]")
    assert listing(own) == Listing(-1, [Segment(0, 63, "")])
    now = add_segment(own, 0, listing(own), (64, 127), [], [])
    assert now is not None and now.number == 0
    assert segments(own) == [(0, 63), (64, 127)]


def test_folded_lookups_list_the_folder_once_and_follow_a_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = Store.at(str(tmp_path))
    listed = Listing(-1, [])
    for seg in folds(3):
        manifests = [BatchManifest(b, "q", (), Totals()) for b in range(seg.first, seg.last + 1)]
        now = add_segment(own, 0, listed, (seg.first, seg.last), manifests, [])
        assert now is not None
        listed = now
    lists: list[str] = []
    real_list = Store.list
    monkeypatch.setattr(Store, "list", lambda s, p: lists.append(p) or real_list(s, p))
    for batch in range(0, 192, 7):
        found = folded_manifest(own, batch)
        assert found is not None and found.batch == batch
    assert len(lists) <= 1, lists  # one listing serves every lookup of a batch it holds
    # Another fold merges the three segments with a fourth and deletes them: lookups follow.
    merged = [BatchManifest(b, "q", (), Totals()) for b in range(192, 256)]
    assert add_segment(own, 0, listing(own), (192, 255), merged, []) is not None
    assert not (tmp_path / (segment_stem(listed.segments[0]) + ".json")).exists()
    found = folded_manifest(own, 5)
    assert found is not None and found.batch == 5
    assert folded_manifest(own, 256) is None


class _CountingOpens(pafs.FileSystemHandler):
    """The local file system, counting the files opened for reading."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.opened: list[str] = []

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self.opened.append(path)
        return self.fs.open_input_file(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self.opened.append(path)
        return self.fs.open_input_stream(path)

    def _unused(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _unused
    delete_file = move = copy_file = open_output_stream = open_append_stream = equals = _unused


def _decisions(batch: int, partition: int, rows: int) -> pa.Table:
    """``rows`` appended decisions of one part, placed as a fold places them."""
    seq = pa.array(range(rows), pa.int64())
    decided = decided_rows(
        pa.table(
            {
                "offset": seq,
                "log_offset": seq,
                "pid": pa.array([batch] * rows, pa.int64()),
                "generation": pa.array([partition] * rows, pa.int32()),
                "seq": seq,
                "timestamp": pa.array([0] * rows, TS_TYPE),
            }
        ),
        None,
    )
    return with_place(decided, batch, _part(partition))


def _part(partition: int) -> PartCommit:
    return PartCommit("t", partition, 1, 1, 0, 0, 1, 0, 0, {}, "", "")


def test_reading_folded_history_in_order_reads_each_row_group_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_written`` and a state rebuild read a folded segment's decisions part by part in
    batch order: each row group is read once (it was read, and filtered, again for each part:
    a 4,096-batch segment's row group, tens of batches wide, read for every one of its parts)."""
    monkeypatch.setattr(fold_mod, "GROUP_ROWS", 1_000)
    own = Store.at(str(tmp_path))
    listed = Listing(-1, [])
    for seg in folds(2):
        span = range(seg.first, seg.last + 1)
        manifests = [BatchManifest(b, "q", (), Totals()) for b in span]
        decided = [_decisions(b, p, 30 + b % 7) for b in span for p in (0, 1)]
        now = add_segment(own, 0, listed, (seg.first, seg.last), manifests, decided)
        assert now is not None
        listed = now
    counting = _CountingOpens()
    reader = Store(pafs.PyFileSystem(counting), own.root, own.uri)
    for batch in range(2 * FOLD):
        for partition in (0, 1):
            rows = folded_decided(reader, batch, _part(partition))
            assert rows is not None and rows.num_rows == 30 + batch % 7
            assert rows.column("pid").to_pylist() == [batch] * rows.num_rows
            assert set(rows.column("generation").to_pylist()) == {partition}
    assert folded_decided(reader, 2 * FOLD, _part(0)) is None  # not folded
    parquet = [p for p in counting.opened if p.endswith(".parquet")]
    groups = sum(
        pq.ParquetFile(tmp_path / (segment_stem(seg) + ".parquet")).metadata.num_row_groups
        for seg in listing(own).segments
    )
    assert groups >= 8  # several row groups a segment, a part now and then split across two
    # A footer read a segment, then each row group once, or twice when a part spans two.
    assert len(parquet) <= 2 * len(listing(own).segments) + 2 * groups, len(parquet)
