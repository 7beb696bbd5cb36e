"""Answers given without a write are read after a ZooKeeper ``sync``.

A lease server reads from the ZooKeeper server its session is on, which may lag a write another
lease server made through the leader. A write cannot be fooled by that (its compare-and-set fails
on a stale version), but a refusal or a ``describe`` would be given on the stale view. Here each
lease server's ZooKeeper server is a :class:`Follower` of one fake ZooKeeper: its reads lag until
it is synced, and it records its reads and syncs in order.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kazoo.exceptions import NoNodeError

from pidfence.pid_allocator import (
    LeaseServerSettings,
    LeaseService,
    NotOwner,
    StaleGeneration,
    ZkCoordinator,
)
from pidfence.pid_allocator.capability import make_secret
from pidfence.pid_allocator.coordinator import BlockRequest
from pidfence.pid_allocator.generations import initial_generation
from pidfence.pid_allocator.lineage import Change, Lineage, Outcome
from pidfence.wire import PidState
from tests.unit.lease_kit import Done, FakeKazoo, Stat

SALT = b"s" * 16
NOW = 1000
PID, SUCCESSOR = 5, 7
LINEAGE = f"/pidfence/generations/{PID}"


class Follower:
    """One lease server's ZooKeeper server: reads come from a copy of ``leader``'s znodes made
    at construction, at each ``sync_async`` and, as in ZooKeeper (a session sees its own writes,
    failed ones too, after everything the leader ordered before them), after each write; writes
    go to the leader.

    Attributes:
        calls: ``"sync"`` and ``"get PATH"``, in the order they were made.
    """

    def __init__(self, leader: FakeKazoo) -> None:
        self.leader = leader
        self.view = dict(leader.nodes)
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leader, name)

    def sync_async(self, path: str) -> Done:
        self.calls.append("sync")
        self.view = dict(self.leader.nodes)
        return Done(path)

    def _caught_up(self, result: Done) -> Done:
        self.view = dict(self.leader.nodes)
        return result

    def set_async(self, path: str, value: bytes, version: int = -1) -> Done:
        return self._caught_up(self.leader.set_async(path, value, version))

    def transaction(self) -> Any:
        txn = self.leader.transaction()
        commit = txn.commit_async
        txn.commit_async = lambda: self._caught_up(commit())  # type: ignore[method-assign]
        return txn

    def get_async(self, path: str) -> Done:
        self.calls.append(f"get {path}")
        if path not in self.view:
            return Done(error=NoNodeError())
        data, version = self.view[path]
        return Done((data, Stat(version)))


def _cluster() -> tuple[Lineage, Lineage, Follower, bytes, int]:
    """Server B on the leader, with pid 5 bumped once through it, and server A on a follower
    that has seen that much: (B, A, A's follower, pid 5's secret, its generation now)."""
    leader = FakeKazoo()
    b = ZkCoordinator("fake:2181", client=leader, op_timeout_s=0.1).start()
    b.claim_block(BlockRequest(10, "server-b", "claim", NOW, 10_000, 500, SALT))  # pids 1..10
    secret, g0 = make_secret(1, SALT, PID, 0), initial_generation(SALT, PID)
    on_b = Lineage(b, retention_ms=10_000)
    on_b.bump(Change(PID, g0, secret, "first", NOW))
    follower = Follower(leader)
    a = ZkCoordinator("fake:2181", client=follower, op_timeout_s=0.1).start()
    return on_b, Lineage(a, retention_ms=10_000), follower, secret, g0 + 1


def _synced_before_last_read(follower: Follower, path: str) -> bool:
    calls = follower.calls
    last_read = max(i for i, call in enumerate(calls) if call == f"get {path}")
    return "sync" in calls[:last_read]


def test_a_bump_is_not_refused_on_a_lagging_view() -> None:
    on_b, on_a, follower, secret, g1 = _cluster()
    on_b.bump(Change(PID, g1, secret, "second", NOW))  # A's ZooKeeper server has not seen it
    follower.calls.clear()
    # The owner got g1 + 1 from B and bumps through A: A's view still says g1.
    bumped = on_a.bump(Change(PID, g1 + 1, secret, "third", NOW))
    assert bumped.generation == g1 + 2
    assert _synced_before_last_read(follower, LINEAGE)


def test_a_refusal_is_final_only_after_a_sync() -> None:
    on_b, on_a, follower, secret, g1 = _cluster()
    on_b.bump(Change(PID, g1, secret, "second", NOW))
    follower.calls.clear()
    with pytest.raises(StaleGeneration, match="not at generation"):
        on_a.bump(Change(PID, g1, secret, "zombie", NOW))  # really stale: refused, after a sync
    assert _synced_before_last_read(follower, LINEAGE)


def test_the_predecessors_secret_is_judged_on_a_synced_view() -> None:
    """A roll made through B: A's lagging view has no record of the successor, so the
    predecessor's secret would be NOT_OWNER there."""
    on_b, on_a, follower, secret, g1 = _cluster()
    block = on_b.store.block_at(1)
    assert block is not None
    g_s = initial_generation(SALT, SUCCESSOR)
    successor = Outcome(SUCCESSOR, g_s, 9000, block, make_secret(1, SALT, SUCCESSOR, 0))
    assert on_b.roll(Change(PID, g1, secret, "roll", NOW), successor) == successor
    follower.calls.clear()
    bumped = on_a.bump(Change(SUCCESSOR, g_s, secret, "by-predecessor", NOW))
    assert bumped.generation == g_s + 1
    assert _synced_before_last_read(follower, f"/pidfence/generations/{SUCCESSOR}")
    # And a retried roll with the same token, through A, learns the successor that landed.
    assert on_a.check_roll(Change(PID, g1, secret, "roll", NOW)) is not None
    with pytest.raises(NotOwner):
        on_a.bump(Change(SUCCESSOR, g_s + 1, b"\x00" * 28, "forged", NOW))


def test_describe_reads_after_a_sync() -> None:
    on_b, on_a, follower, secret, g1 = _cluster()
    on_b.bump(Change(PID, g1, secret, "second", NOW))
    follower.calls.clear()
    settings = LeaseServerSettings(block_size=10, lifetime_ms=10_000, retention_ms=10_000)

    async def describe() -> Any:
        with ThreadPoolExecutor(2) as pool:
            service = LeaseService(on_a.store, pool, settings, clock=lambda: NOW)
            return await service.describe(PID)

    status = asyncio.run(describe())
    assert (status.state, status.generation) == (PidState.LIVE, g1 + 1)
    assert follower.calls[:2] == ["sync", f"get {LINEAGE}"]
