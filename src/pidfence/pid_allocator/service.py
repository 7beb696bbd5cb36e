"""The lease logic of one server: pids from claimed blocks, the lease ring, bumps and rolls.

Runs on the server's event loop. Block claims run on their own one-thread executor; bumps and
rolls go through the bounded :class:`ZkQueue`, so ZooKeeper latency never blocks the loop and a
flood cannot queue without bound. While ZooKeeper is SUSPENDED, leases keep coming from blocks
already claimed; bumps and rolls answer UNAVAILABLE. A new block is claimed only when connected.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.pid_allocator.capability import make_secret, secret_from, secret_hasher
from pidfence.pid_allocator.clock import SteadyClock
from pidfence.pid_allocator.coordinator import Block, BlockRequest, Coordinator
from pidfence.pid_allocator.errors import LeaseServiceUnavailable
from pidfence.pid_allocator.generations import (
    generation_from,
    generation_hasher,
    initial_generation,
)
from pidfence.pid_allocator.lineage import Lineage, LocalLease, Outcome
from pidfence.pid_allocator.ring import LeaseRing
from pidfence.pid_allocator.settings import LeaseServerSettings
from pidfence.pid_allocator.zk_queue import ZkQueue
from pidfence.wire.cert import encode_cert

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease, bump or roll answer: the pid's identity, its secret and (when signing) cert."""

    pid: int
    generation: int
    expire_ms: int
    secret: bytes
    cert: bytes | None = None


#: Most pids a server keeps in reserve ahead of its leases, and claims in one write, in blocks.
MAX_RESERVE_BLOCKS = 16

#: How many recent claims the reserve remembers: it follows the slowest of them, because claim
#: times vary several-fold (ZooKeeper's fsync, thread handoffs) and the last one says little.
CLAIM_MEMORY = 8

#: Reserve (and claim size) over the most pids a recent claim's wait consumed: a claim may take
#: several times as long as the recent slowest one on a loaded machine (measured: p99 claim time
#: about 4x the median), and the pids cost nothing but the one write that claims them.
RESERVE_FACTOR = 4

#: A lease as the server sends it: (pid, generation, expire_ms, secret, cert or None).
LeaseFields = tuple[int, int, int, bytes, bytes | None]


class LeaseService:
    """Lease, bump and roll logic over a coordinator.

    Args:
        coordinator: ZooKeeper (or memory) state shared by all servers.
        executor: where bumps and rolls run (behind the bounded queue).
        settings: tunables.
        server_id: this server's id, stored in its block records.
        clock: epoch-ms clock; default a :class:`SteadyClock` (immune to wall-clock steps).
        rng: random source for block salts and tokens (default: the OS's).
        signing_key: when given, every grant carries a signed ``cert``.
        claim_executor: where block claims run (default: ``executor``).
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
    ) -> None:
        self.coordinator = coordinator
        self.settings = settings or LeaseServerSettings()
        self.server_id = server_id or f"lease-{uuid.uuid4().hex[:12]}"
        self.clock: Callable[[], int] = clock or SteadyClock()
        # Salts key the pid secrets: they must be unpredictable.
        self._rng = rng or random.SystemRandom()
        self._claim_executor = claim_executor or executor
        self.signing_key = signing_key
        self.ring = LeaseRing(self.settings.capacity, self.settings.ring_share)
        self.zk = ZkQueue(executor, self.settings.zk_queue, self.settings.zk_share)
        self.lineage = Lineage(coordinator, self.settings.retention)
        self._blocks: deque[Block] = deque()
        # Keyed hash states of the first held block (generation, secret), copied per pid.
        self._keyed: tuple[int, Any, Any] = (-1, None, None)
        self._next_pid = 0
        self._claim: asyncio.Future[Block] | None = None
        # Prefetch threshold: half a block, or twice the pids a recent claim's wait consumed.
        self._reserve = max(1, self.settings.block_size // 2)
        # Blocks taken per claim (one write whatever the count): enough to outpace the leases.
        self._claim_blocks = 1
        self._claim_use: deque[int] = deque(maxlen=CLAIM_MEMORY)
        self._leases_at_claim = 0
        self.blocks_claimed = 0
        self.leases = 0
        self.bumps = 0
        self.rolls = 0

    @property
    def claiming(self) -> bool:
        """Whether a block claim is in flight."""
        return self._claim is not None

    # -- blocks ---------------------------------------------------------------------------------

    def _remaining(self) -> int:
        blocks = self._blocks
        if not blocks:
            return 0
        left = blocks[0].end - self._next_pid
        if len(blocks) > 1:
            left += sum(b.end - b.start for b in blocks) - (blocks[0].end - blocks[0].start)
        return left

    def _drop_used(self, now_ms: int) -> None:
        while self._blocks and (
            self._next_pid >= self._blocks[0].end
            or now_ms >= self._blocks[0].claimed_ms + self._blocks[0].ttl_ms
        ):
            self._blocks.popleft()
            if self._blocks:
                self._next_pid = self._blocks[0].start

    def _start_claim(self) -> asyncio.Future[Block]:
        if self._claim is None:
            now = self.clock()
            request = BlockRequest(
                self.settings.block_size * self._claim_blocks,
                self.server_id,
                uuid.UUID(int=self._rng.getrandbits(128)).hex,
                now,
                self.settings.lifetime_ms,
                self.settings.block_ttl_ms,
                self._rng.getrandbits(128).to_bytes(16, "big"),
            )
            loop = asyncio.get_running_loop()
            claim = loop.run_in_executor(
                self._claim_executor, self.coordinator.claim_block, request
            )
            claim.add_done_callback(self._absorb)
            self._claim = claim
            self._leases_at_claim = self.leases
        return self._claim

    def _absorb(self, claim: asyncio.Future[Block]) -> None:
        """Take a finished claim's block. Idempotent: the done callback and a waiter that saw
        the claim finish first may both call it."""
        if self._claim is not claim:
            return
        self._claim = None
        if claim.cancelled():
            return
        exc = claim.exception()
        if exc is not None:
            log.warning("block claim failed: %s", exc)
            return
        block = claim.result()
        self.blocks_claimed += 1
        self._adapt_reserve(self.leases - self._leases_at_claim)
        if not self._blocks:
            self._next_pid = block.start
        self._blocks.append(block)

    def _adapt_reserve(self, used_while_claiming: int) -> None:
        """Size the reserve and the next claim so that leases never wait for a claim.

        ``used_while_claiming`` is how many pids were issued while the claim that just landed was
        in flight. With ``u`` the largest such count of the last ``CLAIM_MEMORY`` claims, the next
        claim starts with ``RESERVE_FACTOR * u`` pids left (at least half a block) and takes as
        many pids, rounded up to whole blocks (at least one); both are capped at
        ``MAX_RESERVE_BLOCKS`` blocks, the claim also at ``settings.max_claim_blocks``. Claims run
        one at a time, so a claim must also bring more pids than are issued while it runs: with
        one block per claim a server never issued more than ``block_size`` pids per claim time
        (100 per ~8 ms claim capped it near 12k leases/s; every claim ran dry and the leases
        waiting for it were the p99 tail). A bigger claim is still ONE ZooKeeper write, so writes
        per lease only fall.
        """
        self._claim_use.append(used_while_claiming)
        want = RESERVE_FACTOR * max(self._claim_use)
        size = self.settings.block_size
        self._reserve = min(max(size // 2, want, 1), MAX_RESERVE_BLOCKS * size)
        cap = min(MAX_RESERVE_BLOCKS, self.settings.max_claim_blocks)
        self._claim_blocks = min(max(1, -(-want // size)), cap)

    def _pid_now(self, now_ms: int | None = None) -> tuple[int, Block] | None:
        self._drop_used(self.clock() if now_ms is None else now_ms)
        if (
            self._claim is None
            and self._remaining() <= self._reserve
            and self.coordinator.connected
        ):
            self._start_claim()  # prefetch before the current block runs out
        if not self._blocks:
            return None
        pid = self._next_pid
        self._next_pid += 1
        return pid, self._blocks[0]

    async def _take_pid(self) -> tuple[int, Block]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.claim_timeout_s
        while True:
            taken = self._pid_now()
            if taken is not None:
                return taken
            claim = self._start_claim()
            if claim.done():
                # Finished, but its done callback has not run yet: absorb it here. Waiting on
                # a finished future does not yield, so without this the loop spins forever.
                self._absorb(claim)
                if claim.cancelled() or claim.exception() is not None:
                    raise LeaseServiceUnavailable("no pid block available; retry shortly")
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LeaseServiceUnavailable("no pid block available in time; retry shortly")
            try:
                await asyncio.wait_for(asyncio.shield(claim), remaining)
            except LeaseServiceUnavailable:
                raise
            except Exception as exc:
                raise LeaseServiceUnavailable(
                    f"no pid block available ({type(exc).__name__}); retry shortly"
                ) from exc

    # -- grants ---------------------------------------------------------------------------------

    def _sign(self, pid: int, generation: int, expire_ms: int) -> bytes | None:
        if self.signing_key is None:
            return None
        return encode_cert(self.signing_key, pid, generation, expire_ms)

    def _grant(self, outcome: Outcome) -> Grant:
        block = outcome.block
        return Grant(
            outcome.pid,
            outcome.generation,
            outcome.expire_ms,
            make_secret(block.start, block.salt, outcome.pid),
            self._sign(outcome.pid, outcome.generation, outcome.expire_ms),
        )

    def _issue(self, pid: int, block: Block, client: str) -> Outcome:
        now = self.clock()
        generation = initial_generation(block.salt, pid)
        expire_ms = now + self.settings.lifetime_ms
        self.ring.append(pid, generation, expire_ms, now, client)
        return Outcome(pid, generation, expire_ms, block)

    def lease_now(self, client: str = "") -> Grant | None:
        """Issue a lease without waiting, or None when a block claim must be awaited first.

        Raises:
            LeaseCapacityExhausted: the ring is full of live leases, or ``client`` holds its
                share of it.
        """
        fields = self.lease_fields_now(client)
        return None if fields is None else Grant(*fields)

    def lease_fields_now(self, client: str = "") -> LeaseFields | None:
        """:meth:`lease_now` as a plain tuple: the server's hot path (one clock read, no
        intermediate objects, the block's keyed hashes prepared once per block).

        Raises:
            LeaseCapacityExhausted: as :meth:`lease_now`.
        """
        now = self.clock()
        ring = self.ring
        ring.ensure_room(now, client)
        taken = self._pid_now(now)
        if taken is None:
            return None
        pid, block = taken
        start = block.start
        keyed_start, generations, secrets = self._keyed
        if keyed_start != start:
            generations, secrets = generation_hasher(block.salt), secret_hasher(block.salt)
            self._keyed = (start, generations, secrets)
        generation = generation_from(generations, pid)
        expire_ms = now + self.settings.lifetime_ms
        ring.add_checked(pid, generation, expire_ms, client)
        self.leases += 1
        signing_key = self.signing_key
        cert = None if signing_key is None else encode_cert(signing_key, pid, generation, expire_ms)
        return pid, generation, expire_ms, secret_from(start, secrets, pid), cert

    async def lease(self, partitions: tuple[tuple[str, int], ...] = (), client: str = "") -> Grant:
        """Issue a new pid at a random starting generation."""
        del partitions  # informational in protocol v1
        self.ring.ensure_room(self.clock(), client)
        pid, block = await self._take_pid()
        self.leases += 1
        return self._grant(self._issue(pid, block, client))

    def _local(self, pid: int, now_ms: int) -> LocalLease | None:
        entry = self.ring.find(pid, now_ms)
        return None if entry is None else LocalLease(entry.generation, entry.expire_ms)

    def _require_store(self, what: str) -> None:
        if not self.coordinator.connected:
            raise LeaseServiceUnavailable(f"ZooKeeper unreachable; {what} need it, retry shortly")

    def _token(self, token: str | None) -> str:
        return token or uuid.UUID(int=self._rng.getrandbits(128)).hex

    async def bump(
        self,
        pid: int,
        generation: int,
        secret: bytes,
        token: str | None = None,
        client: str = "",
    ) -> Grant:
        """Hand out ``generation + 1`` for ``pid`` if ``generation`` is its latest.

        Raises:
            NotOwner, StaleGeneration, UnknownPid, RateLimited, LeaseServiceUnavailable.
        """
        self._require_store("bumps")
        now = self.clock()
        outcome = await self.zk.run(
            client,
            self.lineage.bump,
            pid,
            generation,
            secret,
            self._token(token),
            now,
            self._local(pid, now),
        )
        self.bumps += 1
        return self._grant(outcome)

    async def roll(
        self,
        pid: int,
        generation: int,
        secret: bytes,
        token: str | None = None,
        client: str = "",
    ) -> Grant:
        """Retire ``pid`` at ``generation`` (its latest) and issue its successor.

        Raises:
            NotOwner, StaleGeneration, RateLimited, LeaseCapacityExhausted,
            LeaseServiceUnavailable.
        """
        self._require_store("rolls")
        token = self._token(token)
        now = self.clock()
        local = self._local(pid, now)
        earlier = await self.zk.run(
            client, self.lineage.check_roll, pid, generation, secret, token, now, local
        )
        if earlier is not None:
            return self._grant(earlier)  # a retried roll that already landed
        # Only a checked owner gets here, so only owners spend pids and ring slots.
        self.ring.ensure_room(self.clock(), client)
        successor = self._issue(*await self._take_pid(), client)
        outcome = await self.zk.run(
            client, self.lineage.roll, pid, generation, secret, token, now, successor, local
        )
        self.rolls += 1
        return self._grant(outcome)

    # -- housekeeping ---------------------------------------------------------------------------

    async def collect_garbage(self) -> int:
        """Delete records past retention (runs on the claim executor, off the request queue)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._claim_executor,
            self.coordinator.collect_garbage,
            self.clock(),
            self.settings.retention,
        )
