"""What Kafka lost in one schedule (or the sink never read), and which findings that excuses.

Kafka may acknowledge a record and lose it (``Knobs.kafka_lose_p``). The sink must report the
hole as a gap and go on (DESIGN §4 amended again); the producer never re-sends an acknowledged
record, so the record itself is gone. A schedule is then correct when the checker's findings are
exactly those records, every one the rules could see past was reported as a gap, and nothing
else went wrong. A loss among a producer's last records on a partition, with fewer records after
it than the reorder window holds, is never passed: the records behind it wait, then are
``OUT_OF_ORDER`` when the schedule ends (the real sink keeps them held); they are the loss's
collateral, counted apart.

Records the sink never read (retention deleted them first, or it started at the end of the log)
are the same to it: an acknowledged record it never read is excused (``unread``), and so is a
record refused ``OUT_OF_ORDER`` right behind one (nothing the sink appended lies between them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pidfence.sim.kafka import KafkaRecord
from pidfence.wire import MalformedHeader, decode_pf

#: (pid, partition, seq) of a record.
Ident = tuple[int, int, int]


@dataclass(frozen=True)
class Losses:
    """The records Kafka lost, split by what the sink could do about them.

    Attributes:
        lost: every record Kafka acknowledged and never stored.
        reported: those inside a gap the sink reported.
        tail: those the sink never passed (too few records followed).
        collateral: records rejected as ``OUT_OF_ORDER`` behind a tail loss or an unread record.
        unread: ``(partition, offset)`` of the records the sink never read (deleted, or before
            its start).
    """

    lost: frozenset[Ident]
    reported: frozenset[Ident]
    tail: frozenset[Ident]
    collateral: frozenset[Ident]
    unread: frozenset[tuple[int, int]] = frozenset()

    @property
    def excused(self) -> frozenset[Ident]:
        """What the checker may report as lost because of Kafka: the losses and collateral
        (the unread records: :meth:`covers`)."""
        return self.lost | self.collateral

    def covers(self, pid: int, partition: int, seq: int, offset: int) -> bool:
        """Whether an acknowledged record (written at ``offset``) may be missing: Kafka lost
        it, the sink never read it, or it waits behind one of those."""
        return (pid, partition, seq) in self.excused or (partition, offset) in self.unread

    def stats(self) -> dict[str, int]:
        """Counts for a schedule's stats."""
        return {
            "kafka_lost": len(self.lost),
            "kafka_lost_reported": len(self.reported),
            "kafka_lost_tail": len(self.tail),
            "kafka_lost_collateral": len(self.collateral),
            "unread": len(self.unread),
        }


def account(
    lost: Iterable[tuple[int, KafkaRecord]],
    gaps: Sequence[tuple[Any, ...]],
    rejects: pa.Table,
    unread: Iterable[tuple[int, KafkaRecord]] = (),
    log: pa.Table | None = None,
) -> Losses:
    """Split ``lost`` (``SimKafka.lost``) by the sink's ``gaps`` (``SimSink.gaps``).

    Args:
        lost: what Kafka acknowledged and never stored.
        gaps: the sink's reported gaps.
        rejects: the sink's rejects.
        unread: records stored but never read by the sink.
        log: the sink's log (which seqs it appended below an unread record).
    """
    ids = {i[:3] for i in _idents(lost)}
    unread = list(unread)
    unseen = _idents(unread)
    covered = {
        ident
        for ident in ids
        for p, kind, pid, _g, first, last, _ref in gaps
        if kind == "lost" and (pid, p) == ident[:2] and first <= ident[2] <= last
    }
    tail = ids - covered
    first_tail: dict[tuple[int, int], int] = {}
    for pid, p, seq in tail:
        first_tail[(pid, p)] = min(seq, first_tail.get((pid, p), seq))
    collateral = set()
    rows = zip(
        rejects["pid"].to_pylist(),
        rejects["partition"].to_pylist(),
        rejects["seq"].to_pylist(),
        rejects["verdict"].to_pylist(),
        strict=True,
    )
    appended: dict[tuple[int, int], list[int]] = {}
    if log is not None:
        for pid, p, seq in zip(
            log["pid"].to_pylist(),
            log["partition"].to_pylist(),
            log["seq"].to_pylist(),
            strict=True,
        ):
            appended.setdefault((pid, p), []).append(seq)
    for pid, p, seq, verdict in rows:
        if verdict != "OUT_OF_ORDER":
            continue
        start = first_tail.get((pid, p))
        if start is not None and seq > start:
            collateral.add((pid, p, seq))
            continue
        below = max((s for s in appended.get((pid, p), ()) if s < seq), default=-1)
        if any(i[:2] == (pid, p) and below < i[2] < seq for i in unseen | ids):
            collateral.add((pid, p, seq))
    return Losses(
        frozenset(ids),
        frozenset(covered),
        frozenset(tail),
        frozenset(collateral),
        frozenset((p, rec.offset) for p, rec in unread),
    )


def _idents(records: Iterable[tuple[int, KafkaRecord]]) -> set[tuple[int, int, int, int]]:
    """(pid, partition, seq, generation) of the data records among ``records`` (FENCEs have
    no event)."""
    out = set()
    for partition, rec in records:
        if rec.header is None:
            continue
        try:
            pf = decode_pf(rec.header)
        except MalformedHeader:
            continue
        if pf.pid and not pf.is_fence:
            out.add((pf.pid, partition, pf.seq, pf.generation))
    return out
