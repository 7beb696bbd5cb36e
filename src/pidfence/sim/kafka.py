"""The simulated Kafka topic: append-only partitions that accept everything (at-least-once).

It can also lose what it acknowledged, as Kafka does after an unclean leader election or an
``acks=1`` failover (``lose_p``: the producer hears an acknowledgement, the record is never stored
and its offset goes to the next record; only data records past a producer's seq 0: a lost seq 0
leaves a producer the sink never saw start, with no offset hole to tell it, see docs/gaps.md),
and delete a partition's head as retention does
(:meth:`SimKafka.trim`: the records stay in the list, so offsets are list indexes, but readers
start at :attr:`SimKafka.log_start`).
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from pidfence.wire import MalformedHeader, PfHeader, decode_pf


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as Kafka stores it (``header``, ``cert``: raw ``pf``, ``pfc`` values or None)."""

    offset: int
    header: bytes | None
    key: bytes | None
    value: bytes
    ts_ms: int
    cert: bytes | None = None
    #: The ``pfm`` header (a per-record MAC) or None.
    mac: bytes | None = None

    def pf(self) -> PfHeader | None:
        """The decoded ``pf`` header of an idempotent record (pid > 0), else None."""
        if self.header is None:
            return None
        try:
            pf = decode_pf(self.header)
        except MalformedHeader:
            return None
        return pf if pf.pid else None


class SimKafka:
    """One topic with ``partitions`` partitions.

    Args:
        partitions: how many.
        lose_p: probability that an appended record is acknowledged and never stored.
        rng: the random source of the losses (its own stream, so a schedule without losses is
            the schedule it always was).
        log_append_time: timestamps are the broker's append time (a writer cannot set them
            back); producers' records are never stamped earlier than sent either way.
    """

    def __init__(
        self,
        partitions: int,
        lose_p: float = 0.0,
        rng: random.Random | None = None,
        log_append_time: bool = False,
    ) -> None:
        self.partitions: list[list[KafkaRecord]] = [[] for _ in range(partitions)]
        # Kafka's time index: the largest timestamp up to each offset (non-decreasing).
        self._max_ts: list[list[int]] = [[] for _ in range(partitions)]
        #: Per partition, the first offset retention has not deleted.
        self.log_start = [0] * partitions
        self.lose_p = lose_p
        self._rng = rng or random.Random(0)
        #: Records acknowledged and never stored: (partition, the offset they were told).
        self.lost: list[tuple[int, KafkaRecord]] = []
        #: ``message.timestamp.type=LogAppendTime``: a record's timestamp is the broker's
        #: :attr:`now` when it is appended, not what its writer set (CreateTime).
        self.log_append_time = log_append_time
        #: The broker's clock (the runner moves it every step).
        self.now = 0

    def trim(self, partition: int, upto: int) -> None:
        """Retention: delete the partition's records below offset ``upto`` (readers start at
        :attr:`log_start`)."""
        upto = min(upto, len(self.partitions[partition]))
        self.log_start[partition] = max(self.log_start[partition], upto)

    def offset_for_time(self, partition: int, ts_ms: int) -> int:
        """The first offset whose record (or an earlier one) has a timestamp >= ``ts_ms``, as
        Kafka's ``offsets_for_times`` finds it: every record before it is older."""
        return bisect.bisect_left(self._max_ts[partition], ts_ms)

    def append(
        self,
        partition: int,
        header: bytes | None,
        key: bytes | None,
        value: bytes,
        ts_ms: int,
        cert: bytes | None = None,
        mac: bytes | None = None,
    ) -> int:
        """Append one record; returns its offset (for a lost record, the offset it was told)."""
        if self.log_append_time:
            ts_ms = self.now
        log = self.partitions[partition]
        if self.lose_p and _losable(header) and self._rng.random() < self.lose_p:
            self.lost.append(
                (partition, KafkaRecord(len(log), header, key, value, ts_ms, cert, mac))
            )
            return len(log)
        log.append(KafkaRecord(len(log), header, key, value, ts_ms, cert, mac))
        times = self._max_ts[partition]
        times.append(max(times[-1], ts_ms) if times else ts_ms)
        return len(log) - 1


def _losable(header: bytes | None) -> bool:
    """A data record past its producer's seq 0 (what the loss model may lose)."""
    if header is None:
        return False
    try:
        pf = decode_pf(header)
    except MalformedHeader:
        return False
    return pf.pid > 0 and pf.seq > 0 and not pf.is_fence
