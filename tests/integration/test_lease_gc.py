"""Garbage collection never resurrects a pid, on real ZooKeeper and real ``pidfence lease-server``
processes (issue 40, point 2; DESIGN.md §5 amended, round 4).

Two servers with lifetime 2 s, retention 2 s, block TTL 6 s and a collection every second. Pid P
is rolled into S, pid X bumped twice, pid Y never. A zombie then asks, on both servers, at each
instant that matters: past the leases' end plus retention (where the old collector deleted the
records while the block still answered, and granted P a second successor), then once the records
are really gone, then after another collection. Every request is refused, X's record never moves
back, and no lease afterwards reuses a pid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from pidfence.pid_allocator import (
    Lease,
    LeaseClient,
    NotOwner,
    StaleGeneration,
    UnknownPid,
    ZkCoordinator,
)
from pidfence.pid_allocator.capability import block_hint
from pidfence.services.lease_server import LeaseServerProcess

pytestmark = pytest.mark.timeout(180)

LIFETIME_MS, RETENTION_MS, BLOCK_TTL_MS, GC_INTERVAL_S = 2000, 2000, 6000, 1.0


@pytest.fixture
def records(zk_chroot: str) -> Iterator[ZkCoordinator]:
    """A reader of the servers' ZooKeeper state."""
    reader = ZkCoordinator(zk_chroot).start()
    yield reader
    reader.close()


def sleep_until(epoch_ms: int) -> None:
    time.sleep(max(0.0, epoch_ms / 1000 - time.time()))


def refused(clients: list[LeaseClient], *views: Lease, holder: Lease | None = None) -> None:
    """Roll and bump each (pid, generation) through every server; nothing may be granted."""
    for view in views:
        secret = (holder or view).secret
        for client in clients:
            for call in (client.roll, client.bump):
                try:
                    granted = call(view.pid, view.generation, secret)
                except (NotOwner, UnknownPid, StaleGeneration):
                    continue
                pytest.fail(f"{call.__name__} of {view.pid} at {view.generation}: {granted}")


def test_collected_lineage_is_never_granted_again(
    lease_process_factory: Callable[..., LeaseServerProcess], records: ZkCoordinator
) -> None:
    settings = {
        "lifetime_ms": LIFETIME_MS,
        "retention_ms": RETENTION_MS,
        "block_ttl_ms": BLOCK_TTL_MS,
        "gc_interval_s": GC_INTERVAL_S,
        "block_size": 10,
    }
    servers = [lease_process_factory(f"lease-{i}", **settings) for i in range(2)]
    with (
        LeaseClient(servers[0].address, retries=3) as a,
        LeaseClient(servers[1].address, retries=3) as b,
    ):
        both = [a, b]
        p, x0, y = a.lease(), a.lease(), a.lease()
        s = b.roll(p.pid, p.generation, p.secret)
        x1 = b.bump(x0.pid, x0.generation, x0.secret)
        x2 = a.bump(x0.pid, x1.generation, x0.secret)
        zombies, current = (p, x0, x1), (x2, s, y)  # Y: never bumped

        def ask() -> None:
            refused(both, *zombies, *current)
            refused(both, s, holder=p)  # lineage authority: P's secret on S
            found = records.read_lineage(x0.pid)
            assert found is None or found[0].generation == x2.generation, found

        refused(both, *zombies)
        # One collection past where the old collector deleted the records (lease end +
        # retention), well inside the block's retention.
        sleep_until(max(p.expire_ms, x2.expire_ms, s.expire_ms, y.expire_ms) + RETENTION_MS + 1500)
        ask()
        # Wait until a collector really deleted the block and every record of its pids.
        start = block_hint(p.secret)
        assert start is not None
        block = records.block_at(start)
        assert block is not None
        sleep_until(block.last_expiry_ms + RETENTION_MS + int(GC_INTERVAL_S * 1000))
        deadline = time.monotonic() + 30
        pids = (p.pid, x0.pid, s.pid)
        while any(records.read_lineage(pid) is not None for pid in pids):
            assert time.monotonic() < deadline, "the collectors never deleted the records"
            time.sleep(0.2)
        ask()
        time.sleep(2 * GC_INTERVAL_S)  # another collection on each server
        ask()
        fresh = [client.lease() for client in both for _ in range(15)]
        rolled = b.roll(fresh[0].pid, fresh[0].generation, fresh[0].secret)
    issued = [lease.pid for lease in (p, x0, y, s, *fresh, rolled)]
    assert len(set(issued)) == len(issued), "a pid was handed out twice"
