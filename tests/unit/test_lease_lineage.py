"""Owner-only bumps and rolls with lineage (DESIGN.md §5 amended, §9), on the in-memory store.

Two services on one store model two lease servers. Clocks are fake; faults are store hooks.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidfence.pid_allocator import LeaseService, errors
from pidfence.pid_allocator.lineage import NOT_OWNER_MESSAGE
from tests.unit.lease_kit import LeaseServers, asynchronous


@asynchronous
async def test_roll_retires_the_pid_and_issues_a_successor(servers: LeaseServers) -> None:
    a, b = servers.service(), servers.service()
    lease = await a.lease()
    successor = await b.roll(lease.pid, lease.generation, lease.secret)
    assert successor.pid != lease.pid
    assert successor.secret != lease.secret
    assert successor.expire_ms == servers.clock.now + 1000
    for server in (a, b):  # a zombie's second roll, or its bump, fails on every server
        with pytest.raises(errors.StaleGeneration) as stale:
            await server.roll(lease.pid, lease.generation, lease.secret)
        assert stale.value.successor == successor.pid
        assert stale.value.successor_generation == successor.generation
        with pytest.raises(errors.StaleGeneration):
            await server.bump(lease.pid, lease.generation, lease.secret)
    # The successor is a normal pid: its owner bumps and rolls it.
    bumped = await a.bump(successor.pid, successor.generation, successor.secret)
    assert bumped.generation == successor.generation + 1


@asynchronous
async def test_roll_from_a_fenced_generation_fails(
    servers: LeaseServers, service: LeaseService
) -> None:
    lease = await service.lease()
    await service.bump(lease.pid, lease.generation, lease.secret)  # a resumer fences us
    with pytest.raises(errors.StaleGeneration) as stale:
        await service.roll(lease.pid, lease.generation, lease.secret)
    assert stale.value.successor is None
    assert servers.store.writes == 2  # the claim and the bump: the refused roll wrote nothing


@asynchronous
async def test_lineage_authority_lets_a_resumer_fence_the_successor(service: LeaseService) -> None:
    """A checkpoint of P written before A rolled P into P' can fence P' (one step), and two
    resumers of that checkpoint cannot both continue."""
    p = await service.lease()
    p2 = await service.roll(p.pid, p.generation, p.secret)  # zombie A rolls
    with pytest.raises(errors.StaleGeneration) as stale:  # resumer R1 from the checkpoint of P
        await service.bump(p.pid, p.generation, p.secret)
    assert stale.value.successor == p2.pid
    g = stale.value.successor_generation
    assert g == p2.generation
    fenced = await service.bump(p2.pid, g, p.secret)  # R1 fences A's successor
    assert fenced.secret == p2.secret  # and now holds P' outright
    with pytest.raises(errors.StaleGeneration):  # resumer R2 from the same checkpoint: too late
        await service.bump(p2.pid, g, p.secret)
    with pytest.raises(errors.StaleGeneration):  # A, under P', is fenced
        await service.roll(p2.pid, p2.generation, p2.secret)
    # One step only: P's secret does not reach the successor of P'.
    p3 = await service.roll(p2.pid, fenced.generation, fenced.secret)
    with pytest.raises(errors.NotOwner):
        await service.bump(p3.pid, p3.generation, p.secret)


@asynchronous
async def test_expired_pid_can_be_rolled_within_retention_only(servers: LeaseServers) -> None:
    service = servers.service(lifetime_ms=1000, retention_ms=5000, block_ttl_ms=100)
    lease = await service.lease()
    servers.clock.now += 1000
    with pytest.raises(errors.UnknownPid, match="roll it"):
        await service.bump(lease.pid, lease.generation, lease.secret)
    successor = await service.roll(lease.pid, lease.generation, lease.secret)
    with pytest.raises(errors.StaleGeneration):  # the zombie's later roll
        await service.roll(lease.pid, lease.generation, lease.secret)
    late = await service.lease()
    servers.clock.now = late.expire_ms + 5000 + 1000  # both past lease end plus retention
    with pytest.raises(errors.NotOwner):
        await service.roll(late.pid, late.generation, late.secret)
    assert successor.pid != late.pid


@asynchronous
async def test_non_owners_learn_nothing(service: LeaseService) -> None:
    """Wrong secret, no secret, another pid's secret, a never-issued pid, a bumped pid: one
    reply, the same text, with no generation in it."""
    mine, theirs = await service.lease(), await service.lease()
    await service.bump(theirs.pid, theirs.generation, theirs.secret)
    forged = bytearray(theirs.secret)
    forged[-1] ^= 1
    attempts = [
        (theirs.pid, theirs.generation, b""),
        (theirs.pid, theirs.generation, bytes(forged)),
        (theirs.pid, theirs.generation + 1, mine.secret),
        (mine.pid + 5, 0, mine.secret),
        (10**15, 0, mine.secret),
        (10**15, 0, b"\x00" * 24),
    ]
    messages = []
    for pid, generation, secret in attempts:
        for op in (service.bump, service.roll):
            with pytest.raises(errors.NotOwner) as caught:
                await op(pid, generation, secret)
            messages.append(str(caught.value))
    assert set(messages) == {NOT_OWNER_MESSAGE}
    assert not any(ch.isdigit() for ch in NOT_OWNER_MESSAGE)


@pytest.mark.parametrize("hook", ["lose_after_write", "lose_before_write"])
@asynchronous
async def test_store_lost_during_a_roll_is_settled_by_re_reading(
    servers: LeaseServers, hook: str
) -> None:
    service = servers.service()
    lease = await service.lease()
    getattr(servers.store, hook)()
    successor = await service.roll(lease.pid, lease.generation, lease.secret, token="t1")  # noqa: S106 - a retry token
    record = servers.store.read_lineage(lease.pid)
    assert record is not None
    assert record[0].successor == successor.pid  # exactly one successor recorded
    again = await service.roll(lease.pid, lease.generation, lease.secret, token="t1")  # noqa: S106 - a retry token
    assert (again.pid, again.generation, again.secret) == (
        successor.pid,
        successor.generation,
        successor.secret,
    )  # a client retry with the same token gets the same successor back


@asynchronous
async def test_store_down_during_a_roll_is_retriable_and_changes_nothing(
    servers: LeaseServers,
) -> None:
    service = servers.service()
    lease = await service.lease()
    servers.store.up = False
    with pytest.raises(errors.LeaseServiceUnavailable) as caught:
        await service.roll(lease.pid, lease.generation, lease.secret)
    assert caught.value.retriable
    servers.store.up = True
    assert servers.store.read_lineage(lease.pid) is None
    await service.roll(lease.pid, lease.generation, lease.secret)


# -- property: no (pid, generation) is granted twice; a pid has at most one successor ---------

_op = st.tuples(
    st.sampled_from(["bump", "roll"]),
    st.integers(0, 5),  # which known lease (a holder's view, possibly stale)
    st.sampled_from(["own", "wrong", "none"]),
    st.integers(0, 1),  # which server
    st.booleans(),  # advance the clock past a lease end first
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, min_size=1, max_size=30))
@asynchronous
async def test_lineage_invariants(executor: ThreadPoolExecutor, ops: list[Any]) -> None:
    servers = LeaseServers(executor)  # a fresh store and clock for each example
    services = [servers.service(lifetime_ms=1000, retention_ms=3000) for _ in range(2)]
    views = [await services[0].lease() for _ in range(3)]
    granted = {(v.pid, v.generation) for v in views}
    successors: dict[int, int] = {}
    for op, which, holder, server, tick in ops:
        if tick:
            servers.clock.now += 700
        view = views[which % len(views)]
        secret = {"own": view.secret, "wrong": b"\x01" * 24, "none": b""}[holder]
        service = services[server]
        try:
            if op == "bump":
                grant = await service.bump(view.pid, view.generation, secret)
                assert grant.pid == view.pid
            else:
                grant = await service.roll(view.pid, view.generation, secret)
                assert view.pid not in successors, "a pid was rolled twice"
                successors[view.pid] = grant.pid
        except errors.NotOwner:
            # An owner is refused only once the pid is forgotten (past retention).
            assert holder != "own" or servers.clock.now >= view.expire_ms + 3000
            continue
        except errors.LeaseError:
            continue
        assert holder == "own", "a non-owner was granted"
        assert (grant.pid, grant.generation) not in granted, "an identity granted twice"
        granted.add((grant.pid, grant.generation))
        views.append(grant)
