"""Bounded bookkeeping: old batches' manifests and decisions folded into a few segments.

A batch's own files (its manifest, decisions and held records under ``_pidfence/``) are kept
only while Spark can re-run it or a state rebuild is likely to start there: the newest
``retainBatches`` batches (Spark's ``spark.sql.streaming.minBatchesToRetain``, 100 by default).
Older ones are folded, every :data:`~pidfence.spark_sink.positions.INDEX_EVERY` batches, by the
driver after a commit, into a segment: ``_folded/FIRST-LAST-TAG.json`` (their manifests, one
per line) and ``_folded/FIRST-LAST-TAG.parquet`` (their decisions, with ``batch``, ``topic`` and
``partition`` columns), the tag the fold's own (no fold rewrites a file another's list may name).
The newest of the numbered lists ``_folded/lists/N.json`` names the segments. A fold reads list
N and, after the epoch check, writes list N+1 if absent (a compare-and-set), then lists again:
an instance that stalled past another's folds finds N+1 taken, or (N+1 pruned and free again) a
newer list, and stops deleting nothing, so no stale list hides segments another fold named, and
no segment a newest list names is deleted. Segments of equal
span merge four at a time up to :data:`WIDEST` batches: no fold rewrites more than that many
batches' decisions (a merge without a cap would, at a month's age, rewrite the whole month in one
batch), and the segments grow by one per :data:`WIDEST` batches (about 630 a month at a 1 s
trigger), so the files under ``_pidfence/`` stay nearly flat.

A held file or state chain that a partition's newest position still names is never deleted (an
idle partition's last batch may be old). The driver's :func:`~pidfence.spark_sink.fold.fold`
decides what to fold and delete; this module writes and reads the segments. Readers of history
(``read_written``, ``read_gaps``, ``pidfence verify``, a state rebuild) read the segments, then
the live batches.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Final, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pidfence.spark_sink.claims import check_epoch
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
T = TypeVar("T")
#: Where lists of segments were kept before they were numbered: read while no numbered list exists.
OLD_LIST: Final = f"{FOLDED}/segments.json"


class Segment(NamedTuple):
    """A folded segment: its batches and the tag of the fold that wrote it (its files are
    ``_folded/FIRST-LAST-TAG.json|.parquet``; no fold writes a name another may have listed)."""

    first: int
    last: int
    tag: str


class Listing(NamedTuple):
    """The newest list of segments: its number (-1: none yet) and its segments, ascending."""

    number: int
    segments: list[Segment]


def _list_path(store: Store, number: int) -> str:
    return store.join(LISTS, f"{batch_name(number)}.json")


def list_number(name: str) -> int | None:
    """The number of a list's file name (None: not a list)."""
    stem = name.removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def _numbers(store: Store) -> list[int]:
    return [n for name in store.list(store.join(LISTS)) if (n := list_number(name)) is not None]


def listing(store: Store) -> Listing:
    """The newest list of segments."""
    for _ in range(5):
        numbers = _numbers(store)
        path = _list_path(store, max(numbers)) if numbers else store.join(OLD_LIST)
        try:
            entries = json.loads(store.read(path))
        except FileNotFoundError:
            if not numbers:
                return Listing(-1, [])
            continue  # pruned by a newer fold since the listing: list again
        found = [Segment(int(e[0]), int(e[1]), str(e[2]) if len(e) > 2 else "") for e in entries]
        return Listing(max(numbers, default=-1), found)
    raise FileNotFoundError(f"{store.join(LISTS)}: each newest list vanished as it was read")


def segments(store: Store) -> list[Span]:
    """The folded (first, last) batch spans, ascending (empty: nothing folded yet)."""
    return [(seg.first, seg.last) for seg in listing(store).segments]


def segment_stem(seg: Segment) -> str:
    """``_folded/FIRST-LAST-TAG``: where a segment's files are, without their extension."""
    stem = f"{FOLDED}/{batch_name(seg.first)}-{batch_name(seg.last)}"
    return f"{stem}-{seg.tag}" if seg.tag else stem


#: Decoded segments by path (a segment never changes once named).
_SEEN: dict[str, dict[int, BatchManifest]] = {}


def _manifests(store: Store, seg: Segment) -> dict[int, BatchManifest]:
    path = store.join(segment_stem(seg) + ".json")
    found = _SEEN.get(path)  # a local: another thread may clear the cache meanwhile
    if found is None:
        lines = store.read(path).splitlines()
        found = {m.batch: m for m in (BatchManifest.decode(x) for x in lines if x)}
        _SEEN.clear()  # a few at a time: readers walk them in order
        _SEEN[path] = found
    return found


#: The newest list each output's readers saw, by folder: a lookup lists the folder again only
#: for a batch beyond it, or when a segment it names was merged away since.
_LISTED: dict[str, Listing] = {}


def _holding(store: Store, batch_id: int, fresh: bool = False) -> Segment | None:
    listed = _LISTED.get(store.root)
    if fresh or listed is None or not listed.segments or batch_id > listed.segments[-1].last:
        listed = _LISTED[store.root] = listing(store)  # once folded, a batch stays folded
    return next((s for s in listed.segments if s.first <= batch_id <= s.last), None)


def _in_segment(store: Store, batch_id: int, read: Callable[[Segment], T]) -> T | None:
    """``read`` of the segment holding ``batch_id`` (None: not folded)."""
    seg = _holding(store, batch_id)
    if seg is None:
        return None
    try:
        return read(seg)
    except FileNotFoundError:  # merged into a wider segment since the list was read
        seg = _holding(store, batch_id, fresh=True)
        return None if seg is None else read(seg)


def folded_manifest(store: Store, batch_id: int) -> BatchManifest | None:
    """A folded batch's manifest (None: not folded)."""
    found = _in_segment(store, batch_id, lambda seg: _manifests(store, seg))
    return None if found is None else found.get(batch_id)


def folded_manifests(store: Store, after: int) -> Iterator[BatchManifest]:
    """The folded manifests of batches above ``after``, in batch order."""
    for seg in listing(store).segments:
        if seg.last > after:
            found = _manifests(store, seg)
            yield from (found[b] for b in sorted(found) if b > after)


def folded_decided(store: Store, batch_id: int, part: PartCommit) -> pa.Table | None:
    """A folded part's decisions (None: the part decided nothing, or is not folded)."""
    place = (batch_id, part.topic, part.partition)
    rows = _in_segment(store, batch_id, lambda seg: _decided_near(store, seg, batch_id))
    return None if rows is None or place not in rows else rows[place]


Place = tuple[int, str, int]
#: One segment's footer and its row groups' (first batch, last batch), by path: one footer
#: read a segment.
_GROUPS: dict[str, tuple[pq.FileMetaData, list[Span]]] = {}
#: The row groups last read of one segment, and their decisions by part (batch, topic,
#: partition). Readers of history walk batches in order, so each row group is read once (read
#: part by part, a row group of many batches was read, and filtered, again for every part).
_NEAR: dict[str, tuple[tuple[int, ...], dict[Place, pa.Table]]] = {}
#: Rows per row group of a segment's decisions: :data:`_NEAR` holds the row groups of one batch
#: (one or two, unless a batch decided more than this many records; segments folded before
#: this setting have pyarrow's default of about a million rows).
GROUP_ROWS: Final = 131_072


def _decided_near(store: Store, seg: Segment, batch_id: int) -> dict[Place, pa.Table]:
    """The decisions, by part, of the row groups of ``seg`` that hold ``batch_id``."""
    path = store.join(segment_stem(seg) + ".parquet")
    groups = _GROUPS.get(path)  # locals throughout: another thread may clear the caches
    if groups is None:
        with store.fs.open_input_file(path) as source:
            meta = pq.ParquetFile(source).metadata
        groups = (meta, [_batches_of(meta, i) for i in range(meta.num_row_groups)])
        _GROUPS.clear()
        _GROUPS[path] = groups
    meta, spans = groups
    wanted = tuple(i for i, (lo, hi) in enumerate(spans) if lo <= batch_id <= hi)
    held = _NEAR.get(path)
    if held is None or held[0] != wanted:
        parts: dict[Place, pa.Table] = {}
        if wanted:
            with store.fs.open_input_file(path) as source:
                rows = pq.ParquetFile(source, metadata=meta).read_row_groups(list(wanted))
            parts = _by_part(rows)
        held = (wanted, parts)
        _NEAR.clear()
        _NEAR[path] = held
    return held[1]


def _batches_of(meta: pq.FileMetaData, group: int) -> Span:
    """A row group's (first, last) batch; every batch when its statistics are missing."""
    column = meta.schema.names.index("batch")
    stats = meta.row_group(group).column(column).statistics
    if stats is None or not stats.has_min_max:
        return 0, 2**63 - 1
    return int(stats.min), int(stats.max)


def _by_part(rows: pa.Table) -> dict[Place, pa.Table]:
    """Rows of a segment split by part (a part's rows are one run: folds and merges append
    whole parts in order), without their ``batch``, ``topic`` and ``partition`` columns."""
    batch = rows.column("batch").to_numpy()
    partition = rows.column("partition").to_numpy()
    topics = rows.column("topic").combine_chunks()
    topic = topics.dictionary_encode().indices.to_numpy(zero_copy_only=False)
    if not rows.num_rows:
        return {}
    edges = np.flatnonzero(
        (batch[1:] != batch[:-1]) | (partition[1:] != partition[:-1]) | (topic[1:] != topic[:-1])
    )
    body = rows.drop_columns(["batch", "topic", "partition"])
    pieces: dict[Place, list[pa.Table]] = {}
    for start, end in pairwise([0, *(edges + 1).tolist(), rows.num_rows]):
        place = (int(batch[start]), topics[start].as_py(), int(partition[start]))
        pieces.setdefault(place, []).append(body.slice(start, end - start))
    return {place: pa.concat_tables(runs) for place, runs in pieces.items()}


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
    ``base`` (after the epoch check). Returns that list; None when another fold got there first
    (this one then deletes nothing). The caller then deletes the folded batches' own files."""
    seg = Segment(*span, secrets.token_hex(4))
    _put_segment(own, seg, [m.encode().replace(b"\n", b"") for m in manifests], decided)
    merged, gone = _merge(own, [*base.segments, seg])
    own.sync()  # the segments' Parquet files, before a list names them
    check_epoch(own, epoch)
    number = base.number + 1
    if not own.put_if_absent(_list_path(own, number), json.dumps(merged).encode()):
        return None
    if max(_numbers(own)) > number:
        # ``number`` was free again: newer lists were written and it was pruned (a fold stalled
        # here through several of another instance's). Its list is no newest: delete nothing.
        return None
    for old in gone:
        own.delete(own.join(segment_stem(old) + ".json"))
        own.delete(own.join(segment_stem(old) + ".parquet"))
    if base.number > 0:  # the list before ``base``: a reader that listed it has read it by now
        own.delete(_list_path(own, base.number - 1))
    return Listing(number, merged)


def with_place(decided: pa.Table, batch_id: int, part: PartCommit) -> pa.Table:
    """A part's decisions with the columns that place them in a segment."""
    n = decided.num_rows
    return (
        decided.append_column("batch", pa.array([batch_id] * n, pa.int64()))
        .append_column("topic", pa.array([part.topic] * n, pa.string()))
        .append_column("partition", pa.array([part.partition] * n, pa.int32()))
    )


def _put_segment(own: Store, seg: Segment, lines: list[bytes], pieces: list[pa.Table]) -> None:
    if pieces:
        path = own.join(segment_stem(seg) + ".parquet")
        own.write_table(path, pa.concat_tables(pieces), group_rows=GROUP_ROWS)
    own.put(own.join(segment_stem(seg) + ".json"), b"\n".join(lines) + b"\n")


def _merge(own: Store, segs: list[Segment]) -> tuple[list[Segment], list[Segment]]:
    """Merge runs of :data:`MERGE` adjacent segments of one span length into one of at most
    :data:`WIDEST` batches, repeatedly: (the segments now, the segments merged away, to delete
    once the new list is stored)."""
    gone: list[Segment] = []
    while True:
        at = next(
            (i for i in range(len(segs) - MERGE + 1) if _mergeable(segs[i : i + MERGE])), None
        )
        if at is None:
            return segs, gone
        run = segs[at : at + MERGE]
        merged = Segment(run[0].first, run[-1].last, secrets.token_hex(4))
        lines, pieces = [], []
        for seg in run:
            lines += [m.encode().replace(b"\n", b"") for m in _manifests(own, seg).values()]
            path = own.join(segment_stem(seg) + ".parquet")
            if own.exists(path):
                pieces.append(own.read_table(path))
        _put_segment(own, merged, lines, pieces)
        segs = [*segs[:at], merged, *segs[at + MERGE :]]
        gone += run


def _mergeable(run: list[Segment]) -> bool:
    widths = {seg.last - seg.first for seg in run}
    return len(widths) == 1 and run[-1].last - run[0].first + 1 <= WIDEST


__all__ = [
    "GROUP_ROWS",
    "LISTS",
    "OLD_LIST",
    "Listing",
    "Segment",
    "add_segment",
    "folded_decided",
    "folded_manifest",
    "folded_manifests",
    "list_number",
    "listing",
    "segments",
    "with_place",
]
