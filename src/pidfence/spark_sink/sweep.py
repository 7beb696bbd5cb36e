"""``sink vacuum`` for the sink's own files: what under ``P/_pidfence/`` nothing reads any more.

The sink folds its old batches itself (:mod:`~pidfence.spark_sink.fold`); what a fold cannot
delete at the time is left for this sweep: the files of a partition's newest batch, kept while
an idle partition's position named them and orphaned once it moved on; files of attempts that
never committed and that no later attempt of their batch cleaned up (a fenced instance that
wrote after its successor committed the batch, a process killed before its clean-up); manifests
and segments a crash left between a fold's steps; indexes older than the two kept. Claims are
never deleted: a paused owner's fence rests on the claim after its own (claims.py).

A file goes only when all of these hold:

* nothing a sink, a reader or a state rebuild starts from names it: its batch is folded (at or
  below the newest folded batch, so every attempt of it is over: Spark re-runs no batch that
  old, and a re-run of a committed batch writes nothing) and no partition's newest position
  names it; or it is a segment that the newest list of segments does not name, an older list,
  or an index older than the two kept;
* its attempt's epoch is at most the newest claim's when the sweep began (a sink instance that
  claimed the output since is never touched; claims.py);
* it is at least ``min_age`` old (a fold in flight writes its segment before naming it).

State files (``_state/``) are left to the sink, which drops old chains as it writes full
snapshots (state_files.py). Safe while the sink runs, on local disks and object stores.
"""

from __future__ import annotations

import time
from typing import Final

from pidfence.spark_sink.claims import newest_claim, tag_epoch
from pidfence.spark_sink.output import MANIFESTS, Output
from pidfence.spark_sink.positions import INDEX, INDEX_EVERY
from pidfence.spark_sink.segments import (
    FOLDED,
    LISTS,
    OLD_LIST,
    folded_manifest,
    list_number,
    listing,
    segment_stem,
)
from pidfence.spark_sink.storage import Store

#: A fold's steps take seconds; an hour leaves room for the slowest store and a paused process.
MIN_AGE_S: Final = 3600.0


def _number(name: str) -> int | None:
    stem = name.partition(".")[0]
    return int(stem) if stem.isdigit() else None


class _Sweep:
    """What one sweep of one output knows as it begins."""

    def __init__(self, output: Output) -> None:
        own = output.own
        claim = newest_claim(own)
        self.epoch = 0 if claim is None else claim.epoch
        listed = listing(own)
        #: The newest list of segments (-1: none).
        self.newest_list = listed.number
        #: Every batch at or below it is folded (-1: none).
        self.folded = listed.segments[-1].last if listed.segments else -1
        #: The file names (without extension) of the segments the newest list names.
        self.stems = {segment_stem(seg).rpartition("/")[2] for seg in listed.segments}
        top = output.committed_version()
        positions = output.positions(top).values() if top >= 0 else ()
        self.keep = {rel for pos in positions for rel in pos.part.files.named()}
        try:
            self.index = int(own.read(own.join(INDEX, "latest")).decode())
        except (FileNotFoundError, ValueError):
            self.index = -1
        self.own = own

    def unneeded(self, rel: str) -> bool:
        """Whether nothing reads ``rel`` (relative to ``_pidfence/``) any more."""
        head, _, name = rel.partition("/")
        number = _number(name.rpartition("/")[2])
        if head in ("_held", "_decided"):
            batch, _, file = name.partition("/")
            epoch = tag_epoch(file.removesuffix(".parquet").rpartition(".")[2])
            return (
                batch.isdigit()
                and int(batch) <= self.folded
                and rel not in self.keep
                and (epoch or 0) <= self.epoch
            )
        if rel.startswith(INDEX + "/"):
            return number is not None and number < self.index - INDEX_EVERY
        if head == MANIFESTS:
            return (
                number is not None
                and number <= self.folded
                and folded_manifest(self.own, number) is not None
            )
        if rel.startswith(LISTS + "/"):
            number = list_number(rel.rpartition("/")[2])
            return number is not None and number < self.newest_list
        if rel == OLD_LIST:  # replaced by the numbered lists once one exists
            return self.newest_list >= 0
        if head == FOLDED:
            return name.partition(".")[0] not in self.stems
        return False


def sweep(path: str, min_age_s: float = MIN_AGE_S, dry_run: bool = False) -> list[str]:
    """Delete what under ``path/_pidfence/`` nothing reads any more (see the module's rules);
    returns those files, relative to ``_pidfence/``, sorted. An output without the sink's
    files has nothing to sweep."""
    output = Output.reading(path)
    own: Store = output.own
    found = _Sweep(output)
    now_ns = time.time_ns()
    doomed = sorted(
        rel
        for rel, stat in own.files(own.root)
        if (now_ns - (stat.mtime_ns or now_ns)) / 1e9 >= min_age_s and found.unneeded(rel)
    )
    if not dry_run:
        for rel in doomed:
            own.delete(own.join(rel))
        for folder in {rel.rpartition("/")[0] for rel in doomed}:
            own.drop_empty_dir(own.join(folder))
    return doomed


__all__ = ["MIN_AGE_S", "sweep"]
