"""The lease logic of one server: pids from claimed blocks, the lease ring, generation bumps.

Runs on the server's event loop; every coordinator call goes to an executor so ZooKeeper latency
never blocks the loop. While ZooKeeper is SUSPENDED, leases keep coming from blocks already
claimed; bumps answer UNAVAILABLE. A new block is claimed only when connected again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from pidfence.pid_allocator.coordinator import Block, BlockRequest, Coordinator
from pidfence.pid_allocator.errors import LeaseServiceUnavailable, UnknownPid
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.ring import LeaseRing

log = logging.getLogger(__name__)

DEFAULT_LIFETIME_MS = 24 * 3600 * 1000
DEFAULT_BLOCK_TTL_MS = 10 * 60 * 1000


def wall_clock_ms() -> int:
    """Epoch milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease or bump answer."""

    pid: int
    generation: int
    expire_ms: int


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Tunables of one lease server.

    Attributes:
        block_size: pids per ZooKeeper claim (one write per block).
        lifetime_ms: lease lifetime from issue.
        capacity: live leases held in the ring.
        block_ttl_ms: a block is issued from only this long after its claim, which bounds the
            expiry of its pids for servers that did not issue them.
        claim_timeout_s: how long a lease waits for a block claim before UNAVAILABLE.
    """

    block_size: int = 100
    lifetime_ms: int = DEFAULT_LIFETIME_MS
    capacity: int = 1_000_000
    block_ttl_ms: int = DEFAULT_BLOCK_TTL_MS
    claim_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 1_000_000:
            raise ValueError(f"block_size must be 1..1000000, got {self.block_size}")
        if self.lifetime_ms < 1:
            raise ValueError(f"lifetime_ms must be >= 1, got {self.lifetime_ms}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.block_ttl_ms < 1:
            raise ValueError(f"block_ttl_ms must be >= 1, got {self.block_ttl_ms}")


class LeaseService:
    """Lease and bump logic over a coordinator.

    Args:
        coordinator: ZooKeeper (or memory) state shared by all servers.
        executor: where blocking coordinator calls run.
        config: tunables.
        server_id: this server's id, stored in its block records.
        clock: epoch-ms clock.
        rng: random source for block salts and tokens.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        executor: Executor,
        config: ServiceConfig | None = None,
        *,
        server_id: str | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        rng: random.Random | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.config = config or ServiceConfig()
        self.server_id = server_id or f"lease-{uuid.uuid4().hex[:12]}"
        self.clock = clock
        self._executor = executor
        self._rng = rng or random.Random()  # noqa: S311 - salts need uniqueness, not secrecy
        self.ring = LeaseRing(self.config.capacity)
        self._blocks: deque[Block] = deque()
        self._own: deque[Block] = deque()
        self._next_pid = 0
        self._claim: asyncio.Future[Block] | None = None
        self.blocks_claimed = 0
        self.leases = 0
        self.bumps = 0

    @property
    def claiming(self) -> bool:
        """Whether a block claim is in flight."""
        return self._claim is not None

    # -- blocks ---------------------------------------------------------------------------------

    def _remaining(self) -> int:
        if not self._blocks:
            return 0
        first, *rest = self._blocks
        return first.end - self._next_pid + sum(b.end - b.start for b in rest)

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
                self.config.block_size,
                self.server_id,
                uuid.UUID(int=self._rng.getrandbits(128)).hex,
                now,
                self.config.lifetime_ms,
                self.config.block_ttl_ms,
                self._rng.getrandbits(128).to_bytes(16, "big"),
            )
            loop = asyncio.get_running_loop()
            claim = loop.run_in_executor(self._executor, self.coordinator.claim_block, request)
            claim.add_done_callback(self._claimed)
            self._claim = claim
        return self._claim

    def _claimed(self, claim: asyncio.Future[Block]) -> None:
        self._claim = None
        if claim.cancelled():
            return
        exc = claim.exception()
        if exc is not None:
            log.warning("block claim failed: %s", exc)
            return
        block = claim.result()
        self.blocks_claimed += 1
        if not self._blocks:
            self._next_pid = block.start
        self._blocks.append(block)
        self._own.append(block)
        horizon = self.clock() - self.config.block_ttl_ms - self.config.lifetime_ms
        while self._own and self._own[0].claimed_ms < horizon:
            self._own.popleft()

    def _pid_now(self) -> tuple[int, Block] | None:
        self._drop_used(self.clock())
        if self._remaining() <= self.config.block_size // 2 and self.coordinator.connected:
            self._start_claim()  # prefetch before the current block runs out
        if not self._blocks:
            return None
        pid = self._next_pid
        self._next_pid += 1
        return pid, self._blocks[0]

    async def _take_pid(self) -> tuple[int, Block]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.claim_timeout_s
        while True:
            taken = self._pid_now()
            if taken is not None:
                return taken
            claim = self._start_claim()
            try:
                await asyncio.wait_for(asyncio.shield(claim), deadline - loop.time())
            except LeaseServiceUnavailable:
                raise
            except Exception as exc:
                raise LeaseServiceUnavailable(
                    f"no pid block available ({exc!r}); retry shortly"
                ) from exc

    # -- ops ------------------------------------------------------------------------------------

    def _grant(self, pid: int, block: Block) -> Grant:
        now = self.clock()
        grant = Grant(pid, initial_generation(block.salt, pid), now + self.config.lifetime_ms)
        self.ring.append(pid, grant.generation, grant.expire_ms, now)
        self.leases += 1
        return grant

    def lease_now(self) -> Grant | None:
        """Issue a lease without waiting, or None when a block claim must be awaited first.

        Raises:
            LeaseCapacityExhausted: the ring is full of live leases.
        """
        self.ring.ensure_room(self.clock())
        taken = self._pid_now()
        return None if taken is None else self._grant(*taken)

    async def lease(self, partitions: tuple[tuple[str, int], ...] = ()) -> Grant:
        """Issue a new pid at a random starting generation."""
        del partitions  # informational in protocol v1
        self.ring.ensure_room(self.clock())
        return self._grant(*await self._take_pid())

    def _owns(self, pid: int) -> bool:
        return any(pid in b for b in self._own)

    async def bump(self, pid: int, generation: int, token: str | None = None) -> Grant:
        """Hand out ``generation + 1`` for ``pid`` if ``generation`` is its latest."""
        if not self.coordinator.connected:
            raise LeaseServiceUnavailable("ZooKeeper unreachable; bumps need it, retry shortly")
        now = self.clock()
        loop = asyncio.get_running_loop()
        entry = self.ring.find(pid, now)
        if entry is not None:
            initial, expire_ms = entry.generation, entry.expire_ms
        elif self._owns(pid):
            raise UnknownPid(f"pid {pid} expired or was never issued; lease a new pid")
        else:
            block = await loop.run_in_executor(self._executor, self.coordinator.find_block, pid)
            if block is None:
                raise UnknownPid(f"pid {pid} was never issued; lease a new pid")
            if now >= block.last_expiry_ms:
                raise UnknownPid(f"pid {pid} expired; lease a new pid")
            # Another server issued it; its exact issue time is unknown, so report the earliest
            # possible end: the producer renews early rather than writing past its lease.
            initial = initial_generation(block.salt, pid)
            expire_ms = block.claimed_ms + block.lifetime_ms
        new, expire = await loop.run_in_executor(
            self._executor,
            self.coordinator.bump_generation,
            pid,
            generation,
            initial,
            expire_ms,
            token or uuid.UUID(int=self._rng.getrandbits(128)).hex,
            now,
        )
        self.bumps += 1
        return Grant(pid, new, expire)
