"""The lease logic of one server: pids from claimed blocks, the lease ring, bumps and rolls.

Runs on the server's event loop. Block claims run on their own one-thread executor
(``blocks.py``), garbage collection on another; bumps and rolls go through the fair, bounded
:class:`ZkQueue`, so ZooKeeper latency never blocks the loop, a flood cannot queue without bound
and a flooder delays only itself. Requests a server can refuse as not the owner's without
ZooKeeper are refused first (``owners.py``). While ZooKeeper is SUSPENDED, leases keep coming
from blocks already claimed; bumps and rolls answer UNAVAILABLE.

Every grant carries the pid's secret; with a signing key a ``cert`` (v2, naming the producer's
key, when the request sent one); with a record-MAC secret the lease's ``mac_key``.

``describe`` is read-only: what the lease authority knows of a pid (its lineage record, else this
server's ring), for sinks that must decide whether to adopt a producer they could not see start.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.pid_allocator.blocks import BlockSupply
from pidfence.pid_allocator.capability import secret_from, secret_hasher
from pidfence.pid_allocator.clock import SteadyClock
from pidfence.pid_allocator.coordinator import Block, Coordinator, LineageRecord
from pidfence.pid_allocator.errors import LeaseServiceUnavailable, NotOwner
from pidfence.pid_allocator.generations import (
    generation_from,
    generation_hasher,
)
from pidfence.pid_allocator.lineage import (
    NOT_OWNER_MESSAGE,
    Change,
    Lineage,
    LocalLease,
    Outcome,
)
from pidfence.pid_allocator.owners import LocalOwners
from pidfence.pid_allocator.ring import LeaseRing
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.zk_queue import ZkQueue
from pidfence.wire import PidState, PidStatus
from pidfence.wire.cert import encode_cert
from pidfence.wire.mac import derive_record_key


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease, bump or roll answer: the pid's identity, its secret and, when on, its cert and
    record MAC key (a roll's also the rolled pid's: its owner's recovery scan checks what it
    wrote)."""

    pid: int
    generation: int
    expire_ms: int
    secret: bytes
    cert: bytes | None = None
    mac_key: bytes | None = None
    prior_mac_key: bytes | None = None


#: A lease as the server sends it: (pid, generation, expire_ms, secret, cert, mac_key).
LeaseFields = tuple[int, int, int, bytes, bytes | None, bytes | None]


class LeaseService:
    """Lease, bump and roll logic over a coordinator.

    Args:
        coordinator: ZooKeeper (or memory) state shared by all servers.
        executor: where bumps and rolls run (behind the fair queue).
        settings: tunables.
        server_id: this server's id, stored in its block records.
        clock: epoch-ms clock; default a :class:`SteadyClock` (immune to wall-clock steps).
        rng: random source for block salts and tokens (default: the OS's).
        signing_key: when given, every grant carries a signed ``cert``.
        claim_executor: where block claims run (default: ``executor``).
        mac_secret: when given, every grant carries the lease's record MAC key.
        gc_executor: where garbage collection runs (default: the event loop's executor); never
            the claim executor, which a long collection would keep from claiming blocks.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        executor: Executor,
        settings: LeaseServerSettings | None = None,
        *,
        server_id: str | None = None,
        clock: Callable[[], int] | None = None,
        rng: random.Random | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        claim_executor: Executor | None = None,
        mac_secret: bytes | None = None,
        gc_executor: Executor | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.settings = settings = settings or LeaseServerSettings()
        self.server_id = server_id or f"lease-{uuid.uuid4().hex[:12]}"
        self.clock: Callable[[], int] = clock or SteadyClock()
        # Salts key the pid secrets: they must be unpredictable.
        self._rng = rng or random.SystemRandom()
        self.signing_key = signing_key
        self.mac_secret = mac_secret
        self.ring = LeaseRing(settings.capacity, settings.ring_share)
        self.supply = BlockSupply(
            coordinator, claim_executor or executor, settings, self.server_id, self.clock, self._rng
        )
        self._gc_executor = gc_executor
        self.owners = LocalOwners(self.ring, self.supply)
        self.zk = ZkQueue(executor, settings.zk_queue, settings.zk_share, settings.zk_workers)
        self.lineage = Lineage(coordinator, settings.retention)
        # Keyed hash states of the block leases come from now (start, generations, secrets).
        self._keyed: tuple[int, Any, Any] = (-1, None, None)
        self.leases = 0
        self.bumps = 0
        self.rolls = 0

    @property
    def claiming(self) -> bool:
        """Whether a block claim is in flight."""
        return self.supply.claiming

    # -- grants ---------------------------------------------------------------------------------

    def _extras(
        self, pid: int, generation: int, expire_ms: int, key: bytes | None
    ) -> tuple[bytes | None, bytes | None]:
        signing_key, mac_secret = self.signing_key, self.mac_secret
        cert = (
            None
            if signing_key is None
            else encode_cert(signing_key, pid, generation, expire_ms, key)
        )
        mac_key = None if mac_secret is None else derive_record_key(mac_secret, pid)
        return cert, mac_key

    def _grant(self, outcome: Outcome, key: bytes | None) -> Grant:
        pid, generation, expire_ms = outcome.pid, outcome.generation, outcome.expire_ms
        return Grant(
            pid,
            generation,
            expire_ms,
            outcome.secret,
            *self._extras(pid, generation, expire_ms, key),
        )

    def _issue(self, pid: int, block: Block, client: str) -> Outcome:
        now = self.clock()
        self.ring.ensure_room(now, client)
        generation, expire_ms, secret = self._issue_at(now, pid, block, client)
        return Outcome(pid, generation, expire_ms, block, secret)

    def _issue_at(self, now: int, pid: int, block: Block, client: str) -> tuple[int, int, bytes]:
        """Put the lease of ``pid`` in the ring (the caller made room) and return its generation,
        expiry and secret: the one issuing path of :meth:`lease`, :meth:`roll` and the server's
        :meth:`lease_fields_now`, with the block's keyed hashes prepared once per block."""
        start = block.start
        keyed_start, generations, secrets = self._keyed
        if keyed_start != start:
            generations, secrets = generation_hasher(block.salt), secret_hasher(block.salt)
            self._keyed = (start, generations, secrets)
        generation = generation_from(generations, pid)
        expire_ms = now + self.settings.lifetime_ms
        self.ring.add_checked(pid, generation, expire_ms, client)
        # The offset is unsigned: an injected clock behind the claim issues at the claim's time.
        secret = secret_from(start, secrets, pid, max(0, now - block.claimed_ms))
        return generation, expire_ms, secret

    def lease_fields_now(self, client: str = "", key: bytes | None = None) -> LeaseFields | None:
        """Issue a lease without waiting, as a plain tuple (the server's hot path: one clock
        read, no intermediate objects, the block's keyed hashes prepared once per block), or None
        when a block claim must be awaited first.

        Raises:
            LeaseCapacityExhausted: the ring is full of live leases, or ``client`` holds its
                share of it.
        """
        now = self.clock()
        self.ring.ensure_room(now, client)
        taken = self.supply.pid_now(now)
        if taken is None:
            return None
        pid, block = taken
        generation, expire_ms, secret = self._issue_at(now, pid, block, client)
        self.leases += 1
        if self.signing_key is None and self.mac_secret is None:
            return pid, generation, expire_ms, secret, None, None
        return pid, generation, expire_ms, secret, *self._extras(pid, generation, expire_ms, key)

    async def lease(
        self,
        partitions: tuple[tuple[str, int], ...] = (),
        client: str = "",
        key: bytes | None = None,
    ) -> Grant:
        """Issue a new pid at a random starting generation (waiting for a block if need be)."""
        del partitions  # informational in protocol v1
        self.ring.ensure_room(self.clock(), client)
        pid, block = await self.supply.take_pid()
        self.leases += 1
        return self._grant(self._issue(pid, block, client), key)

    def _local(self, pid: int, now_ms: int) -> LocalLease | None:
        entry = self.ring.find(pid, now_ms)
        return None if entry is None else LocalLease(entry.generation, entry.expire_ms)

    def _change(
        self, pid: int, generation: int, secret: bytes, token: str | None, what: str
    ) -> Change:
        """The change an owner asks for, once its secret and ZooKeeper's reach are checked."""
        now = self.clock()
        if self.owners.refuses(pid, secret, now):
            raise NotOwner(NOT_OWNER_MESSAGE)
        if not self.coordinator.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper unreachable; {what} need it, retry shortly")
        token = token or uuid.UUID(int=self._rng.getrandbits(128)).hex
        return Change(pid, generation, secret, token, now, self._local(pid, now))

    async def bump(
        self,
        pid: int,
        generation: int,
        secret: bytes,
        token: str | None = None,
        client: str = "",
        key: bytes | None = None,
    ) -> Grant:
        """Hand out ``generation + 1`` for ``pid`` if ``generation`` is its latest.

        Raises:
            NotOwner, StaleGeneration, UnknownPid, RateLimited, LeaseServiceUnavailable.
        """
        change = self._change(pid, generation, secret, token, "bumps")
        outcome = await self.zk.run(client, self.lineage.bump, change)
        self.bumps += 1
        return self._grant(outcome, key)

    async def roll(
        self,
        pid: int,
        generation: int,
        secret: bytes,
        token: str | None = None,
        client: str = "",
        key: bytes | None = None,
    ) -> Grant:
        """Retire ``pid`` at ``generation`` (its latest) and issue its successor.

        Raises:
            NotOwner, StaleGeneration, RateLimited, LeaseCapacityExhausted,
            LeaseServiceUnavailable.
        """
        change = self._change(pid, generation, secret, token, "rolls")
        earlier = await self.zk.run(client, self.lineage.check_roll, change)
        if earlier is not None:
            return self._rolled(pid, earlier, key)  # a retried roll that already landed
        # Only a checked owner gets here, so only owners spend pids and ring slots.
        self.ring.ensure_room(self.clock(), client)
        successor = self._issue(*await self.supply.take_pid(), client)
        self.owners.add_successor(successor.pid, pid, successor.expire_ms, change.now_ms)
        outcome = await self.zk.run(client, self.lineage.roll, change, successor)
        self.rolls += 1
        return self._rolled(pid, outcome, key)

    async def describe(self, pid: int, client: str = "") -> PidStatus:
        """What the authority knows of ``pid`` (read-only; no secret needed, none revealed).

        The pid's lineage record decides (its current or retired generation and lease end);
        without one (never bumped or rolled) this server's ring, if it issued the pid; anything
        else, or a record past its retention, is ``unknown``. The record is read (after a sync)
        through the fair ZooKeeper queue in ``client``'s bucket, as bumps and rolls are.

        Raises:
            RateLimited, LeaseServiceUnavailable.
        """
        if not self.coordinator.connected:
            raise LeaseServiceUnavailable("ZooKeeper unreachable; describe needs it, retry shortly")
        found = await self.zk.run(client, self._read_synced, pid)
        now = self.clock()
        if found is not None:
            record = found[0]
            if now >= record.expire_ms + self.settings.retention:
                return PidStatus.unknown(pid)
            state = (
                PidState.RETIRED
                if record.retired
                else PidState.ENDED
                if now >= record.expire_ms
                else PidState.LIVE
            )
            return PidStatus(pid, state, record.generation, record.expire_ms)
        local = self.ring.recall(pid)
        if local is None or now >= local.expire_ms + self.settings.retention:
            return PidStatus.unknown(pid)
        state = PidState.ENDED if now >= local.expire_ms else PidState.LIVE
        return PidStatus(pid, state, local.generation, local.expire_ms)

    def _read_synced(self, pid: int) -> tuple[LineageRecord, int] | None:
        """The lineage record of ``pid`` as of now on every server: ``describe`` answers
        without a write, so its read must not be a lagging ZooKeeper server's."""
        self.coordinator.sync()
        return self.coordinator.read_lineage(pid)

    def _rolled(self, pid: int, outcome: Outcome, key: bytes | None) -> Grant:
        grant = self._grant(outcome, key)
        if self.mac_secret is None:
            return grant
        return replace(grant, prior_mac_key=derive_record_key(self.mac_secret, pid))

    # -- housekeeping ---------------------------------------------------------------------------

    async def collect_garbage(self) -> int:
        """Delete records no request can be granted about any more (on the GC executor: off the
        request queue, and off the block claims, which must not wait for a long pass)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._gc_executor,
            self.coordinator.collect_garbage,
            self.clock(),
            self.settings.retention,
        )
