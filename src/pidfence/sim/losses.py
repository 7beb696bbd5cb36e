"""What Kafka lost in one schedule (or the sink never read), and which findings that excuses.

Kafka may acknowledge a record and lose it (``Knobs.kafka_lose_p``). The sink must report the
hole as a gap and go on (DESIGN §4 amended again); the producer does not re-send an acknowledged
record (a resume from an older checkpoint may write its seq again), so the record itself is gone.
A schedule is then correct when the checker's findings are exactly those records, every one the
rules could see past was reported as a gap, and nothing else went wrong.

Which losses the rules can see past is read from Kafka, not from the sink: gap resolution skips a
hole only when a record of the producer lands more than the reorder window past it (the rules
skip a gap at seq ``s > highwater + 1 + reorder_window``, :mod:`pidfence.spark_sink.gaps`). A loss
that no stored record of its pid on its partition (of its generation or a later one, not fenced)
lies that far past is a **tail** loss: the records behind it wait, then are ``OUT_OF_ORDER``
when the schedule ends (the real sink keeps them held); they are the loss's collateral, counted
apart. A loss whose seq Kafka stores all the same (a duplicate's other copy, or a resume from an
older checkpoint writing the seq again) is **healed**: it leaves no hole. Only tail losses have
collateral; every other loss must be inside a reported gap.

Records the sink never read (retention deleted them first, or it started at the end of the log)
are the same to it: an acknowledged record it never read is excused (``unread``), and so is a
record refused ``OUT_OF_ORDER`` right behind one (nothing the sink appended lies between them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pidfence.sim.kafka import KafkaRecord

#: (pid, partition, seq) of a record.
Ident = tuple[int, int, int]


@dataclass(frozen=True)
class Losses:
    """The records Kafka lost, split by what the sink could do about them.

    Attributes:
        lost: every record Kafka acknowledged and never stored.
        reported: those inside a gap the sink reported.
        tail: those Kafka stores no record far enough past for gap resolution to skip them
            (read from Kafka: see the module docstring).
        healed: those whose seq Kafka stores all the same (another copy of the record, or a
            resume's re-send): no hole is left. Every loss neither tail nor healed must be
            reported.
        collateral: records rejected as ``OUT_OF_ORDER`` behind a tail loss or an unread record.
        unread: ``(partition, offset)`` of the records the sink never read (deleted, or before
            its start).
    """

    lost: frozenset[Ident]
    reported: frozenset[Ident]
    tail: frozenset[Ident]
    collateral: frozenset[Ident]
    unread: frozenset[tuple[int, int]] = frozenset()
    healed: frozenset[Ident] = frozenset()

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
            "kafka_lost_healed": len(self.healed),
            "kafka_lost_collateral": len(self.collateral),
            "unread": len(self.unread),
        }


def account(
    lost: Iterable[tuple[int, KafkaRecord]],
    gaps: Sequence[tuple[Any, ...]],
    rejects: pa.Table,
    unread: Iterable[tuple[int, KafkaRecord]] = (),
    log: pa.Table | None = None,
    *,
    stored: Sequence[Sequence[KafkaRecord]],
    reorder_window: int,
    forged: Collection[tuple[int, int]] = (),
) -> Losses:
    """Split ``lost`` (``SimKafka.lost``) by Kafka's own records and the sink's ``gaps``
    (``SimSink.gaps``).

    Args:
        lost: what Kafka acknowledged and never stored (each with the offset it was told).
        gaps: the sink's reported gaps.
        rejects: the sink's rejects.
        unread: records stored but never read by the sink.
        log: the sink's log (which seqs it appended below an unread record).
        stored: Kafka's partitions (``SimKafka.partitions``): which losses are tail losses.
        reorder_window: the sink's reorder window (gap resolution's threshold).
        forged: ``(partition, offset)`` of the attacker's records among ``stored`` (not the
            producers': they resolve no gap).
    """
    lost = list(lost)
    ids = {i[:3] for i in _idents(lost)}
    unread = list(unread)
    unseen = _idents(unread)
    covered = {
        ident
        for ident in ids
        for p, kind, pid, _g, first, last, _ref in gaps
        if kind == "lost" and (pid, p) == ident[:2] and first <= ident[2] <= last
    }
    tail, healed = _tail(lost, stored, reorder_window, forged)
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
        if any(i[:2] == (pid, p) and below < i[2] < seq for i in unseen | tail):
            collateral.add((pid, p, seq))
    return Losses(
        frozenset(ids),
        frozenset(covered),
        frozenset(tail),
        frozenset(collateral),
        frozenset((p, rec.offset) for p, rec in unread),
        frozenset(healed),
    )


def _tail(
    lost: Sequence[tuple[int, KafkaRecord]],
    stored: Sequence[Sequence[KafkaRecord]],
    reorder_window: int,
    forged: Collection[tuple[int, int]],
) -> tuple[set[Ident], set[Ident]]:
    """The tail losses and the healed ones, read from Kafka.

    Of the stored data records of a loss's pid on its partition that are not fenced (their
    generation is the newest of the pid so far): one at the lost seq heals it (a copy of it
    was stored, or a resume wrote the seq again); without one, a loss none of those after the
    offset it was told, of its generation or later, lies more than ``reorder_window`` seqs
    past is a tail loss.
    """
    tail: set[Ident] = set()
    healed: set[Ident] = set()
    by_partition: dict[int, list[tuple[int, int, int, int]]] = {}
    for pid, p, seq, gen in _idents(lost):
        by_partition.setdefault(p, []).append((pid, seq, gen, _told(lost, p, pid, seq, gen)))
    for p, losses in by_partition.items():
        # Per pid, the highest seq of each unfenced data record, by offset.
        newest: dict[int, int] = {}
        reach: dict[int, list[tuple[int, int, int]]] = {}
        for rec in stored[p] if p < len(stored) else ():
            pf = rec.pf()
            if pf is None or (p, rec.offset) in forged:
                continue
            newest[pf.pid] = max(newest.get(pf.pid, -1), pf.generation)
            if not pf.is_fence and pf.generation == newest[pf.pid]:
                reach.setdefault(pf.pid, []).append((rec.offset, pf.generation, pf.seq))
        for pid, seq, gen, told in losses:
            later = reach.get(pid, ())
            if any(s == seq for _, _, s in later):
                healed.add((pid, p, seq))
            elif not any(
                offset >= told and g >= gen and s > seq + reorder_window for offset, g, s in later
            ):
                tail.add((pid, p, seq))
    return tail, healed


def _told(lost: Sequence[tuple[int, KafkaRecord]], p: int, pid: int, seq: int, gen: int) -> int:
    """The offset Kafka told the writer of a lost record."""
    for partition, rec in lost:
        pf = rec.pf()
        if partition == p and pf is not None and (pf.pid, pf.seq, pf.generation) == (pid, seq, gen):
            return rec.offset
    raise KeyError((p, pid, seq, gen))


def _idents(records: Iterable[tuple[int, KafkaRecord]]) -> set[tuple[int, int, int, int]]:
    """(pid, partition, seq, generation) of the data records among ``records`` (FENCEs have
    no event)."""
    out = set()
    for partition, rec in records:
        pf = rec.pf()
        if pf is not None and not pf.is_fence:
            out.add((pf.pid, partition, pf.seq, pf.generation))
    return out
