"""The fold's segment merges: four of one span at a time, never wider than ``WIDEST`` batches."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from pidfence.spark_sink.fold import FOLDED, MERGE, WIDEST, _merge, _put_segment
from pidfence.spark_sink.storage import Store

FOLD = 64  # batches per fold (the index period)


def folds(count: int, start: int = 0) -> list[tuple[int, int]]:
    return [(start + i * FOLD, start + (i + 1) * FOLD - 1) for i in range(count)]


def test_merges_stop_at_the_widest_segment_so_no_fold_rewrites_a_month(tmp_path: Path) -> None:
    store = Store.at(str(tmp_path))
    (tmp_path / FOLDED).mkdir()
    spans: list[tuple[int, int]] = []
    widest_written = 0
    for span in folds(4 * WIDEST // FOLD + 5):
        _put_segment(store, span, [], [])
        spans, gone = _merge(store, [*spans, span])
        if gone:
            widest_written = max(widest_written, spans[-1][1] - spans[-1][0] + 1)
    assert widest_written == WIDEST
    widths = [b - a + 1 for a, b in spans]
    # Four segments of WIDEST stay as they are; the rest is one merge level below each.
    assert widths[:MERGE] == [WIDEST] * MERGE
    assert max(widths) == WIDEST
    assert sum(widths) == (4 * WIDEST // FOLD + 5) * FOLD
    assert spans == sorted(spans) and all(b + 1 == c for (_, b), (c, _) in pairwise(spans))
