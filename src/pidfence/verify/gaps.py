"""Upstream gaps in the checker: the gaps the sink reported, told apart from losses.

A gap is information (``upstream_gap``): seqs Kafka never delivered, a producer's head before the
sink's horizon, offsets the sink never read. An acknowledged record inside one is still ``lost``
(Kafka acknowledged it and the output does not have it); its example names the gap. A skipped gap
stays open: a record that arrives for it later is appended late (a ``filled`` report), after
records of higher seqs, which is no reordering (:func:`filled`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pyarrow as pa

from pidfence.verify.finding import Finding

#: (pid, topic, partition) -> [(first seq, last seq, kind)] of the reported seq gaps.
SeqGaps = dict[tuple[int, str, int], list[tuple[int, int, str]]]
Identity = tuple[int, str, int, int]


def seq_gaps(gaps: pa.Table | None) -> SeqGaps:
    """The reported gaps that name seqs, by producer stream."""
    out: SeqGaps = defaultdict(list)
    if gaps is None or not gaps.num_rows:
        return out
    for row in gaps.to_pylist():
        if row.get("pid") is not None and row.get("seq_first") is not None:
            key = (int(row["pid"]), str(row["topic"]), int(row["partition"]))
            out[key].append((int(row["seq_first"]), int(row["seq_last"]), str(row["kind"])))
    return out


def filled(gaps: pa.Table | None) -> set[Identity]:
    """``(pid, topic, partition, seq)`` of every record the sink appended late into an open
    hole (reports of kind ``filled``)."""
    if gaps is None or not gaps.num_rows:
        return set()
    return {
        (int(row["pid"]), str(row["topic"]), int(row["partition"]), seq)
        for row in gaps.to_pylist()
        if row.get("kind") == "filled"
        for seq in range(int(row["seq_first"]), int(row["seq_last"]) + 1)
    }


def gap_of(gaps: SeqGaps, ident: Identity) -> str | None:
    """``"lost seq 50..50"`` when ``ident`` is inside a reported gap, else None."""
    for first, last, kind in gaps.get(ident[:3], ()):
        if first <= ident[3] <= last:
            return f"{kind} seq {first}..{last}"
    return None


def report_gaps(gaps: pa.Table | None, acked: Iterable[Identity], finding: Finding) -> None:
    """One case per reported gap, with how many acknowledged records fall inside it."""
    if gaps is None or not gaps.num_rows:
        return
    by_stream: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    for pid, topic, partition, seq in acked:
        by_stream[(pid, topic, partition)].append(seq)
    for row in gaps.to_pylist():
        example = {k: v for k, v in row.items() if v is not None}
        if row.get("pid") is not None and row.get("seq_first") is not None:
            seqs = by_stream.get((int(row["pid"]), str(row["topic"]), int(row["partition"])), [])
            example["acknowledged_inside"] = sum(
                1 for s in seqs if row["seq_first"] <= s <= row["seq_last"]
            )
        finding.add(example)
