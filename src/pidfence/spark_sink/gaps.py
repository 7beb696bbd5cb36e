"""Gaps the sink reports instead of inheriting them (DESIGN §4 amended again).

Two kinds of evidence reach a batch:

* **Kafka offsets the sink never read** on a partition: its first read started above offset 0
  (retention trimmed the head, ``startingOffsets`` was ``latest`` or explicit), or a batch
  continued past offsets that were gone (retention during downtime, run with
  ``--allow-data-loss``). The batch then opens an adoption horizon at its first record
  (:meth:`~pidfence.broker_plugin.ProducerStateTable.open_horizon`) and reports an ``offsets``
  gap.
* **Seqs a producer will never deliver**, found by the rules: ``lost`` (the reorder window
  overflowed past them), ``head`` (a producer adopted beyond the horizon at a later seq).

Both are committed with the batch (in its manifest part, with the horizon the batch opened), so a
replay decides exactly as the live run did, and :func:`read_gaps` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

import pyarrow as pa

from pidfence.broker_plugin import Gap
from pidfence.spark_sink.schema import PLACE_FIELDS


@dataclass(frozen=True)
class GapReport:
    """One gap of one partition in one batch.

    Attributes:
        kind: ``offsets`` (Kafka offsets between ``offset_before`` and ``offset_after`` were never
            read; ``offset_before`` None: the sink's first read began at ``offset_after``),
            ``lost`` or ``head`` (seqs ``seq_first..seq_last`` of pid/generation).
        offset_before: Kafka offset of the record before the gap (the producer's seq
            ``seq_first - 1`` when it was in the same batch), else None.
        offset_after: Kafka offset of the first record after the gap.
    """

    kind: str
    pid: int | None = None
    generation: int | None = None
    seq_first: int | None = None
    seq_last: int | None = None
    offset_before: int | None = None
    offset_after: int | None = None

    def human(self) -> str:
        """``pid 7 gen 3: seq 50..50 lost`` or ``offsets 11..49 not read``."""
        if self.kind == "offsets":
            lo = 0 if self.offset_before is None else self.offset_before + 1
            return f"offsets {lo}..{self.offset_after - 1 if self.offset_after else '?'} not read"
        return (
            f"pid {self.pid} gen {self.generation}: seq {self.seq_first}..{self.seq_last} "
            f"{self.kind}"
        )


#: Every field of a report but ``kind`` is an integer or None.
_NUMBERS: Final = tuple(f.name for f in fields(GapReport) if f.name != "kind")
#: One row per reported gap, as :func:`read_gaps` returns them.
GAP_SCHEMA: Final = pa.schema(
    [*PLACE_FIELDS, ("batch", pa.int64()), ("kind", pa.string())]
    + [(name, pa.int64()) for name in _NUMBERS]
)


def unread_offsets(first_offset: int, last_read: int | None) -> GapReport | None:
    """The ``offsets`` gap before a batch's first record of a partition, or None.

    Args:
        first_offset: the batch's lowest Kafka offset of the partition.
        last_read: the highest offset of the partition in the committed batches (None: the
            partition was never read).
    """
    expected = 0 if last_read is None else last_read + 1
    if first_offset <= expected:
        return None
    return GapReport("offsets", offset_before=last_read, offset_after=first_offset)


def seq_gaps(
    gaps: Iterable[Gap], pids: Sequence[int], seqs: Sequence[int], offsets: Sequence[int]
) -> list[GapReport]:
    """Reports of the rules' gaps; ``pids``/``seqs``/``offsets`` are the batch's rows, used to
    find the record right before each gap when it was in the batch."""
    found = list(gaps)
    if not found:
        return []
    wanted = {(g.pid, g.first - 1) for g in found if g.first > 0}
    before: dict[tuple[int, int], int] = {}
    for pid, seq, offset in zip(pids, seqs, offsets, strict=True):
        if (pid, seq) in wanted:
            before.setdefault((pid, seq), int(offset))
    return [
        GapReport(
            g.kind,
            g.pid,
            g.generation,
            g.first,
            g.last,
            before.get((g.pid, g.first - 1)),
            None if g.ref is None else int(g.ref),
        )
        for g in found
    ]


def gaps_table(rows: Iterable[tuple[str, int, int, GapReport]]) -> pa.Table:
    """(topic, partition, batch, report) rows as a table of :data:`GAP_SCHEMA`."""
    data: dict[str, list[Any]] = {name: [] for name in GAP_SCHEMA.names}
    for topic, partition, batch, report in rows:
        data["topic"].append(topic)
        data["partition"].append(partition)
        data["batch"].append(batch)
        for key, value in asdict(report).items():
            data[key].append(value)
    return pa.table(data, schema=GAP_SCHEMA)
