"""The pids one server holds: blocks claimed from the coordinator, prefetched so leases never wait.

Runs on the server's event loop; claims run on their own one-thread executor. A claim takes one
or more blocks' worth of pids in ONE coordinator write, and is started before the held pids run
out (the reserve); both follow how many pids recent claims' waits consumed (see
:meth:`BlockSupply.adapt`). Every block this server issued from is remembered until its last
lease ended, so the server can check a secret of its own pids without asking ZooKeeper.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from pidfence.pid_allocator.coordinator import Block, BlockRequest, Coordinator
from pidfence.pid_allocator.errors import LeaseServiceUnavailable
from pidfence.pid_allocator.settings import (
    CLAIM_MEMORY,
    MAX_RESERVE_BLOCKS,
    RESERVE_FACTOR,
    LeaseServerSettings,
)

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class BlockSupply:
    """Claimed blocks of one server and the next pid to issue.

    Args:
        coordinator: where blocks are claimed.
        executor: where claims run (one at a time).
        settings: block size, lifetime, block TTL, claim timeout.
        server_id: this server's id, stored in its block records.
        clock: epoch-ms clock.
        rng: random source for claim tokens and salts (must be unpredictable).
    """

    coordinator: Coordinator
    executor: Executor
    settings: LeaseServerSettings
    server_id: str
    clock: Callable[[], int]
    rng: random.Random

    def __post_init__(self) -> None:
        self.blocks: deque[Block] = deque()
        self.next_pid = 0
        self._claim: asyncio.Future[Block] | None = None
        #: Prefetch threshold: half a block, or more once claims are seen to take long.
        self.reserve = max(1, self.settings.block_size // 2)
        #: Blocks taken per claim (one write whatever the count): enough to outpace the leases.
        self.claim_blocks = 1
        self._claim_use: deque[int] = deque(maxlen=CLAIM_MEMORY)
        self._taken_at_claim = 0
        self.taken = 0
        self.blocks_claimed = 0
        self._issued: list[Block] = []
        self._issued_starts: list[int] = []

    @property
    def claiming(self) -> bool:
        """Whether a block claim is in flight."""
        return self._claim is not None

    def remaining(self) -> int:
        """Pids held and not yet issued."""
        blocks = self.blocks
        if not blocks:
            return 0
        left = blocks[0].end - self.next_pid
        if len(blocks) > 1:
            left += sum(b.end - b.start for b in blocks) - (blocks[0].end - blocks[0].start)
        return left

    def _drop_used(self, now_ms: int) -> None:
        while self.blocks and (
            self.next_pid >= self.blocks[0].end
            or now_ms >= self.blocks[0].claimed_ms + self.blocks[0].ttl_ms
        ):
            self.blocks.popleft()
            if self.blocks:
                self.next_pid = self.blocks[0].start

    def start_claim(self) -> asyncio.Future[Block]:
        """The claim in flight, started now if none is."""
        if self._claim is None:
            request = BlockRequest(
                self.settings.block_size * self.claim_blocks,
                self.server_id,
                uuid.UUID(int=self.rng.getrandbits(128)).hex,
                self.clock(),
                self.settings.lifetime_ms,
                self.settings.block_ttl_ms,
                self.rng.getrandbits(128).to_bytes(16, "big"),
            )
            loop = asyncio.get_running_loop()
            claim = loop.run_in_executor(self.executor, self.coordinator.claim_block, request)
            claim.add_done_callback(self.absorb)
            self._claim = claim
            self._taken_at_claim = self.taken
        return self._claim

    def absorb(self, claim: asyncio.Future[Block]) -> None:
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
        self.adapt(self.taken - self._taken_at_claim)
        if not self.blocks:
            self.next_pid = block.start
        self.blocks.append(block)
        self._remember(block)

    def adapt(self, used_while_claiming: int) -> None:
        """Size the reserve and the next claim so that leases never wait for a claim.

        ``used_while_claiming`` is how many pids were issued while the claim that just landed was
        in flight. With ``u`` the largest such count of the last ``CLAIM_MEMORY`` claims, the next
        claim starts with ``RESERVE_FACTOR * u`` pids left (at least half a block) and takes as
        many pids, rounded up to whole blocks (at least one); both are capped at
        ``MAX_RESERVE_BLOCKS`` blocks, the claim also at ``settings.max_claim_blocks``. Claims run
        one at a time, so a claim must also bring more pids than are issued while it runs: with
        one block per claim a server never issued more than ``block_size`` pids per claim time
        (100 per ~8 ms claim capped it near 12k leases/s). A bigger claim is still ONE ZooKeeper
        write, so writes per lease only fall.
        """
        self._claim_use.append(used_while_claiming)
        want = RESERVE_FACTOR * max(self._claim_use)
        size = self.settings.block_size
        self.reserve = min(max(size // 2, want, 1), MAX_RESERVE_BLOCKS * size)
        self.claim_blocks = min(max(1, -(-want // size)), self.settings.max_claim_blocks)

    def pid_now(self, now_ms: int) -> tuple[int, Block] | None:
        """The next pid and its block without waiting, or None (a claim must land first);
        starts a claim when the held pids are down to the reserve."""
        self._drop_used(now_ms)
        if self._claim is None and self.remaining() <= self.reserve and self.coordinator.connected:
            self.start_claim()  # prefetch before the current block runs out
        if not self.blocks:
            return None
        pid = self.next_pid
        self.next_pid += 1
        self.taken += 1
        return pid, self.blocks[0]

    async def take_pid(self) -> tuple[int, Block]:
        """The next pid, waiting for a claim up to ``claim_timeout_s``.

        Raises:
            LeaseServiceUnavailable: no block could be claimed in time.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.claim_timeout_s
        while True:
            taken = self.pid_now(self.clock())
            if taken is not None:
                return taken
            claim = self.start_claim()
            if claim.done():
                # Finished, but its done callback has not run yet: absorb it here. Waiting on
                # a finished future does not yield, so without this the loop spins forever.
                self.absorb(claim)
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

    # -- blocks this server issued from --------------------------------------------------------

    def _remember(self, block: Block) -> None:
        now = self.clock()
        while self._issued and self._issued[0].last_expiry_ms <= now:
            self._issued.pop(0)  # every lease it issued has ended: nothing live to check
            self._issued_starts.pop(0)
        at = bisect.bisect(self._issued_starts, block.start)
        self._issued.insert(at, block)
        self._issued_starts.insert(at, block.start)

    def issued_block(self, pid: int) -> Block | None:
        """The block this server issued ``pid`` from, while any of its leases may be live."""
        at = bisect.bisect(self._issued_starts, pid) - 1
        if at < 0:
            return None
        block = self._issued[at]
        return block if pid in block else None
