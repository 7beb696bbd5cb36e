"""``LeaseClient`` against an in-process server on the in-memory coordinator."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerThread,
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    MemoryCoordinator,
    NotOwner,
    SecretFileError,
    StaleGeneration,
    lease_client_options,
)
from pidfence.pid_allocator.capability import SECRET_BYTES
from pidfence.pid_allocator.client import parse_servers
from pidfence.services.ports import free_port


@pytest.fixture
def store() -> MemoryCoordinator:
    return MemoryCoordinator()


@pytest.fixture
def server(store: MemoryCoordinator) -> Iterator[LeaseServerThread]:
    with LeaseServerThread(None, block_size=10, coordinator=store) as running:
        yield running


def test_lease_bump_ping_round_trip(server: LeaseServerThread) -> None:
    with LeaseClient(server.address) as client:
        lease = client.lease([("orders", 0), ("orders", 1)])
        assert lease.pid >= 1
        assert lease.sequence == 0
        assert len(lease.secret) == SECRET_BYTES
        assert "secret" not in repr(lease)
        bumped = client.bump(lease.pid, lease.generation, lease.secret)
        assert (bumped.pid, bumped.generation) == (lease.pid, lease.generation + 1)
        assert bumped.secret == lease.secret
        info = client.ping()
        assert info["server"].startswith("lease-")
        assert isinstance(info["now_ms"], int)


def test_error_replies_raise_their_classes(server: LeaseServerThread) -> None:
    sleeps: list[float] = []
    with LeaseClient(server.address, sleep=sleeps.append) as client:
        lease = client.lease()
        client.bump(lease.pid, lease.generation, lease.secret)
        with pytest.raises(StaleGeneration) as stale:
            client.bump(lease.pid, lease.generation, lease.secret)
        assert stale.value.code == "STALE_GENERATION"
        assert stale.value.successor is None
        assert not stale.value.retriable
        with pytest.raises(NotOwner):
            client.bump(10**12, 0, lease.secret)
    assert sleeps == []  # non-retriable errors are not retried


def test_fails_over_from_a_dead_server(server: LeaseServerThread) -> None:
    dead = f"127.0.0.1:{free_port()}"
    sleeps: list[float] = []
    with LeaseClient([dead, server.address], sleep=sleeps.append, backoff_s=0.01) as client:
        assert client.lease().pid >= 1
    assert sleeps == [0.01]


def test_unreachable_after_retries_names_the_servers() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    sleeps: list[float] = []
    client = LeaseClient(",".join(dead), retries=3, backoff_s=0.1, sleep=sleeps.append)
    with pytest.raises(LeaseServerUnreachable) as caught:
        client.lease()
    assert caught.value.retriable
    message = str(caught.value)
    assert all(d in message for d in dead)
    assert "pidfence lease-server" in message
    assert sleeps == [0.1, 0.2, 0.4]


def test_unavailable_is_retried_then_raised(
    server: LeaseServerThread, store: MemoryCoordinator
) -> None:
    sleeps: list[float] = []
    with LeaseClient(server.address, retries=2, sleep=sleeps.append) as client:
        lease = client.lease()
        store.up = False
        with pytest.raises(LeaseServiceUnavailable) as caught:
            client.bump(lease.pid, lease.generation, lease.secret)
        assert caught.value.retriable
        assert len(sleeps) == 2
        store.up = True
        bumped = client.bump(lease.pid, lease.generation, lease.secret)
        assert bumped.generation == lease.generation + 1


@pytest.mark.parametrize("servers", ["", "localhost", "h:notaport", "h:0", ":80", "[]:80", []])
def test_bad_server_lists_are_refused(servers: str | list[str]) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        LeaseClient(servers)


def test_a_server_list_takes_hosts_as_the_server_listens_on_them() -> None:
    """An IPv6 host in brackets, as ``lease-server --listen [::1]:7070`` takes it."""
    assert parse_servers("[::1]:7070, lease-a:7071,10.0.0.5:7072") == [
        ("::1", 7070),
        ("lease-a", 7071),
        ("10.0.0.5", 7072),
    ]


def test_client_options_from_files_and_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    value = "token-123456-abcdef"
    token_file.write_text(f"{value}\n")
    token_file.chmod(0o600)
    assert lease_client_options(token_file, env={})["token"] == value
    env = {"PIDFENCE_LEASE_TOKEN_FILE": str(token_file)}
    assert lease_client_options(env=env)["token"] == value
    assert lease_client_options(env={"PIDFENCE_LEASE_TOKEN": "abc"}) == {
        "token": "abc",
        "tls": None,
    }
    token_file.chmod(0o644)
    with pytest.raises(SecretFileError, match="chmod 600"):
        lease_client_options(token_file, env={})


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ``::1``."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_a_client_reaches_a_server_listening_on_ipv6_by_its_address() -> None:
    with (
        LeaseServerThread(None, coordinator=MemoryCoordinator(), host="::1", port=0) as server,
        LeaseClient(server.address) as client,
    ):
        assert server.address.startswith("[::1]:")
        assert client.lease().pid > 0
