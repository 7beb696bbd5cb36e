"""Simulated producer processes: the real ``IdempotentProducer`` in a hostile world.

Each process is an :class:`~pidfence.producer.IdempotentProducer` (its session, driver, sender,
lease keeper and recovery scan, unchanged) built over a :class:`~pidfence.sim.client.SimClient`,
the simulated lease server and the fake clock. This module keeps no copy of what the producer
decides (rollover, handover, certificates, FENCEs, the scan's skips): it only plays the world
around the processes: when they send, checkpoint, crash, linger as zombies, pause, die with
records on the wire, restart (maybe late, maybe twice from one checkpoint), and what a process
does when its producer raises (exit, or carry on), as an application does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from pidfence.ledger import MemoryLedger
from pidfence.producer import (
    DeliveryFailed,
    IdempotentProducer,
    LeaseExpired,
    LeaseServerDown,
    ProducerCheckpoint,
    ProducerConfig,
    ProducerFenced,
)
from pidfence.producer.recovery import CertVerifier
from pidfence.sim.client import TOPIC, KafkaReader, Network, SimClient, SimStuck
from pidfence.sim.knobs import Knobs
from pidfence.sim.lease import ProducerLease, SimLeaseServer

__all__ = ["TOPIC", "Chain", "Instance", "Producers", "SimStuck", "make_events"]

#: What the processes did, counted (the run's ``stats``).
COUNTS = (
    "crashes",
    "zombies",
    "paused_zombies",
    "zombie_rolls_refused",
    "zombies_expired",
    "rollovers",
    "checkpoints",
    "checkpoints_skipped",
    "zombie_saves",
    "zombie_saves_refused",
    "dead_landings",
    "resumes_bumped",
    "resumes_rolled",
    "resumes_followed",
    "resumes_fresh",
    "resumes_refused",
    "second_resumers",
    "skipped",
    "lease_expired_exits",
    "timeouts",
    "timeout_exits",
)


@dataclass(slots=True)
class Instance:
    """One producer process: its producer, its Kafka client and its upstream position.

    ``budget``: sends left to a zombie (-1: not a zombie).
    """

    producer: IdempotentProducer
    client: SimClient
    pos: int
    budget: int = -1
    #: A paused process (SIGSTOP) does nothing before this time.
    paused_until: int = 0
    #: It sent everything and its last flush succeeded: the process exited cleanly.
    closed: bool = False
    #: Sends of a zombie since it became one (its periodic saves, ``Knobs.zombie_saves``).
    zombie_sends: int = 0


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


@dataclass(eq=False)
class Producers:
    """Runs every chain's processes over one network, lease server and Kafka.

    Args:
        rng: the schedule's randomness.
        knobs: the schedule's knobs.
        lease: the simulated lease server (its ``now`` is the clock).
        network: delivers the processes' records.
        scan_verifier: checks ``pfc`` in a resume's recovery scan (None: trusts every header).
        timeouts: the randomness of librdkafka's message timeouts (``Knobs.timeout_p``; its own
            stream, so schedules without them stay the same).
    """

    rng: random.Random
    knobs: Knobs
    lease: SimLeaseServer
    network: Network
    scan_verifier: CertVerifier | None = None
    timeouts: random.Random = field(default_factory=lambda: random.Random(0))

    def __post_init__(self) -> None:
        knobs = self.knobs
        self._scanner = KafkaReader(self.network.kafka)
        #: What the processes reach (their checkpoints' ``describe`` counted apart).
        self._owners = ProducerLease(self.lease)
        # The processes' clocks are the simulation's: exact, so the scan needs no skew, and
        # librdkafka times records out just inside the rollover margin.
        self.config = ProducerConfig(
            "sim:9092",
            default_lifetime_ms=knobs.lifetime_ms,
            message_timeout_ms=knobs.lifetime_ms // 24 - 1,
            clock_skew_ms=0,
            # Certificates again every few steps, so a sink that starts reading mid-stream
            # (retention, ``latest``) can prove and adopt a producer soon (docs/producer.md).
            restamp_ms=30 * knobs.step_ms,
            # The simulated sink resolves gaps only for in-order sessions (SimSink.gaps_on).
            sink_resolves_gaps=knobs.reorder == 1,
            # The simulated sink's entries get no timestamp grace (its timestampSkew is 0).
            sink_timestamp_skew_ms=0,
        )
        self.chains = [
            Chain(c, make_events(self.rng, c, knobs.events, knobs.partitions))
            for c in range(knobs.producers)
        ]
        self.counts = dict.fromkeys(COUNTS, 0)

    @property
    def done(self) -> bool:
        """Every chain sent all its events and nothing is in flight anywhere."""
        return all(
            c.active is not None and c.active.closed and not c.others and c.second is None
            for c in self.chains
        )

    def step(self, now: int) -> None:
        """One fake-clock step for every chain."""
        self.lease.tick(now)
        for chain in self.chains:
            self._step_chain(chain, now)

    # ---- the world: processes and their clients ------------------------------------------

    def _clock(self) -> int:
        return self.lease.now

    def _client_factory(self, made: list[SimClient]) -> Any:
        def factory(conf: dict[str, Any]) -> SimClient:
            client = SimClient(conf, self.knobs.partitions, self._clock, self.network)
            made.append(client)
            return client

        return factory

    def _fresh(self, chain: Chain) -> Instance | None:
        made: list[SimClient] = []
        try:
            producer = IdempotentProducer(
                self.config,
                self._owners,
                ledger=MemoryLedger(self.network.ledger),
                clock=self._clock,
                producer_factory=self._client_factory(made),
            )
        except LeaseServerDown:
            return None  # the next step tries again
        chain.checkpoint = (producer.checkpoint(), 0)
        return Instance(producer, made[0], 0)

    def _resume(self, chain: Chain, cp: ProducerCheckpoint, pos: int) -> Instance | None:
        made: list[SimClient] = []
        try:
            producer = IdempotentProducer.resume(
                cp,
                self._owners,
                self.config,
                ledger=MemoryLedger(self.network.ledger),
                clock=self._clock,
                producer_factory=self._client_factory(made),
                scanner=self._scanner,
                topics=[TOPIC],
                scan_verifier=self.scan_verifier,
            )
        except ProducerFenced:
            self.counts["resumes_refused"] += 1
            return None
        self.counts[f"resumes_{producer.resumed_how}"] += 1
        chain.checkpoint = (producer.checkpoint(), pos)
        return Instance(producer, made[0], pos)

    def _store(self, chain: Chain, pos: int) -> Any:
        def save(checkpoint: ProducerCheckpoint) -> None:
            chain.checkpoint = (checkpoint, pos)

        return save

    # ---- the active process ---------------------------------------------------------------

    def _step_chain(self, chain: Chain, now: int) -> None:
        knobs, rng = self.knobs, self.rng
        self._step_others(chain, now)
        if chain.second is not None and now >= chain.second[2]:
            self._second_resume(chain, now)
        if chain.active is None:
            if now < chain.down_until:
                return
            if chain.checkpoint is None:
                chain.active = self._fresh(chain)
            else:
                cp, pos = chain.checkpoint
                try:
                    chain.active = self._resume(chain, cp, pos)
                except LeaseServerDown:
                    return  # the next step tries again
                if chain.active is None:
                    raise SimStuck("the only resumer of a checkpoint was refused")
        inst = chain.active
        if inst is None:
            return
        if inst.producer.rollover_due:
            self._rollover(chain, inst, now)
            inst = chain.active
            if inst is None:
                return
        if inst.pos < len(chain.events):
            for _ in range(rng.randrange(1, 3)):
                if inst.pos < len(chain.events):
                    self._send(chain, inst)
                    chain.sends += 1
                    if chain.sends % knobs.checkpoint_every == 0:
                        self._checkpoint(chain, inst)
                        if chain.active is not inst:
                            return  # it exited on a delivery error
        elif not inst.closed:
            # Its last flush: it raises what timed out since the one before (the process exits).
            saved = self._checkpoint(chain, inst)
            # Unsaved (no lease server answered): it tries again next step, as exit 75 would.
            inst.closed = saved and chain.active is inst and not inst.client.pending
        if chain.active is not inst:
            return  # it exited on a delivery error
        if knobs.timeout_p and self.timeouts.random() < knobs.timeout_p:
            self.counts["timeouts"] += inst.client.time_out_oldest(self.timeouts)
        for _ in range(2):
            if inst.client.pending:
                self.network.deliver_one(inst.client)
        finished = inst.closed
        # A finished producer has exited: nothing left to crash.
        if not finished and rng.random() < knobs.crash_p:
            self._crash(chain, now)

    def _send(self, chain: Chain, inst: Instance) -> None:
        key, value, partition = chain.events[inst.pos]
        inst.pos += 1
        skipped = inst.producer.skipped
        event = f"{chain.index}:{inst.pos - 1}"
        inst.producer.produce(TOPIC, value, key, partition, event_id=event)
        self.counts["skipped"] += inst.producer.skipped - skipped

    def _checkpoint(self, chain: Chain, inst: Instance) -> bool:
        """Flush and store the checkpoint with the position; False when nothing was stored."""
        try:
            inst.producer.flush()
        except DeliveryFailed:
            # Records timed out in librdkafka's queue: the process exits (its supervisor
            # resumes the stored checkpoint, whose re-sends fill the hole they left).
            self.counts["timeout_exits"] += 1
            self._crash(chain, self.lease.now, dead=True)
            return False
        try:
            checkpoint = inst.producer.checkpoint()
        except LeaseServerDown:
            # Nobody confirmed it still owns the pid: not stored now, tried at the next one.
            self.counts["checkpoints_skipped"] += 1
            return False
        chain.checkpoint = (checkpoint, inst.pos)
        self.counts["checkpoints"] += 1
        return True

    def _roll(self, inst: Instance, chain: Chain, save: Any) -> bool:
        """``producer.roll(save)`` as a process does it; False when the process exits."""
        try:
            inst.producer.roll(save)
        except LeaseExpired:
            self.counts["lease_expired_exits"] += 1  # exit 75: restarted from its checkpoint
            return False
        except DeliveryFailed:
            self.counts["timeout_exits"] += 1  # a record timed out: the drain failed
            return False
        except LeaseServerDown:
            pass  # the old lease is kept; the roll is retried inside it
        return True

    def _rollover(self, chain: Chain, inst: Instance, now: int) -> None:
        # producer.roll(save) drains, rolls, stores the successor's checkpoint. A crash between
        # the roll and the store resumes the older checkpoint (it follows the lineage).
        self.network.flush(inst.client)
        if self.rng.random() < self.knobs.crash_p:
            if self.rng.random() < 0.5:
                self._roll(inst, chain, lambda checkpoint: None)
            self._crash(chain, now, dead=True)
            return
        rolls = inst.producer.rollovers
        if not self._roll(inst, chain, self._store(chain, inst.pos)):
            chain.active = None
            return
        if inst.producer.rollovers > rolls:
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
            old.client.acks = False
            old.budget = 0
        chain.others.append(old)
        chain.active = None
        cp, pos = chain.checkpoint
        # Restarts may come after the checkpoint's lease ended, but within the lineage
        # retention (one lifetime after the lease end); past it, see docs/producer.md. A lease
        # server outage (under a quarter lifetime) may delay them: room is left for one.
        room = knobs.lifetime_ms // 4 if knobs.lease_down_p else 0
        latest = self._span(cp.expire_ms + knobs.lifetime_ms - knobs.step_ms - room - now)
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
        try:
            inst = self._resume(chain, cp, pos)
        except LeaseServerDown:
            return  # tries again next step
        chain.second = None
        self.counts["second_resumers"] += 1
        if inst is None:
            return
        first = chain.active
        if first is not None:
            first.budget = self.rng.randrange(1, 6)  # the first resumer, now a zombie
            chain.others.append(first)
        chain.active = inst

    # ---- zombies and the dead ---------------------------------------------------------------

    def _step_others(self, chain: Chain, now: int) -> None:
        for other in list(chain.others):
            if other.paused_until > now:
                continue  # SIGSTOPped: nothing moves, not even its in-flight records
            if other.paused_until:
                # Woken: librdkafka times out records older than message.timeout.ms, which the
                # producer keeps below the rollover margin (docs/producer.md): a record handed
                # over before the pause is never delivered after the lease has ended.
                other.paused_until = 0
                if other.client.time_out(now):
                    # Its next flush raises DeliveryFailed: it never rolls over (a roll drains
                    # first) and exits.
                    other.budget = 0
            if not other.client.acks:
                # A dead process: whatever is still on the wire lands now or never.
                self.counts["dead_landings"] += self.network.land_or_lose(other.client)
                chain.others.remove(other)
                continue
            if other.budget > 0 and other.pos < len(chain.events):
                if other.producer.rollover_due:
                    # Past its rollover point, or past its lease end: the next send rolls first
                    # (IdempotentProducer.produce), so it never sends under an ended lease.
                    if now >= other.producer.sequencer.expire_ms:
                        self.counts["zombies_expired"] += 1
                    self._zombie_roll(chain, other)
                else:
                    self._send(chain, other)
                    other.budget -= 1
                    other.zombie_sends += 1
                    if self.knobs.zombie_saves and (
                        other.budget == 0 or other.zombie_sends % self.knobs.checkpoint_every == 0
                    ):
                        self._zombie_save(chain, other)
            else:
                other.budget = 0
            if other.client.pending:
                self.network.deliver_one(other.client)
            if other.budget == 0 and other in chain.others:
                # A zombie's retries finish (librdkafka delivers what it holds).
                self.network.flush(other.client)
                chain.others.remove(other)

    def _zombie_save(self, chain: Chain, zombie: Instance) -> None:
        """A zombie's periodic save into its chain's one state file: flush, then store the
        checkpoint with its position, as its process does. A replaced zombie is refused
        (``ProducerFenced``) and exits; one nobody replaced yet still owns its pid, and its
        stored checkpoint is the one its replacement resumes."""
        try:
            zombie.producer.flush()
            checkpoint = zombie.producer.checkpoint()
        except DeliveryFailed:
            zombie.budget = 0  # it exits on the error
            return
        except ProducerFenced:
            self.counts["zombie_saves_refused"] += 1
            zombie.budget = 0  # exit 3: replaced
            return
        except LeaseServerDown:
            return  # not stored now
        chain.checkpoint = (checkpoint, zombie.pos)
        self.counts["zombie_saves"] += 1

    def _zombie_roll(self, chain: Chain, zombie: Instance) -> None:
        """A zombie past its rollover point drains and tries to roll: the lineage refuses it.

        Nobody fenced it yet (its replacement has not resumed)? Then it is still the owner,
        rolls and stores the successor's checkpoint like any live process (under the
        ``fresh_rollover`` mutation a fenced zombie gets there too and re-sends its work).
        """
        self.network.flush(zombie.client)
        try:
            if not self._roll(zombie, chain, self._store(chain, zombie.pos)):
                zombie.budget = 0
        except ProducerFenced:
            self.counts["zombie_rolls_refused"] += 1
            zombie.budget = 0
