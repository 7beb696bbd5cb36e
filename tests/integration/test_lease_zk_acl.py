"""ZooKeeper digest ACLs (``--zk-auth-file``) and garbage collection past retention, on a real
ZooKeeper: only lease servers can read block salts or change any pidfence znode, and records
of pids past their retention are deleted (after which the pid is unknown to every server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from pidfence.pid_allocator import LeaseClient, LeaseServerThread, NotOwner, ZkCoordinator
from pidfence.pid_allocator.capability import block_hint
from pidfence.pid_allocator.security import load_zk_auth
from pidfence.services.lease_server import LeasePki

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def outsider(zk_chroot: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_chroot)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def test_unauthenticated_client_cannot_change_or_read_pidfence_znodes(
    lease_server_factory: Callable[..., LeaseServerThread],
    lease_pki: LeasePki,
    outsider: KazooClient,
) -> None:
    server = lease_server_factory(zk_auth_file=lease_pki.zk_auth_file)
    with LeaseClient(server.address) as client:
        lease = client.lease()
        client.bump(lease.pid, lease.generation, lease.secret)
    start = block_hint(lease.secret)
    generation_znode = f"/pidfence/generations/{lease.pid}"
    for path in ("/pidfence/pid_block", generation_znode):
        with pytest.raises(NoAuthError):
            outsider.set(path, b"\x81\xa4next\x01")
        with pytest.raises(NoAuthError):
            outsider.delete(path)
    with pytest.raises(NoAuthError):
        outsider.get(f"/pidfence/blocks/{start:019d}")  # the salt that keys every secret
    with pytest.raises(NoAuthError):
        outsider.create("/pidfence/generations/999999", b"")
    with LeaseClient(server.address) as client:  # the server itself still works
        assert client.lease().pid > lease.pid


def test_records_past_retention_are_collected(
    lease_server_factory: Callable[..., LeaseServerThread], lease_pki: LeasePki, zk_chroot: str
) -> None:
    server = lease_server_factory(
        zk_auth_file=lease_pki.zk_auth_file, lifetime_ms=60_000, retention_ms=60_000
    )
    with LeaseClient(server.address) as client:
        lease = client.lease()
        bumped = client.bump(lease.pid, lease.generation, lease.secret)
        successor = client.roll(lease.pid, bumped.generation, lease.secret)
    janitor = ZkCoordinator(zk_chroot, auth=load_zk_auth(lease_pki.zk_auth_file)).start()
    try:
        now = server.running.service.clock()
        assert janitor.collect_garbage(now, 60_000) == 0  # everything is live or retained
        assert janitor.read_lineage(lease.pid) is not None
        later = successor.expire_ms + 60_000 + 10 * 60_000 + 1
        deleted = janitor.collect_garbage(later, 60_000)
        assert deleted >= 3  # the block record and both lineage records
        assert janitor.read_lineage(lease.pid) is None
        assert janitor.read_lineage(successor.pid) is None
        start = block_hint(lease.secret)
        assert start is not None and janitor.block_at(start) is None
    finally:
        janitor.close()
    other = _fresh_server(lease_server_factory, lease_pki)
    with LeaseClient(other.address) as client, pytest.raises(NotOwner):
        client.bump(successor.pid, successor.generation, successor.secret)


def _fresh_server(factory: Callable[..., LeaseServerThread], pki: LeasePki) -> Any:
    """A server with a cold block cache: it must read ZooKeeper to judge a pid."""
    return factory(zk_auth_file=pki.zk_auth_file)
