"""The true end everywhere (issue 22 case 7): a bump or roll via a server that did not issue the
pid grants and records the end the issuer granted, read from the pid's secret; version 1
secrets keep working. Two services on one in-memory coordinator with their own fake clocks (real
servers: ``tests/integration/test_lease_true_end.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidfence.pid_allocator import (
    LeaseService,
    UnknownPid,
)
from pidfence.pid_allocator.capability import (
    SECRET_BYTES,
    block_hint,
    issue_offset,
    make_secret,
    secret_matches,
)
from pidfence.pid_allocator.coordinator import LineageRecord
from tests.unit.lease_kit import LeaseServers, asynchronous

LIFETIME = 90_000
BLOCK_TTL = 600_000


def _pair(servers: LeaseServers) -> tuple[LeaseService, LeaseService]:
    """The issuer of the pids and another server of the cluster."""
    settings = {"block_size": 50, "lifetime_ms": LIFETIME, "block_ttl_ms": BLOCK_TTL}
    return servers.service(1, **settings), servers.service(2, **settings)


@asynchronous
async def test_a_foreign_bump_and_roll_keep_the_issuers_end(servers: LeaseServers) -> None:
    issuer, other = _pair(servers)
    await issuer.lease()  # claims the block now
    servers.clock.now += 50_000  # the next lease comes from the same block, 50 s after its claim
    lease = await issuer.lease()
    assert lease.expire_ms == servers.clock.now + LIFETIME
    servers.clock.now += LIFETIME - 10_000  # past claim + lifetime: the old "earliest end"
    bumped = await other.bump(lease.pid, lease.generation, lease.secret)
    assert bumped.expire_ms == lease.expire_ms
    assert bumped.secret == lease.secret
    record = servers.store.read_lineage(lease.pid)
    assert record is not None and record[0].expire_ms == lease.expire_ms  # for every server
    again = await issuer.bump(lease.pid, bumped.generation, lease.secret)
    assert again.expire_ms == lease.expire_ms
    successor = await other.roll(lease.pid, again.generation, lease.secret)
    assert successor.expire_ms == servers.clock.now + LIFETIME
    retired = servers.store.read_lineage(lease.pid)
    assert retired is not None and retired[0].expire_ms == lease.expire_ms


@asynchronous
async def test_an_ended_lease_is_still_refused_via_any_server(servers: LeaseServers) -> None:
    issuer, other = _pair(servers)
    lease = await issuer.lease()
    servers.clock.now = lease.expire_ms
    for service in (issuer, other):
        with pytest.raises(UnknownPid):
            await service.bump(lease.pid, lease.generation, lease.secret)


@asynchronous
async def test_lineage_authority_gets_the_successors_own_secret(servers: LeaseServers) -> None:
    issuer, other = _pair(servers)
    lease = await issuer.lease()
    servers.clock.now += 7_000
    successor = await issuer.roll(lease.pid, lease.generation, lease.secret)
    record = servers.store.read_lineage(successor.pid)
    assert record is not None and record[0].offset == issue_offset(successor.secret)
    # A resumer holding only the predecessor's secret, at a server that issued neither.
    bumped = await other.bump(successor.pid, successor.generation, lease.secret)
    assert bumped.secret == successor.secret
    assert bumped.expire_ms == successor.expire_ms


@given(
    st.integers(1, 2**62),
    st.binary(min_size=16, max_size=16),
    st.integers(1, 2**62),
    st.integers(0, 2**32 - 1),
)
def test_secrets_carry_their_issue_offset(start: int, salt: bytes, pid: int, offset: int) -> None:
    secret = make_secret(start, salt, pid, offset)
    assert len(secret) == SECRET_BYTES
    assert (block_hint(secret), issue_offset(secret)) == (start, offset)
    assert secret_matches(secret, start, salt, pid)
    moved = secret[:8] + ((offset + 1) % 2**32).to_bytes(4, "big") + secret[12:]
    assert not secret_matches(moved, start, salt, pid)  # the offset is under the MAC
    assert not secret_matches(secret, start, salt, pid + 1)


def test_lineage_records_keep_the_offset_and_stay_readable() -> None:
    record = LineageRecord(5, 99, "t", 1, predecessor=3, offset=1234)
    assert LineageRecord.decode(record.encode()) == record
    old = LineageRecord(5, 99, "t", 1, predecessor=3)
    assert LineageRecord.decode(old.encode()).offset is None
