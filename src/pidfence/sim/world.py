"""Faults of the world around the sink: retention, and old records written again.

* :func:`trim_scanned`: retention deletes a partition's head, but never a record a producer's
  resume may still scan (one written after a stored checkpoint), as retention longer than a
  checkpoint's age keeps it. A sink behind it finds offsets it never read, opens a horizon and
  adopts through the authority; a zombie whose FENCE went writes beyond that horizon.
* :func:`resend_ended`: a copy of a record whose lease has ended is written again, as a stuck
  retry or a replay tool would: the sink must never append it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pidfence.ledger import LedgerEntry
from pidfence.sim.kafka import SimKafka
from pidfence.sim.oracle import pf_of


def trim_scanned(kafka: SimKafka, chains: Sequence[Any], rng: random.Random) -> None:
    """Delete each partition's head up to a random point below the oldest record any stored
    checkpoint's resume would scan (records from its ``taken_ms`` on)."""
    taken = [c.checkpoint[0].taken_ms for c in chains if c.checkpoint is not None]
    taken += [c.second[0].taken_ms for c in chains if c.second is not None]
    if not taken:
        return
    safe_ms = min(taken)
    for p in range(len(kafka.partitions)):
        end = kafka.offset_for_time(p, safe_ms)
        start = kafka.log_start[p]
        if end > start:
            kafka.trim(p, rng.randrange(start + 1, end + 1))


def resend_ended(
    kafka: SimKafka, ledger: Sequence[LedgerEntry], now: int, rng: random.Random
) -> bool:
    """Write again a copy of one record (data or FENCE) of a pid whose lease ended before
    ``now``; returns whether one was found."""
    ends = {e.pid: e.expire_ms for e in ledger if e.expire_ms}
    for _ in range(8):
        p = rng.randrange(len(kafka.partitions))
        records = kafka.partitions[p]
        if not records:
            continue
        rec = records[rng.randrange(len(records))]
        found = pf_of(rec)
        if found is not None and ends.get(found[0], now) < now:
            kafka.append(p, rec.header, rec.key, rec.value, rec.ts_ms, rec.cert, rec.mac)
            return True
    return False
