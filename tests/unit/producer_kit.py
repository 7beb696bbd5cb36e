"""A fake Kafka client and a fake lease client for unit tests of ``IdempotentProducer``.

:class:`FakeLeaseClient` keeps the lease protocol's owner-only and lineage rules in memory;
:class:`FakeKafka` queues records and acknowledges them in order on ``poll``/``flush``;
:class:`Rig` builds producers (and resumes) on both, with a clock the test moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import confluent_kafka

from pidfence.pid_allocator.errors import (
    LeaseServerUnreachable,
    NotOwner,
    StaleGeneration,
    UnknownPid,
)
from pidfence.producer import IdempotentProducer, ProducerCheckpoint, ProducerConfig
from pidfence.producer.recovery import ScanState
from pidfence.wire import decode_pf
from pidfence.wire.mac import derive_record_key
from tests.unit.kafka_kit import Message

LIFETIME = 24_000


@dataclass(frozen=True)
class FakeLease:
    """A lease reply."""

    pid: int
    generation: int
    sequence: int
    expire_ms: int
    secret: bytes = b""
    cert: bytes | None = None
    mac_key: bytes | None = None


class FakeLeaseClient:
    """The lease protocol's owner-only and lineage rules (DESIGN §5 amended, §9), in memory."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.next_pid = 100
        self.latest: dict[int, int] = {}
        self.expire: dict[int, int] = {}
        self.secret: dict[int, bytes] = {}
        self.parent: dict[int, int] = {}  # successor -> the pid rolled into it
        self.successor: dict[int, tuple[int, int]] = {}  # retired pid -> (successor, start gen)
        self.down = False
        self.sign = False
        #: The per-record mode: every reply carries the pid's MAC key from this secret.
        self.mac_secret: bytes | None = None
        self.calls: list[str] = []

    def _issue(self) -> FakeLease:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        self.latest[pid] = 40
        self.expire[pid] = self.clock() + LIFETIME
        self.secret[pid] = b"s%d" % pid
        return self._reply(pid)

    def _reply(self, pid: int) -> FakeLease:
        gen, expire = self.latest[pid], self.expire[pid]
        cert = b"cert-%d-%d" % (pid, gen) if self.sign else None
        mac_key = None if self.mac_secret is None else derive_record_key(self.mac_secret, pid)
        return FakeLease(pid, gen, 0, expire, self.secret[pid], cert, mac_key)

    def _check(self, pid: int, generation: int, secret: bytes) -> None:
        if self.down:
            raise LeaseServerUnreachable("no lease server answered")
        parent = self.parent.get(pid)
        allowed = {self.secret.get(pid), self.secret.get(parent) if parent else None}
        if pid not in self.latest or secret not in allowed - {None}:
            raise NotOwner("not the owner")
        if pid in self.successor:
            succ, start = self.successor[pid]
            raise StaleGeneration(f"pid {pid} was rolled into {succ}", succ, start)
        if self.latest[pid] != generation:
            raise StaleGeneration(f"pid {pid} is at {self.latest[pid]}")

    def lease(
        self, partitions: Sequence[tuple[str, int]] = (), *, key: bytes | None = None
    ) -> FakeLease:
        self.calls.append("lease")
        if self.down:
            raise LeaseServerUnreachable("no lease server answered")
        return self._issue()

    def bump(
        self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None
    ) -> FakeLease:
        self.calls.append(f"bump {pid} {generation}")
        self._check(pid, generation, secret)
        if self.expire[pid] <= self.clock():
            raise UnknownPid(f"pid {pid} expired")
        self.latest[pid] = generation + 1
        return self._reply(pid)

    def roll(
        self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None
    ) -> FakeLease:
        self.calls.append(f"roll {pid} {generation}")
        self._check(pid, generation, secret)
        successor = self._issue()
        self.successor[pid] = (successor.pid, successor.generation)
        self.parent[successor.pid] = pid
        return successor


class FakeKafka:
    """Queues records; poll/flush acknowledge them in order (or fail the ones marked)."""

    def __init__(self, conf: dict[str, Any], topics: dict[str, int]) -> None:
        self.conf = conf
        self.topics = topics
        self.pending: list[tuple[Message, Any]] = []
        self.log: list[Message] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.fail: Any = None
        self.full_once = False
        self.broker_down = False
        self.stuck = False

    def produce(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        headers: Any,
        on_delivery: Any = None,
    ) -> None:
        if self.full_once:
            self.full_once = False
            raise BufferError("queue full")
        callback = on_delivery or self.conf["on_delivery"]
        self.pending.append((Message(topic, partition, -1, key, value, headers), callback))

    def poll(self, timeout: float = 0) -> int:
        served, self.pending = self.pending, []
        for msg, callback in served:
            if self.fail is not None:
                callback(self.fail, msg.report())
                continue
            tp = (msg.topic(), msg.partition())
            msg.offset_ = self.offsets.get(tp, 0)
            self.offsets[tp] = msg.offset_ + 1
            self.log.append(msg)
            callback(None, msg.report())
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        if self.stuck:
            return len(self.pending)
        self.poll()
        return 0

    def __len__(self) -> int:
        return len(self.pending)

    def list_topics(self, topic: str, timeout: float) -> Any:
        if self.broker_down:
            raise confluent_kafka.KafkaException(
                confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT)
            )
        if topic not in self.topics:
            return SimpleNamespace(
                topics={topic: SimpleNamespace(error="UNKNOWN_TOPIC_OR_PART", partitions={})}
            )
        parts = {i: object() for i in range(self.topics[topic])}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=parts)})


class Rig:
    """A clock, a fake lease client and a fake Kafka; producers and resumes built on them."""

    def __init__(self) -> None:
        self.now = 1_000_000
        self.lease = FakeLeaseClient(self.clock)
        self.kafka: FakeKafka | None = None
        self.config = ProducerConfig("127.0.0.1:9", sticky_records=3, resend_buffer=4)

    def clock(self) -> int:
        return self.now

    def factory(self, conf: dict[str, Any]) -> FakeKafka:
        self.kafka = FakeKafka(conf, {"t": 3, "u": 1})
        return self.kafka

    def producer(self, **kwargs: Any) -> IdempotentProducer:
        return IdempotentProducer(
            self.config, self.lease, clock=self.clock, producer_factory=self.factory, **kwargs
        )

    def resume(self, cp: ProducerCheckpoint, **kwargs: Any) -> IdempotentProducer:
        kwargs.setdefault("scanner", self.scan)
        return IdempotentProducer.resume(
            cp, self.lease, self.config, clock=self.clock, producer_factory=self.factory, **kwargs
        )

    def scan(self, state: ScanState, partitions: Any, since_ms: int, until: dict[Any, int]) -> None:
        """The recovery scan over the fake Kafka log (what ``KafkaScanner`` reads)."""
        wanted = set(partitions)
        for msg in self.kafka.log if self.kafka is not None else []:
            tp = (msg.topic(), msg.partition())
            if tp not in wanted or msg.offset() >= until.get(tp, 1 << 62):
                continue
            state.note(tp, msg.headers())

    def headers(self) -> list[Any]:
        assert self.kafka is not None
        return [decode_pf(m.headers()[0][1]) for m in self.kafka.log]


def appended_by_rules(log: Sequence[Any]) -> list[bytes]:
    """The values the broker rules append from Kafka messages ``log``, replayed in order, one
    producer state table a partition."""
    from pidfence.broker_plugin import ProducerStateTable
    from pidfence.wire import Verdict

    tables: dict[int, ProducerStateTable] = {}
    out: list[bytes] = []
    for msg in log:
        pf = decode_pf(dict(msg.headers())["pf"])
        table = tables.setdefault(
            msg.partition(),
            ProducerStateTable(capacity=16, lifetime_ms=10**12, resolve_gaps=True),
        )
        for decision in table.offer(pf.pid, pf.generation, pf.seq, 1, pf.flags, msg.value()):
            if decision.verdict is Verdict.APPENDED:
                out.append(decision.ref)
    return out


class SharedRig(Rig):
    """A :class:`Rig` whose resumed producers write the same Kafka log."""

    def factory(self, conf: dict[str, Any]) -> FakeKafka:
        old = self.kafka
        kafka = super().factory(conf)
        if old is not None:
            kafka.log, kafka.offsets = old.log, old.offsets
        return kafka
