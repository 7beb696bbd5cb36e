"""``describe``: the read-only question a sink asks the lease authority before it adopts a pid."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerThread,
    LeaseService,
    MemoryCoordinator,
    RateLimited,
    Unauthenticated,
    client_tls_context,
    load_token_file,
)
from pidfence.pid_allocator.protocol import DescribeRequest, RequestRejected, encode_frame
from pidfence.pid_allocator.protocol import parse_request as parse
from pidfence.services.lease_server import make_lease_pki
from pidfence.wire import PidState, PidStatus
from tests.unit.lease_kit import LeaseServers, asynchronous

LIVE, RETIRED, ENDED, UNKNOWN = PidState.LIVE, PidState.RETIRED, PidState.ENDED, PidState.UNKNOWN


@asynchronous
async def test_a_leased_pid_is_live_at_its_issuer_only(servers: LeaseServers) -> None:
    issuer, other = servers.service(), servers.service()
    lease = await issuer.lease()
    assert await issuer.describe(lease.pid) == PidStatus(
        lease.pid, LIVE, lease.generation, lease.expire_ms
    )
    # Another server holds no record of a pid that was never bumped: it vouches for nothing.
    assert await other.describe(lease.pid) == PidStatus.unknown(lease.pid)
    assert await issuer.describe(lease.pid + 1_000) == PidStatus.unknown(lease.pid + 1_000)


@asynchronous
async def test_bumps_and_rolls_are_known_everywhere(servers: LeaseServers) -> None:
    issuer, other = servers.service(), servers.service()
    lease = await issuer.lease()
    bumped = await issuer.bump(lease.pid, lease.generation, lease.secret)
    for server in (issuer, other):
        assert await server.describe(lease.pid) == PidStatus(
            lease.pid, LIVE, bumped.generation, lease.expire_ms
        )
    successor = await other.roll(lease.pid, bumped.generation, lease.secret)
    for server in (issuer, other):
        retired = await server.describe(lease.pid)
        assert (retired.state, retired.generation) == (RETIRED, bumped.generation)
        assert (await server.describe(successor.pid)).generation == successor.generation


@asynchronous
async def test_an_ended_lease_keeps_its_exact_end_until_retention(servers: LeaseServers) -> None:
    service = servers.service(lifetime_ms=1_000, retention_ms=5_000)
    lease = await service.lease()
    servers.clock.now += 1_000
    assert await service.describe(lease.pid) == PidStatus(
        lease.pid, ENDED, lease.generation, lease.expire_ms
    )
    servers.clock.now += 4_999
    assert (await service.describe(lease.pid)).state is ENDED
    servers.clock.now += 1
    assert await service.describe(lease.pid) == PidStatus.unknown(lease.pid)


@asynchronous
async def test_an_ended_lease_is_recalled_while_its_ring_slot_is_unused(
    servers: LeaseServers,
) -> None:
    service = servers.service(lifetime_ms=1_000, capacity=3, client_share=1.0, retention_ms=10**9)
    first = await service.lease()
    servers.clock.now += 1_000
    later = [await service.lease() for _ in range(2)]
    assert (await service.describe(first.pid)).expire_ms == first.expire_ms
    await service.lease()  # the ring wraps: the first lease's slot is reused
    assert await service.describe(first.pid) == PidStatus.unknown(first.pid)
    assert [(await service.describe(g.pid)).state for g in later] == [LIVE, LIVE]


@asynchronous
async def test_describe_is_rate_limited_like_bumps(servers: LeaseServers) -> None:
    service = servers.service(zk_queue=4, zk_client_share=0.5, zk_workers=1)
    lease = await service.lease()
    answers = await asyncio.gather(
        *(service.describe(lease.pid, "flooder") for _ in range(10)), return_exceptions=True
    )
    assert any(isinstance(a, RateLimited) for a in answers)
    assert await service.describe(lease.pid, "other") == PidStatus(
        lease.pid, LIVE, lease.generation, lease.expire_ms
    )


def test_the_request_is_validated() -> None:
    assert parse(encode_frame({"v": 1, "op": "describe", "id": 3, "pid": 9})[4:]) == (
        DescribeRequest(3, 9)
    )
    for pid in (0, -1, "9", None, 2**63):
        with pytest.raises(RequestRejected):
            parse(encode_frame({"v": 1, "op": "describe", "id": 3, "pid": pid})[4:])


def test_over_the_wire_with_tokens_tls_and_signing(tmp_path: Path) -> None:
    """Any authenticated client may ask; nothing but ``ping`` and ``hello`` before ``hello``."""
    pki = make_lease_pki(tmp_path)
    store = MemoryCoordinator()
    secured = LeaseServerThread(
        None,
        coordinator=store,
        auth_tokens_file=pki.tokens_file,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        signing_key=pki.signing_key,
    )
    tls = client_tls_context(pki.ca)
    with secured:
        producer_token = load_token_file(pki.token_files["producer"])
        with LeaseClient(secured.address, token=producer_token, tls=tls) as producer:
            lease = producer.lease()
        sink_token = load_token_file(pki.token_files["other"])
        with LeaseClient(secured.address, token=sink_token, tls=tls) as sink:
            assert sink.describe(lease.pid) == PidStatus(
                lease.pid, LIVE, lease.generation, lease.expire_ms
            )
        with (
            LeaseClient(secured.address, token="not-listed", tls=tls, retries=0) as stranger,  # noqa: S106
            pytest.raises(Unauthenticated),
        ):
            stranger.describe(lease.pid)


def test_an_unknown_answer_is_asked_of_the_other_servers() -> None:
    store = MemoryCoordinator()
    with (
        LeaseServerThread(None, coordinator=store) as issuer,
        LeaseServerThread(None, coordinator=store) as other,
    ):
        with LeaseClient(issuer.address) as producer:
            lease = producer.lease()
        with LeaseClient(f"{other.address},{issuer.address}") as sink:
            assert sink.describe(lease.pid).state is LIVE
            assert sink.describe(lease.pid + 500) == PidStatus.unknown(lease.pid + 500)


def test_describe_of_a_service_without_zookeeper_is_unavailable(servers: LeaseServers) -> None:
    from pidfence.pid_allocator import LeaseServiceUnavailable

    service: LeaseService = servers.service()
    servers.store.up = False
    with pytest.raises(LeaseServiceUnavailable):
        asyncio.run(service.describe(5))


@pytest.mark.parametrize(
    "row",
    [
        [None, "live", 1, 0],
        [1.9, "live", True, 0],  # a float and a bool are not a pid and a generation
        ["7", "live", "3", "0"],
        [7, "nope", 1, 0],
        [7, ["live"], 1, 0],  # a list is no state (it raised TypeError: unhashable)
        [7, "live", 1],
        [7, "live", 1, 2.5],  # a lease end is an int of epoch ms
        [7, "retired", 1, "1000"],
        "7,live,1,0",
    ],
)
def test_a_recorded_answer_of_the_wrong_shape_is_refused(row: object) -> None:
    with pytest.raises(ValueError, match=r"\[pid, state, generation, expire_ms\]"):
        PidStatus.from_list(row)


def test_a_recorded_answer_reads_back() -> None:
    status = PidStatus(7, PidState.RETIRED, 3, 1_000)
    assert PidStatus.from_list(status.to_list()) == status
