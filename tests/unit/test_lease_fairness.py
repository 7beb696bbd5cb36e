"""The fair ZooKeeper queue (``zk_queue.py``) and owner checks without ZooKeeper (``owners.py``):
issue 22 case 5, decided deterministically (real servers:
``tests/integration/test_hostile_lease_fairness.py``)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pidfence.pid_allocator import (
    LeaseServerSettings,
    LeaseService,
    MemoryCoordinator,
    NotOwner,
    RateLimited,
)
from pidfence.pid_allocator.zk_queue import ZkQueue
from tests.unit.lease_kit import asynchronous


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


class Gate:
    """Jobs that wait for a release one at a time, recording the order they ran in."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self._go = threading.Semaphore(0)

    def job(self, name: str) -> Callable[[], str]:
        def work() -> str:
            self._go.acquire()
            self.order.append(name)
            return name

        return work

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._go.release()


@asynchronous
async def test_clients_take_turns_whatever_the_flood(executor: ThreadPoolExecutor) -> None:
    gate = Gate()
    queue = ZkQueue(executor, limit=100, share=50, workers=1, reserve=0)
    flood = [asyncio.ensure_future(queue.run("flooder", gate.job(f"f{i}"))) for i in range(20)]
    await asyncio.sleep(0)
    victim = [asyncio.ensure_future(queue.run("victim", gate.job(f"v{i}"))) for i in range(3)]
    gate.release(10)
    await asyncio.gather(*victim)
    gate.release(20)
    await asyncio.gather(*flood)
    # f0 was running and the flooder's turn already queued when the victim came: from then on
    # the two alternate, one job each, however many the flooder has waiting.
    assert gate.order[:8] == ["f0", "f1", "v0", "f2", "v1", "f3", "v2", "f4"]


class Jobs:
    """Jobs that each wait for their own release, recording the order they started in."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._go: dict[str, threading.Event] = {}

    def job(self, name: str) -> Callable[[], str]:
        self._go[name] = threading.Event()

        def work() -> str:
            self.started.append(name)
            self._go[name].wait(10)
            return name

        return work

    async def finish(self, name: str) -> None:
        self._go[name].set()
        await asyncio.sleep(0.05)  # its worker returns, the next job starts


@asynchronous
async def test_a_client_with_nothing_running_never_waits_for_busy_workers() -> None:
    pool = ThreadPoolExecutor(3)
    jobs = Jobs()
    queue = ZkQueue(pool, limit=100, share=50, workers=2, reserve=1)
    runs = [asyncio.ensure_future(queue.run(c, jobs.job(f"{c}{i}"))) for i in (0, 1) for c in "ab"]
    await asyncio.sleep(0.05)
    runs += [asyncio.ensure_future(queue.run("v", jobs.job(f"v{i}"))) for i in (0, 1)]
    await asyncio.sleep(0.05)
    # Both workers took a flooder's job; the victim's first starts at once, on the reserve.
    assert jobs.started == ["a0", "b0", "v0"]
    for name in ("a0", "b0", "v0"):
        await jobs.finish(name)
    # The flooders' workers serve them in turn; the victim's second job starts as soon as its
    # first is done (on the reserve again), not after the flooders' queued ones.
    assert jobs.started == ["a0", "b0", "v0", "a1", "b1", "v1"]
    for name in ("a1", "b1", "v1"):
        await jobs.finish(name)
    await asyncio.gather(*runs)
    pool.shutdown()


@asynchronous
async def test_a_client_inside_its_quota_pushes_a_flooders_job_out(
    executor: ThreadPoolExecutor,
) -> None:
    gate = Gate()
    queue = ZkQueue(executor, limit=8, share=4, workers=1)
    floods = [
        asyncio.ensure_future(queue.run(client, gate.job(f"{client}{i}")))
        for client in ("a", "b")
        for i in range(4)
    ]
    await asyncio.sleep(0)
    assert queue.pending == 8
    with pytest.raises(RateLimited, match="this client"):
        await queue.run("a", gate.job("a-extra"))  # a holds its share
    victim = asyncio.ensure_future(queue.run("victim", gate.job("v")))
    await asyncio.sleep(0)
    gate.release(8)
    results = await asyncio.gather(*floods, return_exceptions=True)
    assert await victim == "v"  # never refused: it held nothing while a and b flooded
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert len(refused) == 1 and "made room" in str(refused[0])


@asynchronous
async def test_a_full_queue_refuses_a_client_that_would_hold_as_many_as_the_busiest(
    executor: ThreadPoolExecutor,
) -> None:
    """When the queue is full, a client whose job would make it hold as many jobs as the busiest
    client is refused; it does not push that client's job out, so two clients holding about the
    same never evict each other back and forth."""
    gate = Gate()
    queue = ZkQueue(executor, limit=3, share=10, workers=1, reserve=0)
    runs = [asyncio.ensure_future(queue.run("a", gate.job(f"a{i}"))) for i in range(2)]
    runs.append(asyncio.ensure_future(queue.run("b", gate.job("b0"))))
    await asyncio.sleep(0)
    assert queue.pending == 3
    runs.append(asyncio.ensure_future(queue.run("b", gate.job("b1"))))  # b would hold 2, as a
    await asyncio.sleep(0)
    held = (queue.held_by("a"), queue.held_by("b"))
    gate.release(3)
    results = await asyncio.gather(*runs, return_exceptions=True)
    assert held == (2, 1)  # a's waiting job is still there; b's new one is not
    assert results[:3] == ["a0", "a1", "b0"]
    assert isinstance(results[3], RateLimited)
    assert "too many ZooKeeper requests queued" in str(results[3])


@asynchronous
async def test_a_cancelled_waiting_job_never_runs(executor: ThreadPoolExecutor) -> None:
    gate = Gate()
    queue = ZkQueue(executor, limit=10, share=10, workers=1)
    first = asyncio.ensure_future(queue.run("a", gate.job("first")))
    second = asyncio.ensure_future(queue.run("a", gate.job("second")))
    await asyncio.sleep(0)
    second.cancel()
    gate.release(2)
    await first
    await asyncio.sleep(0.05)
    assert queue.pending == 0 and queue.held_by("a") == 0
    assert gate.order == ["first"]


class CountingCoordinator(MemoryCoordinator):
    """Counts every call a bump or roll makes to the store."""

    def __init__(self) -> None:
        super().__init__()
        self.lineage_reads = 0

    def read_lineage(self, pid: int) -> Any:
        self.lineage_reads += 1
        return super().read_lineage(pid)


@asynchronous
async def test_non_owners_of_this_servers_pids_never_reach_zookeeper(
    executor: ThreadPoolExecutor,
) -> None:
    store = CountingCoordinator()
    settings = LeaseServerSettings(block_size=10, lifetime_ms=60_000)
    service = LeaseService(store, executor, settings, rng=random.Random(3))
    lease = await service.lease()
    other = await service.lease()
    successor = await service.roll(other.pid, other.generation, other.secret)
    reads, block_reads = store.lineage_reads, store.block_reads
    wrong = bytearray(lease.secret)
    wrong[-1] ^= 1
    attempts = [
        (lease.pid, b""),  # no secret
        (lease.pid, bytes(wrong)),  # a forged one
        (lease.pid, successor.secret),  # another pid's real secret
        (lease.pid, b"\x00" * 28),  # block start 0
        (10**12, b"short"),  # not a secret at all, any pid
    ]
    for pid, secret in attempts:
        for op in (service.bump, service.roll):
            with pytest.raises(NotOwner):
                await op(pid, 0, secret)
    assert (store.lineage_reads, store.block_reads) == (reads, block_reads)
    assert service.zk.pending == 0
    # The owner and lineage authority still go through.
    assert (await service.bump(lease.pid, lease.generation, lease.secret)).pid == lease.pid
    bumped = await service.bump(successor.pid, successor.generation, other.secret)
    assert bumped.secret == successor.secret  # the successor's own secret comes back
