"""Lease servers while ZooKeeper is paused (SIGSTOP) or loses a node (SIGKILL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pidfence.pid_allocator import (
    Lease,
    LeaseClient,
    LeaseServerThread,
    LeaseServiceUnavailable,
    ZkCoordinator,
)
from pidfence.services import new_chroot
from tests.integration.test_lease_servers import _assert_unique, _hammer


def _chroot(hosts: str) -> str:
    return new_chroot(hosts, "/pidfence-test/lease")


def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _coordinator(server: LeaseServerThread) -> ZkCoordinator:
    coordinator = server.running.coordinator
    assert isinstance(coordinator, ZkCoordinator)
    return coordinator


def test_paused_zookeeper_leases_from_claimed_block_and_refuses_bumps(
    zk_ensemble3: Any, lease_server_factory: Callable[..., LeaseServerThread]
) -> None:
    server = lease_server_factory(
        zk_hosts=_chroot(zk_ensemble3.hosts), block_size=50, zk_session_timeout_s=4.0
    )
    zk = _coordinator(server)
    with LeaseClient(server.address, retries=0, request_timeout_s=30) as client:
        first = client.lease()
        for i in range(3):
            zk_ensemble3.pause(i)
        try:
            _wait_for(lambda: not zk.connected, "the server to see ZooKeeper SUSPENDED")
            during = [client.lease() for _ in range(20)]  # from the block claimed before
            with pytest.raises(LeaseServiceUnavailable):
                client.bump(first.pid, first.generation, first.secret)
        finally:
            for i in range(3):
                zk_ensemble3.resume(i)
        _wait_for(lambda: zk.connected, "the server to reconnect to ZooKeeper")
    with LeaseClient(server.address, retries=20, backoff_s=0.1) as client:
        bumped = client.bump(first.pid, first.generation, first.secret)
        assert bumped.generation == first.generation + 1
        after = [client.lease() for _ in range(60)]  # needs a new block: claimed after reconnect
    pids = [lease.pid for lease in [first, *during, *after]]
    assert len(pids) == len(set(pids))


def test_three_servers_survive_a_killed_zookeeper_node(
    zk_ensemble3: Any, lease_server_factory: Callable[..., LeaseServerThread]
) -> None:
    chroot = _chroot(zk_ensemble3.hosts)
    servers = [
        lease_server_factory(zk_hosts=chroot, block_size=5, zk_session_timeout_s=6.0)
        for _ in range(3)
    ]
    result: dict[str, tuple[list[Lease], list[tuple[int, int]]]] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result["out"] = _hammer([s.address for s in servers], clients=6, leases_each=150)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        _wait_for(
            lambda: sum(_coordinator(s).writes for s in servers) >= 10 or not worker.is_alive(),
            "leases to be under way",
        )
        zk_ensemble3.kill(0)
        worker.join(300)
    finally:
        worker.join(300)
        zk_ensemble3.restart(0)
    assert not failure, f"clients failed: {failure[0]!r}"
    leases, granted = result["out"]
    assert len(leases) == 6 * 150
    _assert_unique(leases, granted)
