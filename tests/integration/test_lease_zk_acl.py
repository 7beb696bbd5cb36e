"""ZooKeeper digest ACLs (``--zk-auth-file``) and garbage collection past retention, on a real
ZooKeeper: only lease servers can read block salts or change any pidfence znode, and records
of pids past their retention are deleted (after which the pid is unknown to every server)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerThread,
    LeaseServiceUnavailable,
    NotOwner,
    ZkCoordinator,
)
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


def test_a_server_without_the_zookeeper_credentials_is_told_so(
    lease_server_factory: Callable[..., LeaseServerThread],
    lease_pki: LeasePki,
    zk_chroot: str,
    tmp_path: Path,
) -> None:
    """It was told "cannot reach ZooKeeper" (exit 3 either way): a wrong or missing
    ``--zk-auth-file`` now names itself."""
    lease_server_factory(zk_auth_file=lease_pki.zk_auth_file)  # /pidfence gets the servers' ACL
    wrong = tmp_path / "zk-auth"
    wrong.write_text("pidfence:not-the-password\n")
    os.chmod(wrong, 0o600)
    for auth in (None, wrong):
        with pytest.raises(LeaseServiceUnavailable, match="--zk-auth-file") as refused:
            LeaseServerThread(zk_chroot, zk_auth_file=auth).start()
        assert "NoAuthError" in str(refused.value)
        assert "cannot reach" not in str(refused.value)
    command = [sys.executable, "-m", "pidfence.cli", "lease-server", "--zk", zk_chroot]
    ran = subprocess.run(
        [*command, "--listen", ":0"], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 3, ran.stderr
    assert "--zk-auth-file" in ran.stderr and "Traceback" not in ran.stderr
