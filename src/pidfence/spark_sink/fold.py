"""When the sink folds its old batches, and what it deletes then: the driver's side of bounded
bookkeeping, after a commit every :data:`~pidfence.spark_sink.positions.INDEX_EVERY` batches.

The batches older than ``retainBatches`` are folded into segments
(:mod:`~pidfence.spark_sink.segments` writes and reads them), one fold's width at a time, and
their own files deleted, except those a partition's newest position still names.
"""

from __future__ import annotations

from pidfence.spark_sink.output import Output
from pidfence.spark_sink.positions import INDEX_EVERY
from pidfence.spark_sink.segments import Listing, add_segment, listing, with_place
from pidfence.spark_sink.storage import batch_name


def fold(output: Output, last: int, retain: int) -> None:
    """Fold the batches up to ``last - retain`` not folded yet into segments and delete their
    own files, except those a partition's newest position names (driver, after the commit of
    ``last``). Files an earlier fold kept for a partition's position go once the partition
    moved on (the previous index names them)."""
    own = output.own
    listed = listing(own)
    first = listed.segments[-1].last + 1 if listed.segments else 0
    upto = last - retain
    if upto < first:
        return
    keep = {n for pos in output.positions(last).values() for n in pos.part.files.named()}
    before = output.positions(last - INDEX_EVERY).values() if last >= INDEX_EVERY else ()
    moved = {n for pos in before if pos.batch < first for n in pos.part.files.named()} - keep
    for rel in (r for r in moved if not r.startswith("data/")):
        own.delete(own.join(rel))
        own.drop_empty_dir(own.join(rel.rpartition("/")[0]))
    # A backlog (a lowered retainBatches) is folded one fold's width at a time: the driver
    # holds one segment's manifests and decisions, never the whole backlog's.
    for start in range(first, upto + 1, INDEX_EVERY):
        span = (start, min(upto, start + INDEX_EVERY - 1))
        if (now := _fold_span(output, listed, span, keep)) is None:
            return  # another instance folded since: its lists stand, and the next fold goes on
        listed = now


def _fold_span(
    output: Output, base: Listing, span: tuple[int, int], keep: set[str]
) -> Listing | None:
    """Fold the batches of ``span`` into a segment after the list ``base``, then delete their
    own files but ``keep``; the new list (None: another fold wrote one first, nothing deleted)."""
    own = output.own
    folded = [m for b in range(span[0], span[1] + 1) if (m := output.committed(b)) is not None]
    decided = [
        with_place(rows, m.batch, part)
        for m in folded
        for part in m.parts
        if (rows := output.read_decided(m.batch, part)) is not None
    ]
    listed = add_segment(own, output.epoch, base, span, folded, decided)
    if listed is None:
        return None
    for manifest in folded:
        for rel in manifest.named() - keep:
            if not rel.startswith("data/"):
                own.delete(own.join(rel))
        own.delete(output.manifest_path(manifest.batch))
        for kind in ("held", "decided"):
            own.drop_empty_dir(own.join(f"_{kind}", batch_name(manifest.batch)))
    return listed


__all__ = ["fold"]
