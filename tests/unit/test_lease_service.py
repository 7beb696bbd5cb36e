"""Lease and bump rules of one server, on the in-memory coordinator with a fake clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pidfence.pid_allocator import (
    LeaseCapacityExhausted,
    LeaseServerSettings,
    LeaseService,
    LeaseServiceUnavailable,
    NotOwner,
    StaleGeneration,
    UnknownPid,
)
from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.generations import GENERATION_START_LIMIT
from tests.unit.lease_kit import LeaseServers, asynchronous


@asynchronous
async def test_leases_are_unique_increasing_and_write_once_per_block(servers: LeaseServers) -> None:
    service = servers.service(block_size=100, lifetime_ms=10**9)
    pids = []
    for _ in range(1000):
        grant = await service.lease()
        assert 0 <= grant.generation < GENERATION_START_LIMIT
        assert grant.expire_ms == servers.clock.now + 10**9
        pids.append(grant.pid)
    assert pids == sorted(set(pids))
    assert servers.store.writes <= 11  # 10 blocks of 100, plus at most one prefetched


@asynchronous
async def test_servers_on_one_store_never_share_a_pid(servers: LeaseServers) -> None:
    a, b = servers.service(), servers.service()
    grants = await asyncio.gather(*(s.lease() for _ in range(50) for s in (a, b)))
    pids = [g.pid for g in grants]
    assert len(pids) == len(set(pids)) == 100


@asynchronous
async def test_bump_moves_one_generation_and_fences_the_old_one(service: LeaseService) -> None:
    lease = await service.lease()
    bumped = await service.bump(lease.pid, lease.generation, lease.secret)
    assert bumped.generation == lease.generation + 1
    assert bumped.expire_ms == lease.expire_ms
    assert bumped.secret == lease.secret
    with pytest.raises(StaleGeneration, match="fenced"):
        await service.bump(lease.pid, lease.generation, lease.secret)
    again = await service.bump(lease.pid, bumped.generation, lease.secret)
    assert again.generation == lease.generation + 2


@asynchronous
async def test_bump_retry_with_the_same_token_gets_the_same_answer(service: LeaseService) -> None:
    lease = await service.lease()
    once, other = "bump-1", "bump-2"
    first = await service.bump(lease.pid, lease.generation, lease.secret, token=once)
    retry = await service.bump(lease.pid, lease.generation, lease.secret, token=once)
    assert retry == first
    with pytest.raises(StaleGeneration):
        await service.bump(lease.pid, lease.generation, lease.secret, token=other)


@asynchronous
async def test_bump_at_a_server_that_did_not_issue_the_pid(servers: LeaseServers) -> None:
    issuer, other = servers.service(), servers.service()
    lease = await issuer.lease()
    bumped = await other.bump(lease.pid, lease.generation, lease.secret)
    assert bumped.generation == lease.generation + 1
    assert bumped.expire_ms <= lease.expire_ms  # the earliest possible end, never later
    assert bumped.secret == lease.secret
    with pytest.raises(StaleGeneration):
        await issuer.bump(lease.pid, lease.generation, lease.secret)
    with pytest.raises(StaleGeneration):
        await other.bump(lease.pid, lease.generation + 7, lease.secret)


@asynchronous
async def test_unknown_and_expired_pids(servers: LeaseServers) -> None:
    service = servers.service(lifetime_ms=1000, block_ttl_ms=100)
    other = servers.service(lifetime_ms=1000, block_ttl_ms=100)
    lease = await service.lease()
    with pytest.raises(NotOwner):
        await service.bump(424242, 1, lease.secret)
    with pytest.raises(NotOwner):  # claimed in our block but not handed out
        await service.bump(lease.pid + 1, 0, lease.secret)
    servers.clock.now += 1000
    with pytest.raises(UnknownPid, match="ended"):
        await service.bump(lease.pid, lease.generation, lease.secret)
    servers.clock.now += 100
    with pytest.raises(UnknownPid, match="ended"):
        await other.bump(lease.pid, lease.generation, lease.secret)


@asynchronous
async def test_bumped_pid_expires_at_its_lease_end(servers: LeaseServers) -> None:
    service = servers.service(lifetime_ms=1000)
    lease = await service.lease()
    bumped = await service.bump(lease.pid, lease.generation, lease.secret)
    servers.clock.now = lease.expire_ms
    with pytest.raises(UnknownPid, match="ended"):
        await service.bump(lease.pid, bumped.generation, lease.secret)


@asynchronous
async def test_capacity_refuses_until_leases_expire(servers: LeaseServers) -> None:
    service = servers.service(capacity=2, client_share=1.0, lifetime_ms=500)
    first = await service.lease()
    await service.lease()
    with pytest.raises(LeaseCapacityExhausted):
        await service.lease()
    servers.clock.now += 500
    third = await service.lease()
    assert third.pid > first.pid


@asynchronous
async def test_store_down_serves_leases_from_the_claimed_block_only(servers: LeaseServers) -> None:
    service = servers.service(block_size=10, claim_timeout_s=0.2)
    leases = [await service.lease() for _ in range(6)]  # the 6th triggers a prefetch
    while service.claiming:
        await asyncio.sleep(0.01)
    servers.store.up = False
    with pytest.raises(LeaseServiceUnavailable):
        await service.bump(leases[0].pid, leases[0].generation, leases[0].secret)
    served = [await service.lease() for _ in range(14)]  # 4 left in block 1, 10 in block 2
    assert len({g.pid for g in served}) == 14
    with pytest.raises(LeaseServiceUnavailable):
        await service.lease()
    servers.store.up = True
    assert (await service.lease()).pid > served[-1].pid


@asynchronous
async def test_block_is_abandoned_after_its_issue_window(servers: LeaseServers) -> None:
    service = servers.service(block_size=10, block_ttl_ms=50)
    first = await service.lease()
    servers.clock.now += 50
    second = await service.lease()
    block = servers.store.block_at(second.pid)
    assert block is not None
    assert first.pid not in block
    assert block.claimed_ms == servers.clock.now


def test_config_rejects_nonsense() -> None:
    with pytest.raises(SettingsError, match="block_size"):
        LeaseServerSettings(block_size=0)
    with pytest.raises(SettingsError, match="lifetime_ms"):
        LeaseServerSettings(lifetime_ms=0)
    with pytest.raises(SettingsError, match="tls"):
        LeaseServerSettings(tls_client_ca=Path("ca.pem"))
    with pytest.raises(SettingsError, match="capacity"):
        LeaseServerSettings().with_overrides(capasity=3)
