"""Issue 12 findings 2-5 and 8, each forced deterministically (no timing luck): the event-loop
spin, unbounded pipelining, the unbounded ZooKeeper queue, one client filling the ring, and a
wall-clock step dropping live leases. Findings 1 and 6 are in
``tests/integration/test_lease_security.py``, 7 in ``test_lease_zk_ambiguous.py`` and
``tests/integration/test_lease_zk_acl.py``."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest

from pidfence.pid_allocator import (
    LeaseCapacityExhausted,
    LeaseClient,
    LeaseServerSettings,
    LeaseServerThread,
    LeaseService,
    MemoryCoordinator,
    SteadyClock,
)
from pidfence.pid_allocator.coordinator import Block, BlockRequest, LineageRecord
from pidfence.pid_allocator.protocol import LENGTH, encode_frame
from tests.unit.lease_kit import asynchronous

# -- finding 2: the spin ------------------------------------------------------------------------


@asynchronous
async def test_finished_claim_with_its_callback_pending_and_deadline_passed_does_not_spin(
    executor: ThreadPoolExecutor,
) -> None:
    """The exact state of finding 2: the claim future is done, its done-callback has not run,
    and the waiter's deadline has passed. The old loop called ``wait_for(done, timeout<=0)``
    forever without yielding; now the waiter absorbs the block itself."""
    store = MemoryCoordinator()
    settings = LeaseServerSettings(block_size=10, claim_timeout_s=0.0)
    service = LeaseService(store, executor, settings, rng=random.Random())
    calls = 0
    original = service.supply.pid_now

    def counted(now_ms: int) -> Any:
        nonlocal calls
        calls += 1
        assert calls < 100, "lease() spins without yielding to the event loop"
        return original(now_ms)

    service.supply.pid_now = counted  # type: ignore[method-assign]
    block = BlockRequest(10, "other", "t", service.clock(), 10_000, 10_000, b"s" * 16).placed(1)
    claim: asyncio.Future[Block] = asyncio.get_running_loop().create_future()
    claim.set_result(block)  # finished; no done-callback has run (none was even added)
    service.supply._claim = claim
    store.up = False  # no new claim may start: only the finished one can serve
    grant = await service.lease()
    assert grant.pid == 1
    assert calls <= 3


# -- finding 3 and 4: bounded pipelining and a bounded ZooKeeper queue --------------------------


class GatedStore(MemoryCoordinator):
    """Lineage reads wait for ``gate``: ZooKeeper as slow as a test needs, deterministically."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.waiting = 0
        self._count = threading.Lock()

    def read_lineage(self, pid: int) -> tuple[LineageRecord, int] | None:
        with self._count:
            self.waiting += 1
        self.gate.wait(60)
        with self._count:
            self.waiting -= 1
        return super().read_lineage(pid)


def _frames(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    out = []
    buffer = b""
    while len(out) < count:
        chunk = sock.recv(1 << 16)
        assert chunk, "server closed the connection"
        buffer += chunk
        while len(buffer) >= 4:
            (length,) = LENGTH.unpack(buffer[:4])
            if len(buffer) < 4 + length:
                break
            out.append(msgpack.unpackb(buffer[4 : 4 + length], raw=False))
            buffer = buffer[4 + length :]
    return out


def _stale_bump(lease: Any) -> bytes:
    """A bump of ``lease`` from generation 0, which the server answers ``STALE_GENERATION``."""
    request = {"v": 1, "op": "bump", "id": 1, "pid": lease.pid, "generation": 0}
    return encode_frame({**request, "secret": lease.secret})


def _wait_for_waiting(store: GatedStore, count: int) -> None:
    """Until ``count`` requests wait at the gated store (30 s at most)."""
    deadline = 600
    while store.waiting < count and deadline:
        deadline -= 1
        threading.Event().wait(0.05)


def _on_loop(server: LeaseServerThread, fn: Any) -> Any:
    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), server.loop).result(10)


def test_pipelined_requests_are_bounded_per_client_over_its_connections() -> None:
    store = GatedStore()
    # Rates off: this is the in-flight bound alone (every request is answered, none refused).
    with LeaseServerThread(
        None, coordinator=store, block_size=10, zk_workers=64, bump_rate=0
    ) as server:
        with LeaseClient(server.address) as client:
            lease = client.lease()
        store.gate.clear()
        frame = _stale_bump(lease)
        address: Any = tuple(server.address.rsplit(":", 1))
        # Two connections of one client (no tokens: its address).
        socks = [socket.create_connection(address, timeout=30) for _ in range(2)]
        for sock in socks:
            sock.sendall(frame * 2500)
        limit = server.settings.max_in_flight
        _wait_for_waiting(store, limit)  # the server has taken all it may take
        threading.Event().wait(0.2)  # time to take more, if it wrongly would
        in_flight = _on_loop(
            server, lambda: [c.in_flight for c in server.running.server._connections]
        )
        tasks = _on_loop(server, lambda: len(asyncio.all_tasks()))
        assert sum(in_flight) == limit  # 32 answered at once, the other 4968 wait unread
        assert tasks < limit + 10
        assert store.waiting == limit
        store.gate.set()
        replies = [r for sock in socks for r in _frames(sock, 2500)]  # all answered, in the end
        for sock in socks:
            sock.close()
    assert {r["error"] for r in replies} == {"STALE_GENERATION"}


def test_zookeeper_queue_is_bounded_per_client_with_rate_limited() -> None:
    store = GatedStore()
    with LeaseServerThread(
        None, coordinator=store, block_size=10, zk_queue=8, zk_client_share=0.5, zk_workers=16
    ) as server:
        with LeaseClient(server.address) as client:
            lease = client.lease()
        store.gate.clear()
        host, port = server.address.rsplit(":", 1)
        flooder = socket.create_connection((host, int(port)), timeout=30)
        frame = _stale_bump(lease)
        flooder.sendall(frame * 20)
        refused = _frames(flooder, 16)  # 4 queued (this client's share of 8); 16 refused now
        assert {r["error"] for r in refused} == {"RATE_LIMITED"}
        # Another client (another address) still gets its request to ZooKeeper.
        other = socket.create_connection(
            (host, int(port)), timeout=30, source_address=("127.0.0.2", 0)
        )
        other.sendall(frame)
        _wait_for_waiting(store, 5)
        assert store.waiting == 5
        store.gate.set()
        assert _frames(other, 1)[0]["error"] == "STALE_GENERATION"  # served, not rate limited
        assert {r["error"] for r in _frames(flooder, 4)} == {"STALE_GENERATION"}
        flooder.close()
        other.close()


# -- finding 5: one client's share of the ring ------------------------------------------------


@asynchronous
async def test_one_client_cannot_fill_the_ring(executor: ThreadPoolExecutor) -> None:
    settings = LeaseServerSettings(block_size=100, capacity=10, client_share=0.5)
    service = LeaseService(MemoryCoordinator(), executor, settings, rng=random.Random())
    for _ in range(5):
        await service.lease(client="addr:10.0.0.1")
    with pytest.raises(LeaseCapacityExhausted, match="share"):
        await service.lease(client="addr:10.0.0.1")
    for _ in range(5):
        await service.lease(client="token:billing")
    with pytest.raises(LeaseCapacityExhausted, match="ring full"):
        await service.lease(client="token:third")


# -- finding 8: a wall-clock step ------------------------------------------------------------


@asynchronous
async def test_wall_clock_step_does_not_drop_live_leases(executor: ThreadPoolExecutor) -> None:
    wall = [1_000_000_000]
    mono = [0]
    clock = SteadyClock(wall=lambda: wall[0], monotonic=lambda: mono[0])
    settings = LeaseServerSettings(block_size=10, lifetime_ms=60_000)
    service = LeaseService(
        MemoryCoordinator(), executor, settings, clock=clock, rng=random.Random()
    )
    lease = await service.lease()
    wall[0] += 10 * 60_000  # NTP steps the wall clock ten lifetimes ahead
    mono[0] += 1_000
    assert len(service.ring) == 1 and service.ring.find(lease.pid, clock()) is not None
    bumped = await service.bump(lease.pid, lease.generation, lease.secret)
    assert bumped.generation == lease.generation + 1
    mono[0] += 60_000  # a lifetime of real time later it does expire
    assert service.ring.find(lease.pid, clock()) is None
