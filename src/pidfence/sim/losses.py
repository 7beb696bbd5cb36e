"""What Kafka lost in one schedule, and which of the checker's findings that excuses.

Kafka may acknowledge a record and lose it (``Knobs.kafka_lose_p``). The sink must report the
hole as a gap and go on (DESIGN §4 amended again); the producer never re-sends an acknowledged
record, so the record itself is gone. A schedule is then correct when the checker's findings are
exactly those records, every one the rules could see past was reported as a gap, and nothing
else went wrong. A loss among a producer's last records on a partition, with fewer records after
it than the reorder window holds, is never passed: the records behind it wait, then are
``OUT_OF_ORDER`` when the schedule ends (the real sink keeps them held); they are the loss's
collateral, counted apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pidfence.sim.kafka import KafkaRecord
from pidfence.wire import decode_pf

#: (pid, partition, seq) of a record.
Ident = tuple[int, int, int]


@dataclass(frozen=True)
class Losses:
    """The records Kafka lost, split by what the sink could do about them.

    Attributes:
        lost: every record Kafka acknowledged and never stored.
        reported: those inside a gap the sink reported.
        tail: those the sink never passed (too few records followed).
        collateral: records rejected as ``OUT_OF_ORDER`` behind a tail loss.
    """

    lost: frozenset[Ident]
    reported: frozenset[Ident]
    tail: frozenset[Ident]
    collateral: frozenset[Ident]

    @property
    def excused(self) -> frozenset[Ident]:
        """What the checker may report as lost because of Kafka: the losses and collateral."""
        return self.lost | self.collateral

    def stats(self) -> dict[str, int]:
        """Counts for a schedule's stats."""
        return {
            "kafka_lost": len(self.lost),
            "kafka_lost_reported": len(self.reported),
            "kafka_lost_tail": len(self.tail),
            "kafka_lost_collateral": len(self.collateral),
        }


def account(
    lost: Iterable[tuple[int, KafkaRecord]], gaps: Sequence[tuple[Any, ...]], rejects: pa.Table
) -> Losses:
    """Split ``lost`` (``SimKafka.lost``) by the sink's ``gaps`` (``SimSink.gaps``)."""
    ids = set()
    for partition, rec in lost:
        if rec.header is not None:
            pf = decode_pf(rec.header)
            ids.add((pf.pid, partition, pf.seq))
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
    for pid, p, seq, verdict in rows:
        start = first_tail.get((pid, p))
        if verdict == "OUT_OF_ORDER" and start is not None and seq > start:
            collateral.add((pid, p, seq))
    return Losses(frozenset(ids), frozenset(covered), frozenset(tail), frozenset(collateral))
