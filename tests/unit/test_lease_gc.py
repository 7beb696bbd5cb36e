"""Garbage collection never resurrects a pid (DESIGN.md §5 amended, round 4; issue 40, point 2).

The issue's timeline on a fake clock: lifetime 2 s, retention 2 s, block TTL 2 min. Pid P is
rolled into a successor S, pid X is bumped twice, pid Y never; then time moves to each instant
that matters (the leases' end plus retention, where the old collector deleted their records; the
block's last expiry plus retention, where its pids are refused without a record) with
collections there, and each time the zombies ask again: P's roll and bump from its old
generation, X's from each generation it had, S's, X's and Y's from their current ones once those
are past retention. Each is refused (``NOT_OWNER``; ``STALE_GENERATION`` or ``UNKNOWN_PID``
while a record still says why), X's record never moves back, and no later lease or roll reuses a
pid. The same timeline runs on the in-memory coordinator and on ``ZkCoordinator`` over the fake
ZooKeeper.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from pidfence.pid_allocator import Grant, LeaseService, MemoryCoordinator, ZkCoordinator, errors
from pidfence.pid_allocator.capability import block_hint, make_secret
from pidfence.pid_allocator.coordinator import BlockRequest
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.lineage import Change, Lineage, Outcome
from tests.unit.lease_kit import FakeKazoo, LeaseServers, asynchronous

LIFETIME_MS, RETENTION_MS, BLOCK_TTL_MS, GC_INTERVAL_S = 2000, 2000, 120_000, 1.0
SETTINGS = {
    "lifetime_ms": LIFETIME_MS,
    "retention_ms": RETENTION_MS,
    "block_ttl_ms": BLOCK_TTL_MS,
    "gc_interval_s": GC_INTERVAL_S,
}
REFUSED = (errors.NotOwner, errors.UnknownPid, errors.StaleGeneration)


def store_of(kind: str) -> MemoryCoordinator | ZkCoordinator:
    """The in-memory coordinator, or ``ZkCoordinator`` on the fake ZooKeeper."""
    if kind == "memory":
        return MemoryCoordinator()
    return ZkCoordinator("fake:2181", client=FakeKazoo(), op_timeout_s=0.1).start()


async def refused(servers: list[LeaseService], *views: Grant, holder: Grant | None = None) -> int:
    """Roll and bump each view (pid, generation) on every server with ``holder``'s secret (the
    view's own by default); fail on any grant. Returns how many were refused."""
    count = 0
    for view in views:
        secret = (holder or view).secret
        for server in servers:
            for call in (server.roll, server.bump):
                try:
                    granted = await call(view.pid, view.generation, secret)
                except REFUSED:
                    count += 1
                    continue
                pytest.fail(f"{call.__name__} of {view.pid} at {view.generation}: {granted}")
    return count


@pytest.mark.parametrize("kind", ["memory", "zookeeper"])
@asynchronous
async def test_collected_lineage_is_never_granted_again(
    executor: ThreadPoolExecutor, kind: str
) -> None:
    servers = LeaseServers(executor, store_of(kind))
    a, b = servers.service(**SETTINGS), servers.service(**SETTINGS)
    both, clock, store = [a, b], servers.clock, servers.store
    p, x0, y = await a.lease(), await a.lease(), await a.lease()
    s = await b.roll(p.pid, p.generation, p.secret)
    x1 = await b.bump(x0.pid, x0.generation, x0.secret)
    x2 = await a.bump(x0.pid, x1.generation, x0.secret)
    zombies = (p, x0, x1)  # old generations: refused from the start
    current = (x2, s, y)  # refused once past their retention (Y was never bumped)

    def x_never_went_back() -> None:
        found = store.read_lineage(x0.pid)
        assert found is None or found[0].generation == x2.generation, found

    async def collect_and_ask() -> int:
        deleted = 0
        for server in both:  # two passes, on both servers
            deleted += await server.collect_garbage()
            await refused(both, *zombies, *current)
            await refused(both, s, holder=p)  # lineage authority: P's secret on S
            x_never_went_back()
        return deleted

    assert await refused(both, *zombies) == 12  # live: stale
    # The old collector deleted P's and X's records here (lease end + retention), well inside
    # the block's retention; then a zombie's roll of P was granted a second successor and X's
    # record went back to its first generation. Now the records stay, and refuse.
    clock.now = max(p.expire_ms, x2.expire_ms, s.expire_ms, y.expire_ms) + RETENTION_MS
    await collect_and_ask()
    for pid in (p.pid, x0.pid, s.pid):
        assert store.read_lineage(pid) is not None, f"pid {pid}: collected while its block answers"
    # Past the block's last expiry plus retention: the block and its pids' records go, and
    # every request is still refused.
    start = block_hint(p.secret)
    assert start is not None
    block = store.block_at(start)
    assert block is not None
    clock.now = block.last_expiry_ms + RETENTION_MS
    assert await collect_and_ask() >= 4  # the block and three lineage records
    for pid in (p.pid, x0.pid, s.pid):
        assert store.read_lineage(pid) is None, f"pid {pid}: record outlived its block"
    assert store.block_at(start) is None
    # No later lease, or roll, reuses a pid.
    fresh = [await a.lease() for _ in range(15)] + [await b.lease() for _ in range(15)]
    rolled = await b.roll(fresh[0].pid, fresh[0].generation, fresh[0].secret)
    pids = [g.pid for g in (p, x0, s, *fresh, rolled)]
    assert len(set(pids)) == len(pids)


@pytest.mark.parametrize("kind", ["memory", "zookeeper"])
def test_a_write_decided_before_collection_never_lands_after_it(kind: str) -> None:
    """A server paused between its read and its write (or whose clock lags) decides on a pid
    whose block is then collected: the write must not recreate the record. The paused server
    still holds the block record in its cache; the create's check of the block refuses it."""
    store = store_of(kind)
    paused = store if kind == "memory" else ZkCoordinator("fake:2181", client=store._zk).start()
    block = store.claim_block(BlockRequest(10, "a", "t", 0, LIFETIME_MS, 1000, b"s" * 16))
    pid, g0 = block.start, initial_generation(block.salt, block.start)
    secret = make_secret(block.start, block.salt, pid, 0)
    live, late = Lineage(store, RETENTION_MS), Lineage(paused, RETENTION_MS)
    assert live.bump(Change(pid, g0, secret, "first", 10)).generation == g0 + 1
    assert paused.block_at(block.start) == block  # read before the pause, and cached
    forgotten = block.forgotten_at(RETENTION_MS)
    assert store.collect_garbage(forgotten, RETENTION_MS) == 2  # the block, then the record
    # Its requests arrived (and were judged) before: a bump inside the lease, a roll inside the
    # block's retention.
    with pytest.raises(errors.NotOwner):
        late.bump(Change(pid, g0, secret, "zombie", 10))
    with pytest.raises(errors.NotOwner):
        late.roll(
            Change(pid, g0, secret, "zombie", forgotten - 1),
            Outcome(pid + 1, 0, forgotten + LIFETIME_MS, block, secret),
        )
    assert store.read_lineage(pid) is None
