"""The simulated world between a producer and Kafka: its client and a hostile network.

:class:`SimClient` is what :class:`~pidfence.producer.IdempotentProducer` needs of
``confluent_kafka.Producer`` (``produce``, ``poll``, ``flush``, ``len``, ``list_topics``), so
the simulation runs the real producer, session and sender with only the world swapped.
:class:`Network` delivers a client's in-flight records to the simulated Kafka with drops,
duplicates and reordering, and calls the producer's delivery callbacks, as librdkafka does.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pidfence.ledger import LedgerEntry
from pidfence.producer.recovery import ScanState
from pidfence.sim.kafka import SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.wire import CERT_HEADER_KEY, FLAG_FENCE, MAC_HEADER_KEY, PF_HEADER_KEY, decode_pf

#: The one simulated topic.
TOPIC = "sim"


class SimStuck(RuntimeError):
    """A flush did not finish in its bounded loop (a simulation bug, not a pidfence one)."""


@dataclass(slots=True)
class InFlight:
    """A record handed to the client and not yet acknowledged."""

    partition: int
    pid: int
    seq: int
    fence: bool
    header: bytes
    cert: bytes | None
    key: bytes | None
    value: bytes
    ts_ms: int
    callback: Callable[[Any, Any], None]
    mac: bytes | None = None


class SimMessage:
    """A delivery report, as confluent-kafka passes it to ``on_delivery`` (no headers)."""

    __slots__ = ("_offset", "_rec")

    def __init__(self, rec: InFlight, offset: int) -> None:
        self._rec, self._offset = rec, offset

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._rec.partition

    def key(self) -> bytes | None:
        return self._rec.key

    def value(self) -> bytes:
        return self._rec.value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._rec.ts_ms)


class TimedOut:
    """The delivery error librdkafka reports for a record past ``message.timeout.ms``."""

    def name(self) -> str:
        return "_MSG_TIMED_OUT"

    def __str__(self) -> str:
        return "Local: Message timed out"


class SimClient:
    """One producer process's Kafka client.

    Args:
        conf: the librdkafka settings the producer built (its default ``on_delivery`` and
            ``message.timeout.ms`` are used).
        partitions: partitions of :data:`TOPIC`.
        clock: the simulated time (record timestamps).
        network: flushes deliver through it.
    """

    def __init__(
        self,
        conf: dict[str, Any],
        partitions: int,
        clock: Callable[[], int],
        network: Network,
    ) -> None:
        self._default = conf["on_delivery"]
        self.timeout_ms: int = conf["message.timeout.ms"]
        self._partitions = partitions
        self._clock = clock
        self._network = network
        self.pending: list[InFlight] = []
        #: False once the process died: nobody is left to record acknowledgements.
        self.acks = True
        #: (pid, partition) pairs with a record in Kafka (nothing overtakes a pid's first one).
        self.warm: set[tuple[int, int]] = set()

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int = -1,
        headers: list[tuple[str, Any]] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        """Queue one record (every producer record carries ``pf``; ``pfc`` when stamped)."""
        found = dict(headers or ())
        header = found[PF_HEADER_KEY]
        pf = decode_pf(header)
        self.pending.append(
            InFlight(
                partition,
                pf.pid,
                pf.seq,
                bool(pf.flags & FLAG_FENCE),
                header,
                found.get(CERT_HEADER_KEY),
                key,
                value or b"",
                self._clock(),
                on_delivery or self._default,
                found.get(MAC_HEADER_KEY),
            )
        )

    def poll(self, timeout: float = 0.0) -> int:
        """Callbacks run when the network delivers; nothing waits here."""
        return 0

    def flush(self, timeout: float = -1) -> int:
        """Deliver everything in flight (the network's bounded retry loop)."""
        self._network.flush(self)
        return 0

    def __len__(self) -> int:
        return len(self.pending)

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        """Metadata of :data:`TOPIC` (any other topic does not exist)."""
        parts = {p: None for p in range(self._partitions)} if topic == TOPIC else {}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)})

    def time_out(self, now_ms: int) -> bool:
        """A process woken from a pause: librdkafka fails records older than its
        ``message.timeout.ms``; returns True when some did."""
        late = [r for r in self.pending if now_ms - r.ts_ms > self.timeout_ms]
        for rec in late:
            self.pending.remove(rec)
            rec.callback(TimedOut(), SimMessage(rec, -1))
        return bool(late)

    def time_out_oldest(self, rng: random.Random) -> bool:
        """librdkafka's queue times out the oldest 1-3 data records of one partition (never
        sent, never written) while the records behind them go on: a hole in the partition.
        Returns True when some did."""
        parts = sorted({r.partition for r in self.pending if not r.fence})
        if not parts:
            return False
        partition = parts[rng.randrange(len(parts))]
        mine = [r for r in self.pending if r.partition == partition]
        late = []
        for rec in mine[: rng.randrange(1, 4)]:
            if rec.fence:
                break
            late.append(rec)
        for rec in late:
            self.pending.remove(rec)
            rec.callback(TimedOut(), SimMessage(rec, -1))
        return bool(late)


class KafkaReader:
    """A resume's recovery scan over the simulated Kafka (what ``KafkaScanner`` reads from a
    real cluster): a :data:`~pidfence.producer.recovery.Scanner`."""

    def __init__(self, kafka: SimKafka) -> None:
        self._kafka = kafka

    def __call__(
        self,
        state: ScanState,
        partitions: Iterable[tuple[str, int]],
        since_ms: int,
        until: Mapping[tuple[str, int], int],
    ) -> None:
        """Feed ``state`` each partition's records from ``since_ms`` up to ``until``."""
        kafka = self._kafka
        for tp in partitions:
            records = kafka.partitions[tp[1]]
            # What retention deleted cannot be read; a scan that starts at the first offset
            # left cannot tell whether it deleted any record since (as KafkaScanner).
            start = max(kafka.offset_for_time(tp[1], since_ms), kafka.log_start[tp[1]])
            if 0 < kafka.log_start[tp[1]] == start:
                state.head_deleted(tp)
            for rec in records[start : until.get(tp, len(records))]:
                headers = [(PF_HEADER_KEY, rec.header)]
                if rec.cert is not None:
                    headers.append((CERT_HEADER_KEY, rec.cert))
                if rec.mac is not None:
                    headers.append((MAC_HEADER_KEY, rec.mac))
                state.note(tp, headers, rec.ts_ms, rec.key, rec.value)


class Network:
    """Delivers in-flight records to the simulated Kafka with drops, duplicates and reordering.

    Args:
        rng: the schedule's randomness.
        knobs: ``drop_p``, ``dup_p``, ``reorder``, ``cold_reorder``.
        kafka: where records land.
    """

    def __init__(self, rng: random.Random, knobs: Knobs, kafka: SimKafka) -> None:
        self.rng = rng
        self.knobs = knobs
        self.kafka = kafka
        #: Every acknowledgement the producers recorded (their send ledger).
        self.ledger: list[LedgerEntry] = []
        #: What the network did: ``drops`` (lost sends, retried), ``duplicates`` (written, ack
        #: lost, written again), ``overtakes`` (a record delivered before an older one in flight).
        self.counts = {"drops": 0, "duplicates": 0, "overtakes": 0}

    def deliver_one(self, client: SimClient) -> None:
        """One delivery attempt of one of ``client``'s in-flight records: any whose seq is less
        than ``reorder`` past its partition's oldest unacknowledged seq (only that oldest one
        while its pid has no record on the partition yet, unless ``cold_reorder``)."""
        rng = self.rng
        # The window is measured from the oldest unacknowledged seq of each partition, not as
        # "any of the first N in flight": once later records are acknowledged (and held by the
        # broker) a count of in-flight records no longer bounds the gap the broker must hold,
        # and a record beyond ``hE + 1 + reorder_window`` is OUT_OF_ORDER, i.e. lost.
        pending = client.pending
        oldest: dict[int, int] = {}
        for rec in pending:
            oldest.setdefault(rec.partition, rec.seq)
        window = self.knobs.reorder
        choices = [i for i, r in enumerate(pending) if r.seq - oldest[r.partition] < window]
        idx = choices[rng.randrange(len(choices))]
        rec = pending[idx]
        if (rec.pid, rec.partition) not in client.warm and not self.knobs.cold_reorder:
            # Nothing overtakes a pid's first record on a partition: the broker has no entry to
            # hold a gap against (no E, s > 0 is UNKNOWN_PID). librdkafka's idempotence keeps
            # order; a client without it must wait for that first acknowledgement.
            idx = next(i for i, r in enumerate(pending) if r.partition == rec.partition)
            rec = pending[idx]
        if rng.random() < self.knobs.drop_p:
            self.counts["drops"] += 1
            return
        if rec.seq > oldest[rec.partition]:
            self.counts["overtakes"] += 1
        client.warm.add((rec.pid, rec.partition))
        offset = self.kafka.append(
            rec.partition, rec.header, rec.key, rec.value, rec.ts_ms, rec.cert, rec.mac
        )
        if rng.random() < self.knobs.dup_p and not (rec.fence and self.knobs.reorder == 1):
            # Written, ack lost: it stays in flight and is written again. Not a FENCE of an
            # in-order (librdkafka-idempotent) session: Kafka writes each of its records once,
            # and adoption takes a FENCE for the one its resume wrote (docs/gaps.md).
            self.counts["duplicates"] += 1
            return
        del pending[idx]
        if client.acks:
            rec.callback(None, SimMessage(rec, offset))

    def flush(self, client: SimClient) -> None:
        """Deliver until nothing is in flight (bounded; ``SimStuck`` otherwise)."""
        for _ in range(100_000):
            if not client.pending:
                return
            self.deliver_one(client)
        raise SimStuck("flush did not finish in 100000 attempts; lower drop_p")

    def land_or_lose(self, client: SimClient) -> int:
        """A dead process: each record still on the wire lands now (unacknowledged) or never;
        returns how many landed.

        With ``reorder=1`` (librdkafka's idempotence) the broker takes a session's records only
        in order, so what lands of each partition's in-flight records is a prefix.
        """
        landed = 0
        ordered = self.knobs.reorder == 1
        stopped: set[int] = set()
        for rec in client.pending:
            if rec.partition in stopped:
                continue
            if self.rng.random() < 0.5:
                landed += 1
                self.kafka.append(
                    rec.partition, rec.header, rec.key, rec.value, rec.ts_ms, rec.cert, rec.mac
                )
            elif ordered:
                stopped.add(rec.partition)
        client.pending.clear()
        return landed
