"""Simulated producer instances: the real ``Sequencer`` over a lossy, reordering network."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.sequencer import Sequencer
from pidfence.sim.kafka import SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.sim.lease import Lease, SimLeaseServer
from pidfence.wire import decode_pf

TOPIC = "sim"


class SimStuck(RuntimeError):
    """A flush did not finish in its bounded loop (a simulation bug, not a pidfence one)."""


@dataclass(slots=True)
class InFlight:
    """A record handed to the producer client and not yet acknowledged."""

    partition: int
    seq: int
    header: bytes
    key: bytes
    value: bytes
    ts_ms: int
    expire_ms: int
    fence: bool


@dataclass(slots=True)
class Instance:
    """One producer process: a sequencer, its upstream position and its in-flight records.

    ``acks`` is False for a crashed process whose in-flight records may still land: nobody is left
    to record their acknowledgements in the ledger.
    """

    seq: Sequencer
    pos: int
    issued_ms: int
    pending: list[InFlight] = field(default_factory=list)
    acks: bool = True
    budget: int = -1
    #: Partitions where this instance already has a record in Kafka.
    warm: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Chain:
    """One logical producer: an upstream, its stored checkpoint and the instances running it."""

    index: int
    events: list[tuple[bytes, bytes, int]]
    active: Instance | None = None
    checkpoint: tuple[ProducerCheckpoint, int, int] | None = None
    others: list[Instance] = field(default_factory=list)
    sends: int = 0
    #: Highest upstream position any instance of this chain has sent (a simulation-only oracle;
    #: see docs/producer.md for what a real producer does instead).
    high: int = 0


def make_events(
    rng: random.Random, chain: int, n: int, partitions: int
) -> list[tuple[bytes, bytes, int]]:
    """``(key, value, partition)`` per upstream event; values are seed-003 JSON (uid, ts in s)."""
    out = []
    base_s = 1_700_000_000 + rng.randrange(0, 600)
    for i in range(n):
        uid = rng.randrange(0, 12)
        ts = base_s + i * rng.randrange(0, 4)
        value = json.dumps({"uid": uid, "ts": ts, "chain": chain, "i": i}).encode()
        out.append((str(uid).encode(), value, uid % partitions))
    return out


class Network:
    """Delivers in-flight records to the simulated Kafka with drops, duplicates and reordering."""

    def __init__(self, rng: random.Random, knobs: Knobs, kafka: SimKafka) -> None:
        self.rng = rng
        self.knobs = knobs
        self.kafka = kafka
        self.ledger: list[LedgerEntry] = []
        #: What the network did: ``drops`` (lost sends, retried), ``duplicates`` (written, ack
        #: lost, written again), ``overtakes`` (a record delivered before an older one in flight).
        self.counts = {"drops": 0, "duplicates": 0, "overtakes": 0}

    def deliver_one(self, inst: Instance) -> None:
        """One delivery attempt of one of ``inst``'s first ``reorder`` in-flight records."""
        rng = self.rng
        # The window is measured from the oldest unacknowledged seq of each partition, not as
        # "any of the first N in flight": once later records are acknowledged (and held by the
        # broker) a count of in-flight records no longer bounds the gap the broker must hold,
        # and a record beyond ``hE + 1 + reorder_window`` is OUT_OF_ORDER, i.e. lost.
        oldest: dict[int, int] = {}
        for rec in inst.pending:
            oldest.setdefault(rec.partition, rec.seq)
        window = self.knobs.reorder
        choices = [i for i, r in enumerate(inst.pending) if r.seq - oldest[r.partition] < window]
        idx = choices[rng.randrange(len(choices))]
        rec = inst.pending[idx]
        if rec.partition not in inst.warm and not self.knobs.cold_reorder:
            # Nothing overtakes a pid's first record on a partition: the broker has no entry to
            # hold a gap against (no E, s > 0 is UNKNOWN_PID). librdkafka's idempotence keeps
            # order; a client without it must wait for that first acknowledgement.
            idx = next(i for i, r in enumerate(inst.pending) if r.partition == rec.partition)
            rec = inst.pending[idx]
        if rng.random() < self.knobs.drop_p:
            self.counts["drops"] += 1
            return
        if rec.seq > oldest[rec.partition]:
            self.counts["overtakes"] += 1
        inst.warm.add(rec.partition)
        offset = self.kafka.append(rec.partition, rec.header, rec.key, rec.value, rec.ts_ms)
        if rng.random() < self.knobs.dup_p:
            self.counts["duplicates"] += 1
            return  # written, ack lost: it stays in flight and is written again
        del inst.pending[idx]
        if inst.acks:
            pf = decode_pf(rec.header)
            self.ledger.append(
                LedgerEntry(
                    pf.pid, pf.generation, TOPIC, rec.partition, pf.seq, value_digest(rec.value),
                    offset, rec.ts_ms, rec.fence, rec.expire_ms,
                )
            )  # fmt: skip

    def flush(self, inst: Instance) -> None:
        """Deliver until nothing is in flight (bounded; ``SimStuck`` otherwise)."""
        for _ in range(100_000):
            if not inst.pending:
                return
            self.deliver_one(inst)
        raise SimStuck("flush did not finish in 100000 attempts; lower drop_p")


class Producers:
    """Runs every chain: sends, checkpoints, rollovers, crashes, resumes and zombies."""

    def __init__(
        self, rng: random.Random, knobs: Knobs, lease: SimLeaseServer, network: Network
    ) -> None:
        self.rng = rng
        self.knobs = knobs
        self.lease = lease
        self.net = network
        self.chains = [
            Chain(c, make_events(rng, c, knobs.events, knobs.partitions))
            for c in range(knobs.producers)
        ]
        self.counts = {
            "crashes": 0,
            "zombies": 0,
            "rollovers": 0,
            "checkpoints": 0,
            "dead_landings": 0,
        }

    @property
    def done(self) -> bool:
        """Every chain sent all its events and nothing is in flight anywhere."""
        return all(
            c.active is not None
            and c.active.pos >= len(c.events)
            and not c.active.pending
            and not c.others
            for c in self.chains
        )

    def step(self, now: int) -> None:
        """One fake-clock step for every chain."""
        for chain in self.chains:
            self._step_chain(chain, now)

    def _step_chain(self, chain: Chain, now: int) -> None:
        knobs, rng = self.knobs, self.rng
        if chain.active is None:
            chain.active = self._fresh(chain, now, 0)
        inst = chain.active
        if now >= inst.issued_ms + knobs.lifetime_ms * 23 // 24:
            # Replay under the old pid whatever an earlier instance of it may have sent, or the
            # new pid would append those events a second time (a resume right before rollover).
            while inst.pos < chain.high:
                self._send(chain, inst, now)
            self._rollover(chain, now)
            inst = chain.active
        if inst.pos < len(chain.events):
            for _ in range(rng.randrange(1, 3)):
                if inst.pos < len(chain.events):
                    self._send(chain, inst, now)
                    chain.sends += 1
                    if chain.sends % knobs.checkpoint_every == 0:
                        self._checkpoint(chain, inst)
        elif inst.pending:
            self._checkpoint(chain, inst)
        for _ in range(2):
            if inst.pending:
                self.net.deliver_one(inst)
        self._step_others(chain, now)
        if rng.random() < knobs.crash_p:
            self._crash(chain, now)

    def _step_others(self, chain: Chain, now: int) -> None:
        cut = self.knobs.lifetime_ms * 23 // 24
        for other in list(chain.others):
            if other.budget > 0 and other.pos < len(chain.events) and now < other.issued_ms + cut:
                self._send(chain, other, now)
                other.budget -= 1
            else:
                other.budget = 0
            if other.pending:
                self.net.deliver_one(other)
            if other.budget == 0:
                if other.acks:
                    # A zombie's retries finish while its lease (and the broker's entry) lives.
                    self.net.flush(other)
                else:
                    # A dead process: whatever is still on the wire lands now or never.
                    for rec in list(other.pending):
                        if self.rng.random() < 0.5:
                            self.counts["dead_landings"] += 1
                            self.net.kafka.append(
                                rec.partition, rec.header, rec.key, rec.value, rec.ts_ms
                            )
                    other.pending.clear()
                chain.others.remove(other)

    def _fresh(self, chain: Chain, now: int, pos: int) -> Instance:
        lease = self.lease.lease(now)
        inst = Instance(Sequencer(lease.pid, lease.generation, lease.expire_ms), pos, now)
        chain.checkpoint = (inst.seq.checkpoint(), pos, now)
        return inst

    def _send(self, chain: Chain, inst: Instance, now: int) -> None:
        key, value, partition = chain.events[inst.pos]
        seq = inst.seq.peek(TOPIC, partition)
        header = inst.seq.stamp(TOPIC, partition)
        inst.pending.append(
            InFlight(partition, seq, header, key, value, now, inst.seq.expire_ms, False)
        )
        inst.pos += 1
        chain.high = max(chain.high, inst.pos)

    def _checkpoint(self, chain: Chain, inst: Instance) -> None:
        self.net.flush(inst)
        chain.checkpoint = (inst.seq.checkpoint(), inst.pos, inst.issued_ms)
        self.counts["checkpoints"] += 1

    def _rollover(self, chain: Chain, now: int) -> None:
        # A rollover is a checkpoint boundary: the old pid's records are all acknowledged and the
        # checkpoint names the new pid before it sends, else a resume would replay under the old
        # pid what the new pid already wrote.
        old = chain.active
        if old is None:
            raise SimStuck("rollover without an active instance")
        self.net.flush(old)
        chain.active = self._fresh(chain, now, old.pos)
        self.counts["rollovers"] += 1
        self.counts["checkpoints"] += 1

    def _crash(self, chain: Chain, now: int) -> None:
        old = chain.active
        if old is None or chain.checkpoint is None:
            raise SimStuck("crash without an active instance or a checkpoint")
        self.counts["crashes"] += 1
        if self.rng.random() < self.knobs.zombie_p:
            old.budget = self.rng.randrange(1, 6)
            self.counts["zombies"] += 1
        else:
            old.acks = False
            old.budget = 0
        chain.others.append(old)
        checkpoint, pos, issued = chain.checkpoint
        bumped: Lease = self.lease.bump(checkpoint.pid, checkpoint.generation, now)
        seq = Sequencer.resumed(checkpoint, bumped.generation, bumped.expire_ms)
        inst = Instance(seq, pos, issued)
        if self.knobs.fence_all:
            fenced = list(range(self.knobs.partitions))
        else:
            fenced = sorted(p for _, p in seq.partitions())
        for partition in fenced:
            inst.pending.append(
                InFlight(
                    partition, seq.peek(TOPIC, partition), seq.fence_header(TOPIC, partition),
                    b"", b"", now,
                    bumped.expire_ms, True,
                )
            )  # fmt: skip
        # FENCE records go out before any data (DESIGN §6).
        self.net.flush(inst)
        chain.active = inst
        chain.checkpoint = (seq.checkpoint(), pos, issued)
