"""Block prefetch: a busy server claims its next blocks early enough, and enough of them at once,
that leases never wait.

A claim is held open (a gated coordinator) while leases are issued, so "how many pids did the
claim's wait consume" is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator import LeaseServerSettings, LeaseService, MemoryCoordinator
from pidfence.pid_allocator.coordinator import Block, BlockRequest
from pidfence.pid_allocator.settings import CLAIM_MEMORY, MAX_RESERVE_BLOCKS, RESERVE_FACTOR
from tests.unit.lease_kit import asynchronous

BLOCK = 10


class GatedCoordinator(MemoryCoordinator):
    """Claims wait for ``gate`` (set: claims pass at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.claims = 0

    def claim_block(self, request: BlockRequest) -> Block:
        self.claims += 1
        if not self.gate.wait(10):
            raise TimeoutError("test never opened the gate")
        return super().claim_block(request)


def _service(coordinator: MemoryCoordinator, executor: ThreadPoolExecutor) -> LeaseService:
    settings = LeaseServerSettings(block_size=BLOCK, lifetime_ms=60_000)
    return LeaseService(coordinator, executor, settings, rng=random.Random(1))


@contextmanager
def _gated_service() -> Iterator[tuple[GatedCoordinator, LeaseService]]:
    coordinator = GatedCoordinator()
    with ThreadPoolExecutor(1) as executor:
        yield coordinator, _service(coordinator, executor)


async def _settle(service: LeaseService) -> None:
    while service.claiming:
        await asyncio.sleep(0.001)


@given(st.lists(st.integers(0, 10 * BLOCK), min_size=1, max_size=3 * CLAIM_MEMORY))
def test_reserve_and_claim_size_follow_the_busiest_recent_claim(uses: list[int]) -> None:
    with ThreadPoolExecutor(1) as executor:
        service = _service(MemoryCoordinator(), executor)
        for used in uses:
            service.supply.adapt(used)
        want = RESERVE_FACTOR * max(uses[-CLAIM_MEMORY:])
        assert BLOCK // 2 <= service.supply.reserve <= MAX_RESERVE_BLOCKS * BLOCK
        assert service.supply.reserve == min(max(BLOCK // 2, want), MAX_RESERVE_BLOCKS * BLOCK)
        assert 1 <= service.supply.claim_blocks <= MAX_RESERVE_BLOCKS
        claimed = service.supply.claim_blocks * BLOCK
        # A claim brings at least what the busiest recent claim's wait consumed, times the
        # factor (up to the cap): claims, one at a time, outpace the leases.
        assert claimed >= min(want, MAX_RESERVE_BLOCKS * BLOCK)
        assert claimed - BLOCK < max(want, 1)  # whole blocks, never one more than needed


@asynchronous
async def test_a_busy_server_claims_several_blocks_in_one_write() -> None:
    with _gated_service() as (coordinator, service):
        await service.lease()
        await _settle(service)
        coordinator.gate.clear()
        while not service.claiming:
            assert service.lease_fields_now() is not None
        at_claim = service.leases - 1  # the lease that started the claim was issued in it
        while service.supply.remaining() > 0:  # the held pids all go while the claim waits
            assert service.lease_fields_now() is not None
        used = service.leases - at_claim
        assert service.lease_fields_now() is None  # dry: this one would wait
        coordinator.gate.set()
        await _settle(service)
        expected_blocks = min(-(-RESERVE_FACTOR * used // BLOCK), MAX_RESERVE_BLOCKS)
        assert service.supply.claim_blocks == expected_blocks > 1
        writes = coordinator.writes
        while not service.claiming:  # down to the new reserve: the bigger claim starts
            assert service.lease_fields_now() is not None
        await _settle(service)
        assert coordinator.writes == writes + 1  # one write for all of its blocks
        newest = service.supply.blocks[-1]
        assert newest.end - newest.start == expected_blocks * BLOCK
        # Every pid is issued once, in order, across the bigger block too.
        pids = [service.lease_fields_now() for _ in range(expected_blocks * BLOCK)]
        issued = [fields[0] for fields in pids if fields is not None]
        assert issued == sorted(set(issued))


@asynchronous
async def test_a_slow_claim_makes_the_next_one_start_earlier() -> None:
    with _gated_service() as (coordinator, service):
        await service.lease()  # first block
        await _settle(service)
        # Issue down to half a block: the prefetch claim starts and is held open.
        coordinator.gate.clear()
        while not service.claiming:
            assert service.lease_fields_now() is not None
        issued_before = service.leases
        for _ in range(3):  # leases issued while the claim waits
            assert service.lease_fields_now() is not None
        used = service.leases - issued_before
        coordinator.gate.set()
        await _settle(service)
        assert service.supply.reserve == max(BLOCK // 2, RESERVE_FACTOR * (used + 1))
        # The next claim starts as soon as the held pids drop to the new reserve.
        while service.supply.remaining() > service.supply.reserve:
            assert service.lease_fields_now() is not None
            assert not service.claiming
        assert service.lease_fields_now() is not None
        assert service.claiming
        await _settle(service)


@asynchronous
async def test_an_idle_server_keeps_the_half_block_rule() -> None:
    with _gated_service() as (coordinator, service):
        await service.lease()
        await _settle(service)
        for _ in range(BLOCK):
            await service.lease()
            await _settle(service)
        assert service.supply.reserve == BLOCK // 2
        assert coordinator.writes == coordinator.claims  # one write per claim


@given(st.lists(st.integers(0, 10 * BLOCK), min_size=1, max_size=CLAIM_MEMORY))
def test_max_claim_blocks_caps_the_claim(uses: list[int]) -> None:
    with ThreadPoolExecutor(1) as executor:
        settings = LeaseServerSettings(block_size=BLOCK, lifetime_ms=60_000, max_claim_blocks=1)
        service = LeaseService(MemoryCoordinator(), executor, settings, rng=random.Random(1))
        for used in uses:
            service.supply.adapt(used)
        assert service.supply.claim_blocks == 1  # one block per write, however busy


@asynchronous
async def test_every_issuing_path_gives_the_lease_the_reference_functions_derive() -> None:
    """``lease()`` (the simulation's path), ``roll()`` and the server's ``lease_fields_now()``
    share one issuing step: each lease's generation and secret are what
    ``initial_generation`` and ``make_secret`` derive from its block, also when an injected
    clock reads before the block's claim (the secret's offset is unsigned)."""
    from pidfence.pid_allocator.capability import make_secret
    from pidfence.pid_allocator.generations import initial_generation

    now = [1_000_000]
    with ThreadPoolExecutor(1) as executor:
        service = LeaseService(
            MemoryCoordinator(),
            executor,
            LeaseServerSettings(block_size=BLOCK, lifetime_ms=60_000),
            rng=random.Random(1),
            clock=lambda: now[0],
        )
        first = await service.lease()
        now[0] -= 5  # behind the claim
        fast = service.lease_fields_now()
        assert fast is not None
        rolled = await service.roll(first.pid, first.generation, first.secret)
        block = service.supply.blocks[0]
        for pid, generation, expire_ms, secret in (
            (first.pid, first.generation, first.expire_ms, first.secret),
            fast[:4],
            (rolled.pid, rolled.generation, rolled.expire_ms, rolled.secret),
        ):
            assert block.start <= pid < block.end
            assert generation == initial_generation(block.salt, pid)
            offset = max(0, expire_ms - 60_000 - block.claimed_ms)
            assert secret == make_secret(block.start, block.salt, pid, offset)


@asynchronous
async def test_a_block_issues_only_before_its_ttl_and_answers_only_for_its_own_pids() -> None:
    """A block is issued from only before ``claimed_ms + ttl_ms`` (the lease ending at its
    ``last_expiry_ms`` is issued one ms before), and ``issued_block`` names it only for the
    pids in ``[start, end)``: a pid past it is another block's, whose salt checks its secret."""
    now = [1_000_000]
    ttl = 1_000
    with ThreadPoolExecutor(1) as executor:
        service = LeaseService(
            MemoryCoordinator(),
            executor,
            LeaseServerSettings(block_size=BLOCK, lifetime_ms=60_000, block_ttl_ms=ttl),
            rng=random.Random(1),
            clock=lambda: now[0],
        )
        supply = service.supply
        first = await service.lease()
        block = supply.blocks[0]
        assert block.start <= first.pid < block.end
        assert supply.issued_block(first.pid) is block
        assert supply.issued_block(block.end) is None
        assert supply.issued_block(block.start - 1) is None

        now[0] = block.claimed_ms + ttl - 1
        last = await service.lease()
        assert last.pid in block
        assert last.expire_ms == block.last_expiry_ms - 1
        now[0] = block.claimed_ms + ttl
        late = await service.lease()
        assert late.pid not in block
        await _settle(service)
