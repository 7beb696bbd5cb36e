"""Lease servers on a real ZooKeeper: unique pids and generations across servers and processes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pidfence.pid_allocator import (
    Lease,
    LeaseClient,
    LeaseServerThread,
    NotOwner,
    StaleGeneration,
)
from pidfence.pid_allocator.settings import MAX_RESERVE_BLOCKS
from pidfence.services import started_pids
from pidfence.services.lease_server import LeasePki, LeaseServerProcess, spawn_lease_server
from pidfence.services.process import ServiceFailed
from pidfence.wire import load_public_keys, verify_cert


def test_lease_bump_and_foreign_bump(
    lease_server: LeaseServerThread, lease_server_factory: Callable[..., LeaseServerThread]
) -> None:
    other = lease_server_factory()
    with LeaseClient(lease_server.address) as a, LeaseClient(other.address) as b:
        lease = a.lease([("t", 0)])
        # A server that did not issue the pid.
        bumped = b.bump(lease.pid, lease.generation, lease.secret)
        assert bumped.generation == lease.generation + 1
        assert bumped.expire_ms <= lease.expire_ms
        with pytest.raises(StaleGeneration):
            a.bump(lease.pid, lease.generation, lease.secret)
        again = a.bump(lease.pid, bumped.generation, lease.secret)
        assert again.generation == lease.generation + 2
        with pytest.raises(NotOwner):
            b.bump(lease.pid + 10**9, 0, lease.secret)


def test_zookeeper_writes_stay_per_block(
    lease_server_factory: Callable[..., LeaseServerThread],
) -> None:
    server = lease_server_factory(block_size=100)
    with LeaseClient(server.address) as client:
        pids = [client.lease().pid for _ in range(1000)]
    assert len(set(pids)) == 1000
    # 10 blocks, plus the reserve claimed ahead: it adapts to how long a claim took (half a
    # block up to MAX_RESERVE_BLOCKS), so this bound holds whatever the machine's speed.
    assert server.running.coordinator.writes <= 10 + MAX_RESERVE_BLOCKS


def _hammer(
    servers: list[str], clients: int, leases_each: int
) -> tuple[list[Lease], list[tuple[int, int]]]:
    """Concurrent clients lease pids, then all race to bump the same few pids everywhere."""
    leases: list[Lease] = []
    lock = threading.Lock()

    def lease_worker(i: int) -> None:
        order = servers[i % len(servers) :] + servers[: i % len(servers)]
        with LeaseClient(order, retries=20, backoff_s=0.05) as client:
            got = [client.lease() for _ in range(leases_each)]
        with lock:
            leases.extend(got)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lease_worker, range(clients)))

    granted: list[tuple[int, int]] = []
    targets = leases[:5]

    def bump_worker(i: int) -> None:
        order = servers[i % len(servers) :] + servers[: i % len(servers)]
        with LeaseClient(order, retries=20, backoff_s=0.05) as client:
            for target in targets:
                generation = target.generation
                for _ in range(3):
                    try:
                        new = client.bump(target.pid, generation, target.secret)
                    except StaleGeneration:
                        return
                    with lock:
                        granted.append((new.pid, new.generation))
                    generation = new.generation

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(bump_worker, range(clients)))
    return leases, granted


def _assert_unique(leases: list[Lease], granted: list[tuple[int, int]]) -> None:
    pids = [lease.pid for lease in leases]
    assert len(pids) == len(set(pids)), "a pid was issued twice"
    issued = {(lease.pid, lease.generation) for lease in leases}
    assert len(granted) == len(set(granted)), "two callers got the same (pid, generation)"
    assert not issued & set(granted)
    assert granted, "no bump succeeded"


@pytest.fixture
def two_processes(zk_chroot: str, tmp_path: Path) -> Iterator[list[LeaseServerProcess]]:
    handles: list[LeaseServerProcess] = []
    try:
        for i in range(2):
            handles.append(spawn_lease_server(zk_chroot, tmp_path, f"lease-{i}", block_size=10))
        yield handles
    finally:
        for handle in handles:
            handle.stop()


def test_two_server_processes_never_duplicate(two_processes: list[LeaseServerProcess]) -> None:
    leases, granted = _hammer([h.address for h in two_processes], clients=8, leases_each=100)
    _assert_unique(leases, granted)
    for handle in two_processes:
        handle.stop()
        assert handle.proc.exit_code() == 0  # SIGTERM is a clean shutdown
    assert not {h.pid for h in two_processes} & started_pids()


def test_a_server_that_dies_at_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    """``wait_until`` used to swallow the ServiceFailed of a dead process and wait 60 s."""
    bad_key = tmp_path / "no-such.key"
    with pytest.raises(ServiceFailed, match="exited with 2") as caught:
        spawn_lease_server("127.0.0.1:1", tmp_path, "dies", signing_key=bad_key, timeout=600)
    assert "no-such.key" in str(caught.value)


def test_three_servers_never_duplicate(
    lease_server_factory: Callable[..., LeaseServerThread],
) -> None:
    servers = [lease_server_factory(block_size=7) for _ in range(3)]
    leases, granted = _hammer([s.address for s in servers], clients=6, leases_each=100)
    _assert_unique(leases, granted)


def test_spawned_server_with_every_defence_on(
    zk_chroot: str, tmp_path: Path, lease_pki: LeasePki
) -> None:
    """The process the demo and compose run: tokens, TLS, ZooKeeper ACLs and signing; ready means
    a ping over TLS was answered."""
    handle = spawn_lease_server(
        zk_chroot,
        tmp_path,
        "secured",
        **lease_pki.server_options(),
        zk_auth_file=lease_pki.zk_auth_file,
        signing_key=lease_pki.signing_key,
    )
    try:
        with LeaseClient(handle.address, **lease_pki.client_options()) as client:
            lease = client.lease()
            successor = client.roll(lease.pid, lease.generation, lease.secret)
        keys = load_public_keys([lease_pki.public_key])
        assert verify_cert(successor.cert, keys, successor.pid, successor.generation, 0).ok
    finally:
        handle.stop()
    assert handle.proc.exit_code() == 0
