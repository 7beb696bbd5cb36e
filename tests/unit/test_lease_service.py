"""Lease and bump rules of one server, on the in-memory coordinator with a fake clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pidfence.pid_allocator import (
    LeaseCapacityExhausted,
    LeaseServerSettings,
    LeaseService,
    LeaseServiceUnavailable,
    MemoryCoordinator,
    NotOwner,
    StaleGeneration,
    UnknownPid,
)
from pidfence.pid_allocator.generations import GENERATION_START_LIMIT
from pidfence.pid_allocator.settings import SettingsError

T = TypeVar("T")


class FakeClock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make(
    coordinator: MemoryCoordinator,
    executor: ThreadPoolExecutor,
    clock: FakeClock,
    **config: Any,
) -> LeaseService:
    cfg = LeaseServerSettings(**{"block_size": 10, "lifetime_ms": 1000, **config})
    return LeaseService(coordinator, executor, cfg, clock=clock, rng=random.Random())


def test_leases_are_unique_increasing_and_write_once_per_block(
    executor: ThreadPoolExecutor,
) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, block_size=100, lifetime_ms=10**9)

    async def lease_many() -> list[int]:
        pids = []
        for _ in range(1000):
            grant = await service.lease()
            assert 0 <= grant.generation < GENERATION_START_LIMIT
            assert grant.expire_ms == clock.now + 10**9
            pids.append(grant.pid)
        return pids

    pids = run(lease_many())
    assert pids == sorted(set(pids))
    assert coord.writes <= 11  # 10 blocks of 100, plus at most one prefetched


def test_servers_on_one_store_never_share_a_pid(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    a, b = make(coord, executor, clock), make(coord, executor, clock)

    async def interleave() -> list[int]:
        grants = await asyncio.gather(*(s.lease() for _ in range(50) for s in (a, b)))
        return [g.pid for g in grants]

    pids = run(interleave())
    assert len(pids) == len(set(pids)) == 100


def test_bump_moves_one_generation_and_fences_the_old_one(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock)

    async def scenario() -> None:
        lease = await service.lease()
        bumped = await service.bump(lease.pid, lease.generation, lease.secret)
        assert bumped.generation == lease.generation + 1
        assert bumped.expire_ms == lease.expire_ms
        assert bumped.secret == lease.secret
        with pytest.raises(StaleGeneration, match="fenced"):
            await service.bump(lease.pid, lease.generation, lease.secret)
        again = await service.bump(lease.pid, bumped.generation, lease.secret)
        assert again.generation == lease.generation + 2

    run(scenario())


def test_bump_retry_with_the_same_token_gets_the_same_answer(
    executor: ThreadPoolExecutor,
) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock)

    async def scenario() -> None:
        lease = await service.lease()
        once, other = "bump-1", "bump-2"
        first = await service.bump(lease.pid, lease.generation, lease.secret, token=once)
        retry = await service.bump(lease.pid, lease.generation, lease.secret, token=once)
        assert retry == first
        with pytest.raises(StaleGeneration):
            await service.bump(lease.pid, lease.generation, lease.secret, token=other)

    run(scenario())


def test_bump_at_a_server_that_did_not_issue_the_pid(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    issuer, other = make(coord, executor, clock), make(coord, executor, clock)

    async def scenario() -> None:
        lease = await issuer.lease()
        bumped = await other.bump(lease.pid, lease.generation, lease.secret)
        assert bumped.generation == lease.generation + 1
        assert bumped.expire_ms <= lease.expire_ms  # the earliest possible end, never later
        assert bumped.secret == lease.secret
        with pytest.raises(StaleGeneration):
            await issuer.bump(lease.pid, lease.generation, lease.secret)
        with pytest.raises(StaleGeneration):
            await other.bump(lease.pid, lease.generation + 7, lease.secret)

    run(scenario())


def test_unknown_and_expired_pids(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, lifetime_ms=1000, block_ttl_ms=100)
    other = make(coord, executor, clock, lifetime_ms=1000, block_ttl_ms=100)

    async def scenario() -> None:
        lease = await service.lease()
        with pytest.raises(NotOwner):
            await service.bump(424242, 1, lease.secret)
        with pytest.raises(NotOwner):  # claimed in our block but not handed out
            await service.bump(lease.pid + 1, 0, lease.secret)
        clock.now += 1000
        with pytest.raises(UnknownPid, match="ended"):
            await service.bump(lease.pid, lease.generation, lease.secret)
        clock.now += 100
        with pytest.raises(UnknownPid, match="ended"):
            await other.bump(lease.pid, lease.generation, lease.secret)

    run(scenario())


def test_bumped_pid_expires_at_its_lease_end(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, lifetime_ms=1000)

    async def scenario() -> None:
        lease = await service.lease()
        bumped = await service.bump(lease.pid, lease.generation, lease.secret)
        clock.now = lease.expire_ms
        with pytest.raises(UnknownPid, match="ended"):
            await service.bump(lease.pid, bumped.generation, lease.secret)

    run(scenario())


def test_capacity_refuses_until_leases_expire(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, capacity=2, client_share=1.0, lifetime_ms=500)

    async def scenario() -> None:
        first = await service.lease()
        await service.lease()
        with pytest.raises(LeaseCapacityExhausted):
            await service.lease()
        clock.now += 500
        third = await service.lease()
        assert third.pid > first.pid

    run(scenario())


def test_store_down_serves_leases_from_the_claimed_block_only(
    executor: ThreadPoolExecutor,
) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, block_size=10, claim_timeout_s=0.2)

    async def scenario() -> None:
        leases = [await service.lease() for _ in range(6)]  # the 6th triggers a prefetch
        while service.claiming:
            await asyncio.sleep(0.01)
        coord.up = False
        with pytest.raises(LeaseServiceUnavailable):
            await service.bump(leases[0].pid, leases[0].generation, leases[0].secret)
        served = [await service.lease() for _ in range(14)]  # 4 left in block 1, 10 in block 2
        assert len({g.pid for g in served}) == 14
        with pytest.raises(LeaseServiceUnavailable):
            await service.lease()
        coord.up = True
        assert (await service.lease()).pid > served[-1].pid

    run(scenario())


def test_block_is_abandoned_after_its_issue_window(executor: ThreadPoolExecutor) -> None:
    coord, clock = MemoryCoordinator(), FakeClock()
    service = make(coord, executor, clock, block_size=10, block_ttl_ms=50)

    async def scenario() -> None:
        first = await service.lease()
        clock.now += 50
        second = await service.lease()
        block = coord.block_at(second.pid)
        assert block is not None
        assert first.pid not in block
        assert block.claimed_ms == clock.now

    run(scenario())


def test_config_rejects_nonsense() -> None:
    with pytest.raises(SettingsError, match="block_size"):
        LeaseServerSettings(block_size=0)
    with pytest.raises(SettingsError, match="lifetime_ms"):
        LeaseServerSettings(lifetime_ms=0)
    with pytest.raises(SettingsError, match="tls"):
        LeaseServerSettings(tls_client_ca=Path("ca.pem"))
    with pytest.raises(SettingsError, match="capacity"):
        LeaseServerSettings().with_overrides(capasity=3)
