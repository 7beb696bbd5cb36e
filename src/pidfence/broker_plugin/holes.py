"""Open holes: seqs a producer's gap skipped, kept so a later record can still fill them.

When the reorder window overflows, the table reports the missing seqs as a gap and moves the
highwater past them (gap resolution). The seqs are not given up: librdkafka's idempotent
producer leaves such holes when records time out in its queue (its INTRODUCTION.md, "Message
timeout considerations"), and the producer's resume re-sends them under the next generation. So
an entry keeps its open holes as sorted, disjoint ``[first, last]`` ranges (at most
:data:`~pidfence.broker_plugin.entry.MAX_HOLES`), and a record that falls in one is appended
late instead of being called the ``DUPLICATE`` of a record that never arrived (DESIGN §4 amended
a third time).
"""

from __future__ import annotations

import bisect

from pidfence.broker_plugin.entry import MAX_HOLES, Entry


def find(entry: Entry, seq: int) -> int:
    """The index of the hole of ``entry`` that holds ``seq``, or -1."""
    holes = entry.holes
    if not holes:
        return -1
    at = bisect.bisect_right(holes, [seq, 2**63]) - 1
    return at if at >= 0 and holes[at][0] <= seq <= holes[at][1] else -1


def room(entry: Entry) -> bool:
    """Whether ``entry`` can keep one more hole."""
    return entry.holes is None or len(entry.holes) < MAX_HOLES


def add(entry: Entry, first: int, last: int) -> None:
    """Open the hole ``first..last`` above every other (check :func:`room` first)."""
    if entry.holes is None:
        entry.holes = []
    entry.holes.append([first, last])


def fill(entry: Entry, at: int, seq: int) -> bool:
    """Close ``seq`` in hole ``at``; False (nothing changed) when that would split the hole in
    two and ``entry`` already keeps :data:`~pidfence.broker_plugin.entry.MAX_HOLES`."""
    holes = entry.holes
    assert holes is not None  # noqa: S101 - find() returned a hole
    first, last = holes[at]
    if first < seq < last:
        if len(holes) >= MAX_HOLES:
            return False
        holes[at : at + 1] = [[first, seq - 1], [seq + 1, last]]
    elif first == last:
        del holes[at]
    elif seq == first:
        holes[at][0] = seq + 1
    else:
        holes[at][1] = seq - 1
    if not holes:
        entry.holes = None
    return True
