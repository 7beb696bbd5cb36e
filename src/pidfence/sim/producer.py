"""Simulated producer instances: the real ``Sequencer`` over a lossy, reordering network."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.errors import ProducerFenced
from pidfence.producer.lease import LeaseKeeper
from pidfence.producer.recovery import Highs, ScanState, apply_scan, scan_state
from pidfence.producer.sequencer import Sequencer
from pidfence.sim.kafka import SimKafka
from pidfence.sim.knobs import Knobs
from pidfence.sim.lease import SimLeaseServer
from pidfence.wire import PF_HEADER_KEY, decode_pf
from pidfence.wire.cert import CERT_HEADER_KEY

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
    event: str = ""
    #: The ``pfc`` header: the lease's cert on FENCE records and on the first record of each
    #: (pid, generation) per partition, as ``IdempotentProducer`` stamps it.
    cert: bytes | None = None


@dataclass(slots=True)
class Instance:
    """One producer process: a sequencer, its upstream position and its in-flight records.

    ``acks`` is False for a crashed process whose in-flight records may still land: nobody is left
    to record their acknowledgements in the ledger.
    """

    seq: Sequencer
    pos: int
    pending: list[InFlight] = field(default_factory=list)
    acks: bool = True
    budget: int = -1
    #: Partitions where this instance already has a record in Kafka.
    warm: set[int] = field(default_factory=set)
    #: A paused process (SIGSTOP) does nothing before this time.
    paused_until: int = 0
    #: Offset after this instance's last FENCE per partition (its recovery scan ends there).
    fence_ends: dict[int, int] = field(default_factory=dict)

    def rollover_at(self, lifetime_ms: int) -> int:
        """When this instance rolls over: 1/24 of the lifetime before its lease ends."""
        return self.seq.expire_ms - lifetime_ms // 24


@dataclass(slots=True)
class Chain:
    """One logical producer: an upstream, its stored checkpoint and the instances running it."""

    index: int
    events: list[tuple[bytes, bytes, int]]
    active: Instance | None = None
    #: The stored checkpoint and the upstream position stored with it.
    checkpoint: tuple[ProducerCheckpoint, int] | None = None
    others: list[Instance] = field(default_factory=list)
    sends: int = 0
    #: The chain is down (crashed, not restarted yet) until this time.
    down_until: int = 0
    #: A second resumer of one checkpoint: (checkpoint, position, when it resumes).
    second: tuple[ProducerCheckpoint, int, int] | None = None


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
        offset = self.kafka.append(
            rec.partition, rec.header, rec.key, rec.value, rec.ts_ms, rec.cert
        )
        if rng.random() < self.knobs.dup_p:
            self.counts["duplicates"] += 1
            return  # written, ack lost: it stays in flight and is written again
        del inst.pending[idx]
        if rec.fence:
            inst.fence_ends[rec.partition] = offset + 1
        if inst.acks:
            pf = decode_pf(rec.header)
            self.ledger.append(
                LedgerEntry(
                    pf.pid, pf.generation, TOPIC, rec.partition, pf.seq, value_digest(rec.value),
                    offset, rec.ts_ms, rec.fence, rec.expire_ms, rec.event,
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
    """Runs every chain: sends, checkpoints, rollovers, crashes, resumes and zombies.

    Rollover and resume go through the producer's real lineage logic
    (:class:`~pidfence.producer.lease.LeaseKeeper`) against the simulated lease server, and a
    resume runs the recovery scan over the simulated Kafka (:func:`apply_scan`), as
    ``IdempotentProducer`` does. Nothing here knows what another instance sent.
    """

    def __init__(
        self, rng: random.Random, knobs: Knobs, lease: SimLeaseServer, network: Network
    ) -> None:
        self.rng = rng
        self.knobs = knobs
        self.lease = lease
        self.keeper = LeaseKeeper(lease, lambda: lease.now)
        self.net = network
        #: The producers' scan verifies pfc like the sink (None: it trusts every header).
        self.scan_verifier: Any = None
        self.chains = [
            Chain(c, make_events(rng, c, knobs.events, knobs.partitions))
            for c in range(knobs.producers)
        ]
        self.counts = {
            "crashes": 0,
            "zombies": 0,
            "paused_zombies": 0,
            "zombie_rolls_refused": 0,
            "zombies_expired": 0,
            "rollovers": 0,
            "checkpoints": 0,
            "dead_landings": 0,
            "resumes_bumped": 0,
            "resumes_rolled": 0,
            "resumes_followed": 0,
            "resumes_fresh": 0,
            "resumes_refused": 0,
            "second_resumers": 0,
            "skipped": 0,
        }

    @property
    def done(self) -> bool:
        """Every chain sent all its events and nothing is in flight anywhere."""
        return all(
            c.active is not None
            and c.active.pos >= len(c.events)
            and not c.active.pending
            and not c.others
            and c.second is None
            for c in self.chains
        )

    def step(self, now: int) -> None:
        """One fake-clock step for every chain."""
        self.lease.now = now
        for chain in self.chains:
            self._step_chain(chain, now)

    def _step_chain(self, chain: Chain, now: int) -> None:
        knobs, rng = self.knobs, self.rng
        self._step_others(chain, now)
        if chain.second is not None and now >= chain.second[2]:
            self._second_resume(chain, now)
        if chain.active is None:
            if now < chain.down_until:
                return
            if chain.checkpoint is None:
                chain.active = self._fresh(chain, now)
            else:
                cp, pos = chain.checkpoint
                chain.active = self._resume(chain, cp, pos, now)
                if chain.active is None:
                    raise SimStuck("the only resumer of a checkpoint was refused")
        inst = chain.active
        if inst is None:
            return
        if now >= inst.rollover_at(knobs.lifetime_ms):
            self._rollover(chain, inst, now)
            inst = chain.active
            if inst is None:
                return
        if inst.pos < len(chain.events):
            for _ in range(rng.randrange(1, 3)):
                if inst.pos < len(chain.events):
                    self._send(chain, inst, now)
                    chain.sends += 1
                    if chain.sends % knobs.checkpoint_every == 0:
                        self._checkpoint(chain, inst, now)
        elif inst.pending:
            self._checkpoint(chain, inst, now)
        for _ in range(2):
            if inst.pending:
                self.net.deliver_one(inst)
        finished = inst.pos >= len(chain.events) and not inst.pending
        # A finished producer has exited: nothing left to crash.
        if not finished and rng.random() < knobs.crash_p:
            self._crash(chain, now)

    def _step_others(self, chain: Chain, now: int) -> None:
        for other in list(chain.others):
            if other.paused_until > now:
                continue  # SIGSTOPped: nothing moves, not even its in-flight records
            if other.paused_until:
                # Woken: librdkafka times out records older than message.timeout.ms, which the
                # producer keeps below the rollover margin (docs/producer.md): a record handed
                # over before the pause is never delivered after the lease has ended.
                other.paused_until = 0
                timeout = self.knobs.lifetime_ms // 24
                fresh = [r for r in other.pending if now - r.ts_ms < timeout]
                if len(fresh) < len(other.pending):
                    # The timed-out records fail: its next flush raises DeliveryFailed, so it
                    # never rolls over (a roll drains first) and exits.
                    other.budget = 0
                other.pending = fresh
            if not other.acks:
                # A dead process: whatever is still on the wire lands now or never.
                for rec in list(other.pending):
                    if self.rng.random() < 0.5:
                        self.counts["dead_landings"] += 1
                        self.net.kafka.append(
                            rec.partition, rec.header, rec.key, rec.value, rec.ts_ms, rec.cert
                        )
                other.pending.clear()
                chain.others.remove(other)
                continue
            if other.budget > 0 and other.pos < len(chain.events):
                if now >= other.rollover_at(self.knobs.lifetime_ms):
                    # Past its rollover point, or past its lease end: the next send rolls first
                    # (IdempotentProducer.produce), so it never sends under an ended lease.
                    if now >= other.seq.expire_ms:
                        self.counts["zombies_expired"] += 1
                    self._zombie_roll(chain, other, now)
                else:
                    self._send(chain, other, now)
                    other.budget -= 1
            else:
                other.budget = 0
            if other.pending:
                self.net.deliver_one(other)
            if other.budget == 0 and other in chain.others:
                # A zombie's retries finish (librdkafka delivers what it holds).
                self.net.flush(other)
                chain.others.remove(other)

    def _zombie_roll(self, chain: Chain, zombie: Instance, now: int) -> None:
        """A zombie past its rollover point drains and tries to roll: the lineage refuses it."""
        self.net.flush(zombie)
        try:
            fresh = self.keeper.roll(zombie.seq)
        except ProducerFenced:
            self.counts["zombie_rolls_refused"] += 1
            zombie.budget = 0
            return
        # Nobody fenced it yet (its replacement has not resumed): it is still the owner, rolls
        # and stores the successor's checkpoint like any live process. (Under the fresh_rollover
        # mutation a fenced zombie gets here too and re-sends its work, as the old rollover did.)
        zombie.seq = fresh.with_skip(zombie.seq.handover())
        zombie.warm = set()
        chain.checkpoint = (fresh.checkpoint(now), zombie.pos)

    def _fresh(self, chain: Chain, now: int) -> Instance:
        inst = Instance(self.keeper.lease_new(), 0)
        chain.checkpoint = (inst.seq.checkpoint(now), 0)
        return inst

    def _send(self, chain: Chain, inst: Instance, now: int) -> None:
        key, value, partition = chain.events[inst.pos]
        inst.pos += 1
        if inst.seq.skip and inst.seq.take_skip(TOPIC, partition):
            self.counts["skipped"] += 1
            return
        seq = inst.seq.peek(TOPIC, partition)
        header = inst.seq.stamp(TOPIC, partition)
        event = f"{chain.index}:{inst.pos - 1}"
        cert = None
        if inst.seq.cert is not None and (TOPIC, partition) not in inst.seq.certified:
            cert = inst.seq.cert
            inst.seq.certified.add((TOPIC, partition))
        inst.pending.append(
            InFlight(
                partition, seq, header, key, value, now, inst.seq.expire_ms, False, event, cert
            )
        )

    def _checkpoint(self, chain: Chain, inst: Instance, now: int) -> None:
        self.net.flush(inst)
        chain.checkpoint = (inst.seq.checkpoint(now), inst.pos)
        self.counts["checkpoints"] += 1

    def _rollover(self, chain: Chain, inst: Instance, now: int) -> None:
        # IdempotentProducer.roll(save): drain, roll, store the successor's checkpoint. A crash
        # between the roll and the store resumes the older checkpoint (it follows the lineage).
        self.net.flush(inst)
        if self.rng.random() < self.knobs.crash_p:
            if self.rng.random() < 0.5:
                self.keeper.roll(inst.seq)
            self._crash(chain, now, dead=True)
            return
        fresh = self.keeper.roll(inst.seq)
        fresh.with_skip(inst.seq.handover())
        fresh.topics = inst.seq.topics | {t for t, _ in inst.seq.partitions()}
        chain.active = Instance(fresh, inst.pos)
        chain.checkpoint = (fresh.checkpoint(now), inst.pos)
        self.counts["rollovers"] += 1
        self.counts["checkpoints"] += 2

    def _crash(self, chain: Chain, now: int, dead: bool = False) -> None:
        old = chain.active
        if old is None or chain.checkpoint is None:
            raise SimStuck("crash without an active instance or a checkpoint")
        knobs, rng = self.knobs, self.rng
        self.counts["crashes"] += 1
        if not dead and rng.random() < knobs.zombie_p:
            old.budget = rng.randrange(1, 6)
            self.counts["zombies"] += 1
            if rng.random() < knobs.pause_p:
                # SIGSTOP: wakes up to two lifetimes later, maybe past its rollover or expiry.
                old.paused_until = now + rng.randrange(1, self._span(2 * knobs.lifetime_ms))
                self.counts["paused_zombies"] += 1
        else:
            old.acks = False
            old.budget = 0
        chain.others.append(old)
        chain.active = None
        cp, pos = chain.checkpoint
        # Restarts may come after the checkpoint's lease ended, but within the lineage
        # retention (one lifetime after the lease end); past it, see docs/producer.md.
        latest = self._span(cp.expire_ms + knobs.lifetime_ms - knobs.step_ms - now)
        if rng.random() < knobs.down_p and latest > 1:
            chain.down_until = now + rng.randrange(1, latest)
        if rng.random() < knobs.double_p and chain.second is None and latest > 1:
            chain.second = (cp, pos, now + rng.randrange(1, latest))

    def _span(self, ms: int) -> int:
        """``ms``, capped at 400 steps: long leases must not stretch a schedule for ever."""
        return min(ms, 400 * self.knobs.step_ms)

    def _second_resume(self, chain: Chain, now: int) -> None:
        """A second resumer of the same checkpoint: it fences the first, or is refused."""
        if chain.second is None:
            return
        cp, pos, _ = chain.second
        chain.second = None
        self.counts["second_resumers"] += 1
        inst = self._resume(chain, cp, pos, now)
        if inst is None:
            return
        first = chain.active
        if first is not None:
            first.budget = self.rng.randrange(1, 6)  # the first resumer, now a zombie
            chain.others.append(first)
        chain.active = inst

    def _resume(self, chain: Chain, cp: ProducerCheckpoint, pos: int, now: int) -> Instance | None:
        try:
            resumed = self.keeper.resume(cp, 8)
        except ProducerFenced:
            self.counts["resumes_refused"] += 1
            return None
        self.counts[f"resumes_{resumed.how}"] += 1
        seq = resumed.sequencer
        if resumed.how == "bumped":
            seq.lifetime_ms = cp.lifetime_ms
        inst = Instance(seq, pos)
        if resumed.walk_from is not None:
            counts = {TOPIC: self.knobs.partitions} if self.knobs.fence_all else None
            for _, partition, header in seq.fences(resumed.walk_from, counts):
                # Only the current generation has a cert; the walk's lower FENCEs carry none.
                cert = seq.cert if header == seq.fence_header(TOPIC, partition) else None
                inst.pending.append(
                    InFlight(
                        partition, seq.peek(TOPIC, partition), header, b"", b"", now,
                        seq.expire_ms, True, "", cert,
                    )
                )  # fmt: skip
            # FENCE records go out before any data (DESIGN §6).
            self.net.flush(inst)
        state = scan_state(cp, seq.pid, self.scan_verifier)
        apply_scan(seq, cp, self._scan(state, cp.taken_ms, inst.fence_ends))
        chain.checkpoint = (seq.checkpoint(now), pos)
        return inst

    def _scan(self, state: ScanState, since_ms: int, until: dict[int, int]) -> Highs:
        """The recovery scan over the simulated partitions (what ``KafkaScanner`` reads)."""
        kafka = self.net.kafka
        for p, records in enumerate(kafka.partitions):
            start = kafka.offset_for_time(p, since_ms)
            for rec in records[start : until.get(p, len(records))]:
                headers = [(PF_HEADER_KEY, rec.header)]
                if rec.cert is not None:
                    headers.append((CERT_HEADER_KEY, rec.cert))
                state.note((TOPIC, p), headers, rec.ts_ms)
        return state.highs
