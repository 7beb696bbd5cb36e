"""Bounded bookkeeping: old batches' manifests and decisions folded into a few segments.

A batch's own files (its manifest, decisions and held records under ``_pidfence/``) are kept
only while Spark can re-run it or a state rebuild is likely to start there: the newest
``retainBatches`` batches (Spark's ``spark.sql.streaming.minBatchesToRetain``, 100 by default).
Older ones are folded, every :data:`~pidfence.spark_sink.output.INDEX_EVERY` batches, by the
driver after a commit, into a segment: ``_folded/FIRST-LAST.json`` (their manifests, one per
line) and ``_folded/FIRST-LAST.parquet`` (their decisions, with ``batch``, ``topic`` and
``partition`` columns). The newest of the numbered lists ``_folded/lists/N.json`` names the
segments. A fold reads list N and, after the epoch check, writes list N+1 if absent (a
compare-and-set): an instance that stalled past another's folds finds N+1 taken and stops,
deleting nothing, so no stale list ever hides segments another fold named. Segments of equal
span merge four at a time up to :data:`WIDEST` batches: no fold rewrites more than that many
batches' decisions (a merge without a cap would, at a month's age, rewrite the whole month in one
batch), and the segments grow by one per :data:`WIDEST` batches (about 630 a month at a 1 s
trigger), so the files under ``_pidfence/`` stay nearly flat.

A held file or state chain that a partition's newest position still names is never deleted (an
idle partition's last batch may be old). The driver's :func:`~pidfence.spark_sink.writer.fold`
decides what to fold and delete; this module writes and reads the segments. Readers of history
(``read_written``, ``read_gaps``, ``pidfence verify``, a state rebuild) read the segments, then
the live batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Final, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from pidfence.spark_sink.fence import check_epoch
from pidfence.spark_sink.manifest import BatchManifest, PartCommit
from pidfence.spark_sink.storage import Store, batch_name

FOLDED: Final = "_folded"
#: The numbered lists of segments; the newest is the one that counts.
LISTS: Final = f"{FOLDED}/lists"
#: Segments of one span merge this many at a time.
MERGE: Final = 4
#: No merge makes a segment of more batches than this (64 x 4 x 4 x 4: three merges of folds).
WIDEST: Final = 4096

Span = tuple[int, int]


class Listing(NamedTuple):
    """The newest list of segments: its number (-1: none yet) and its spans, ascending."""

    number: int
    spans: list[Span]


def _list_path(store: Store, number: int) -> str:
    return store.join(LISTS, f"{batch_name(number)}.json")


def list_number(name: str) -> int | None:
    """The number of a list's file name (None: not a list)."""
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def listing(store: Store) -> Listing:
    """The newest list of segments."""
    while True:
        numbers = [
            n for name in store.list(store.join(LISTS)) if (n := list_number(name)) is not None
        ]
        if not numbers:
            return Listing(-1, [])
        try:
            data = store.read(_list_path(store, max(numbers)))
        except FileNotFoundError:  # pruned by a newer fold since the listing: list again
            continue
        return Listing(max(numbers), [(int(a), int(b)) for a, b in json.loads(data)])


def segments(store: Store) -> list[Span]:
    """The folded (first, last) batch spans, ascending (empty: nothing folded yet)."""
    return listing(store).spans


def _stem(span: Span) -> str:
    return f"{FOLDED}/{batch_name(span[0])}-{batch_name(span[1])}"


#: Decoded segments by path (a segment never changes once named).
_SEEN: dict[str, dict[int, BatchManifest]] = {}


def _manifests(store: Store, span: Span) -> dict[int, BatchManifest]:
    path = store.join(_stem(span) + ".json")
    if path not in _SEEN:
        lines = store.read(path).splitlines()
        _SEEN.clear()  # a few at a time: readers walk them in order
        _SEEN[path] = {m.batch: m for m in (BatchManifest.decode(x) for x in lines if x)}
    return _SEEN[path]


def folded_manifest(store: Store, batch_id: int) -> BatchManifest | None:
    """A folded batch's manifest (None: not folded)."""
    for span in segments(store):
        if span[0] <= batch_id <= span[1]:
            return _manifests(store, span).get(batch_id)
    return None


def folded_manifests(store: Store, after: int) -> Iterator[BatchManifest]:
    """The folded manifests of batches above ``after``, in batch order."""
    for span in segments(store):
        if span[1] > after:
            found = _manifests(store, span)
            yield from (found[b] for b in sorted(found) if b > after)


def folded_decided(store: Store, batch_id: int, part: PartCommit) -> pa.Table | None:
    """A folded part's decisions (None: the part decided nothing, or is not folded)."""
    for span in segments(store):
        if span[0] <= batch_id <= span[1]:
            rows = pq.read_table(
                store.join(_stem(span) + ".parquet"),
                filesystem=store.fs,
                filters=[
                    ("batch", "=", batch_id),
                    ("topic", "=", part.topic),
                    ("partition", "=", part.partition),
                ],
            )
            return rows.drop_columns(["batch", "topic", "partition"]) if rows.num_rows else None
    return None


def add_segment(
    own: Store,
    epoch: int,
    base: Listing,
    span: Span,
    manifests: list[BatchManifest],
    decided: list[pa.Table],
) -> Listing | None:
    """Store the segment of ``span`` (its manifests and their parts' decisions, with ``batch``,
    ``topic`` and ``partition`` columns), merge segments, and name them in the list after
    ``base`` (after the epoch check). Returns that list; None when another fold wrote it first
    (this one then deletes nothing). The caller then deletes the folded batches' own files."""
    _put_segment(own, span, [m.encode().replace(b"\n", b"") for m in manifests], decided)
    merged, gone = _merge(own, [*base.spans, span])
    own.sync()  # the segments' Parquet files, before a list names them
    check_epoch(own, epoch)
    if not own.put_if_absent(_list_path(own, base.number + 1), json.dumps(merged).encode()):
        return None
    for old in gone:
        own.delete(own.join(_stem(old) + ".json"))
        own.delete(own.join(_stem(old) + ".parquet"))
    if base.number > 0:  # the list before ``base``: a reader that listed it has read it by now
        own.delete(_list_path(own, base.number - 1))
    return Listing(base.number + 1, merged)


def with_place(decided: pa.Table, batch_id: int, part: PartCommit) -> pa.Table:
    """A part's decisions with the columns that place them in a segment."""
    n = decided.num_rows
    return (
        decided.append_column("batch", pa.array([batch_id] * n, pa.int64()))
        .append_column("topic", pa.array([part.topic] * n, pa.string()))
        .append_column("partition", pa.array([part.partition] * n, pa.int32()))
    )


def _put_segment(own: Store, span: Span, lines: list[bytes], pieces: list[pa.Table]) -> None:
    if pieces:
        own.write_table(own.join(_stem(span) + ".parquet"), pa.concat_tables(pieces))
    own.put(own.join(_stem(span) + ".json"), b"\n".join(lines) + b"\n")


def _merge(own: Store, spans: list[Span]) -> tuple[list[Span], list[Span]]:
    """Merge runs of :data:`MERGE` adjacent segments of one span length into one of at most
    :data:`WIDEST` batches, repeatedly: (the spans now, the segments merged away, to delete once
    the new list is stored)."""
    gone: list[Span] = []
    while True:
        at = next(
            (i for i in range(len(spans) - MERGE + 1) if _mergeable(spans[i : i + MERGE])), None
        )
        if at is None:
            return spans, gone
        run = spans[at : at + MERGE]
        merged = (run[0][0], run[-1][1])
        lines, pieces = [], []
        for span in run:
            lines += [m.encode().replace(b"\n", b"") for m in _manifests(own, span).values()]
            path = own.join(_stem(span) + ".parquet")
            if own.exists(path):
                pieces.append(own.read_table(path))
        _put_segment(own, merged, lines, pieces)
        spans = [*spans[:at], merged, *spans[at + MERGE :]]
        gone += run


def _mergeable(run: list[Span]) -> bool:
    widths = {b - a for a, b in run}
    return len(widths) == 1 and run[-1][1] - run[0][0] + 1 <= WIDEST


__all__ = [
    "LISTS",
    "Listing",
    "add_segment",
    "folded_decided",
    "folded_manifest",
    "folded_manifests",
    "list_number",
    "listing",
    "segments",
    "with_place",
]
