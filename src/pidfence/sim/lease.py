"""An in-memory lease server with the DESIGN §5 (amended) and §9 semantics, for the simulation.

It answers like :class:`pidfence.pid_allocator.LeaseClient` (same methods, same errors), so the
simulated producers (real ``IdempotentProducer`` objects) use it as their lease client:
owner-only ``bump``/``roll`` with a secret, ``roll`` as a compare-and-set on the current
generation that retires the pid and names its successor, lineage authority one step (the
successor accepts its parent's secret), and lineage records kept for a retention period after
the lease ends. Time is the runner's fake clock (:attr:`now`). Like ``pidfence lease-server
--signing-key``, it signs every lease, bump and roll (``cert``, :mod:`pidfence.wire.cert`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.pid_allocator.errors import (
    LeaseServerUnreachable,
    NotOwner,
    StaleGeneration,
    UnknownPid,
)
from pidfence.wire.cert import encode_cert
from pidfence.wire.mac import derive_record_key


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease: pid, generation, lease end (epoch ms) and the pid's secret."""

    pid: int
    generation: int
    expire_ms: int
    secret: bytes = b""
    sequence: int = 0
    cert: bytes | None = None
    #: The pid's record MAC key (``--record-mac-secret``), or None.
    mac_key: bytes | None = None
    #: On a roll's answer, the rolled pid's record MAC key.
    prior_mac_key: bytes | None = None


@dataclass(slots=True)
class _Record:
    generation: int
    expire_ms: int
    secret: bytes
    parent: int | None = None
    successor: tuple[int, int] | None = None


#: What the lease server did, counted.
_COUNTS = ("rolls", "follows", "refused", "outages", "unanswered")


@dataclass(eq=False)
class SimLeaseServer:
    """Unique pids, unique generations per pid, fixed lifetime, lineage (DESIGN §5, §9).

    Args:
        rng: randomness (a new pid starts at a random generation, as the real server does).
        lifetime_ms: lease lifetime; lineage records are kept one more lifetime after it.
        fresh_rollover: the mutation ``fresh_rollover``: ``roll`` leases an unrelated pid and
            retires nothing (the rollover before DESIGN §9), so tests can prove it is caught.
        signing_key: the key that signs every reply's ``cert`` (DESIGN §3 amended).
        outage_p: per :meth:`tick`, every lease server becomes unreachable for up to a quarter
            of a lease lifetime (see :meth:`tick`): requests never arrive
            (``LeaseServerUnreachable``, as ``LeaseClient`` raises after its retries).
        outage_rng: the outages' own randomness (so schedules without outages stay the same).
        mac_secret: the per-record MAC secret: every reply carries the lease's ``mac_key``.
    """

    rng: random.Random
    lifetime_ms: int
    fresh_rollover: bool = False
    signing_key: Ed25519PrivateKey | None = None
    outage_p: float = 0.0
    outage_rng: random.Random = field(default_factory=lambda: random.Random(0))
    mac_secret: bytes | None = None
    now: int = field(default=0, init=False)
    _next_pid: int = field(init=False)
    _pids: dict[int, _Record] = field(default_factory=dict, init=False)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0), init=False)
    #: No lease server answers before this time.
    down_until: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._next_pid = self.rng.randrange(1, 1 << 40)

    def tick(self, now: int) -> None:
        """Move the clock to ``now``; maybe start an outage.

        Outages last under a quarter of a lifetime and are a quarter of a lifetime apart, so a
        restart is delayed by less than that (crashed processes restart within the lineage
        retention, as docs/producer.md asks of their supervisors).
        """
        self.now = now
        rng, quarter = self.outage_rng, max(self.lifetime_ms // 4, 2)
        if self.outage_p and now >= self.down_until + quarter and rng.random() < self.outage_p:
            self.down_until = now + rng.randrange(1, quarter)
            self.counts["outages"] += 1

    def _reachable(self) -> None:
        if self.now < self.down_until:
            self.counts["unanswered"] += 1
            raise LeaseServerUnreachable("no lease server answered (simulated outage)")

    def _issue(self, parent: int | None = None, producer_key: bytes | None = None) -> Lease:
        pid = self._next_pid
        self._next_pid += 1
        record = _Record(
            self.rng.randrange(0, 1 << 20),
            self.now + self.lifetime_ms,
            self.rng.randbytes(8),
            parent,
        )
        self._pids[pid] = record
        return self._lease(pid, producer_key)

    def _lease(self, pid: int, producer_key: bytes | None = None) -> Lease:
        r = self._pids[pid]
        key = self.signing_key
        cert = None
        if key is not None:
            # Version 2 when the producer named its key, as the real server signs.
            cert = encode_cert(key, pid, r.generation, r.expire_ms, producer_key=producer_key)
        mac_key = None
        if self.mac_secret is not None:
            mac_key = derive_record_key(self.mac_secret, pid)
        return Lease(pid, r.generation, r.expire_ms, r.secret, cert=cert, mac_key=mac_key)

    def _owned(self, pid: int, generation: int, secret: bytes) -> _Record:
        record = self._pids.get(pid)
        retained = record is not None and self.now < record.expire_ms + self.lifetime_ms
        if record is None or not retained:
            self.counts["refused"] += 1
            raise NotOwner("not the owner")
        parent = self._pids.get(record.parent) if record.parent is not None else None
        if secret not in (record.secret, parent.secret if parent else None):
            self.counts["refused"] += 1
            raise NotOwner("not the owner")
        if record.successor is not None:
            self.counts["refused"] += 1
            raise StaleGeneration(f"pid {pid} was rolled", *record.successor)
        if record.generation != generation:
            self.counts["refused"] += 1
            raise StaleGeneration(f"pid {pid} is at {record.generation}, not {generation}")
        return record

    def lease(self, partitions: Any = (), *, key: bytes | None = None) -> Lease:
        """A new pid, never issued before."""
        self._reachable()
        return self._issue(producer_key=key)

    def bump(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """The next generation of a live pid whose latest generation is ``generation``."""
        self._reachable()
        record = self._owned(pid, generation, secret)
        if record.expire_ms <= self.now:
            raise UnknownPid(f"pid {pid}'s lease ended")
        if record.parent is not None and secret != record.secret:
            self.counts["follows"] += 1
        record.generation = generation + 1
        return self._lease(pid, key)

    def roll(self, pid: int, generation: int, secret: bytes, *, key: bytes | None = None) -> Lease:
        """Retire ``pid`` at ``generation`` and return its successor (compare-and-set)."""
        self._reachable()
        if self.fresh_rollover:
            return self._issue(producer_key=key)
        record = self._owned(pid, generation, secret)
        successor = self._issue(parent=pid, producer_key=key)
        record.successor = (successor.pid, successor.generation)
        self.counts["rolls"] += 1
        if self.mac_secret is None:
            return successor
        return replace(successor, prior_mac_key=derive_record_key(self.mac_secret, pid))
