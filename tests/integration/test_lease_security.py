"""Issue 12 acceptance, spoken in the raw protocol against a real ZooKeeper: authentication,
owner-only bumps and rolls that reveal nothing, liveness under a flood, TLS, signing, and the
per-address connection cap."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pidfence.pid_allocator import (
    LeaseClient,
    LeaseServerThread,
    LeaseServerUnreachable,
    LeaseTlsMismatch,
    NotOwner,
    Unauthenticated,
    client_tls_context,
    load_token_file,
)
from pidfence.pid_allocator.capability import SECRET_BYTES
from pidfence.pid_allocator.protocol import LENGTH, encode_frame
from pidfence.services.lease_server import LeasePki, make_lease_pki
from pidfence.wire import load_public_keys, verify_cert
from tests.fixtures.lease_clients import RawLease

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def secured(
    lease_server_factory: Callable[..., LeaseServerThread], lease_pki: LeasePki
) -> LeaseServerThread:
    return lease_server_factory(
        auth_tokens_file=lease_pki.tokens_file, signing_key=lease_pki.signing_key
    )


def _token(pki: LeasePki, name: str) -> str:
    return load_token_file(pki.token_files[name])


@pytest.fixture
def raw(secured: LeaseServerThread) -> Iterator[Callable[[], RawLease]]:
    opened: list[RawLease] = []

    def make() -> RawLease:
        conn = RawLease(secured.address)
        opened.append(conn)
        return conn

    yield make
    for conn in opened:
        conn.close()


# -- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first", [("lease", {}), ("bump", {"pid": 1, "generation": 1, "secret": b"x" * 24})]
)
def test_no_hello_is_unauthenticated_and_closed(
    raw: Callable[[], RawLease], first: tuple[str, dict[str, Any]]
) -> None:
    conn = raw()
    reply = conn.call(first[0], **first[1])
    assert reply["error"] == "UNAUTHENTICATED"
    assert conn.closed_by_server()


def test_wrong_token_is_unauthenticated_and_closed(raw: Callable[[], RawLease]) -> None:
    conn = raw()
    reply = conn.call("hello", token="not-a-listed-token-at-all")  # noqa: S106
    assert reply["error"] == "UNAUTHENTICATED"
    assert conn.closed_by_server()


def test_malformed_frame_before_hello_is_unauthenticated(raw: Callable[[], RawLease]) -> None:
    conn = raw()
    body = b"\xc1"
    conn.sock.sendall(LENGTH.pack(len(body)) + body)
    reply = conn.recv()
    assert reply is not None and reply["error"] == "UNAUTHENTICATED"
    assert conn.closed_by_server()


def test_ping_before_hello_says_only_the_time(
    raw: Callable[[], RawLease], lease_pki: LeasePki
) -> None:
    conn = raw()
    reply = conn.call("ping")
    assert set(reply) == {"v", "id", "error", "now_ms"}
    assert reply["error"] is None
    hello = conn.call("hello", token=_token(lease_pki, "producer"))
    assert hello["error"] is None and hello["client"] == "producer"
    lease = conn.call("lease")
    assert lease["error"] is None and len(lease["secret"]) == SECRET_BYTES
    full = conn.call("ping")
    assert "server" in full and "zookeeper" in full


def test_client_with_token_and_without(secured: LeaseServerThread, lease_pki: LeasePki) -> None:
    with LeaseClient(secured.address, token=_token(lease_pki, "producer")) as client:
        assert client.lease().pid >= 1
    wrong = "wrong-token-wrong-token"
    with LeaseClient(secured.address, token=wrong) as client, pytest.raises(Unauthenticated):
        client.lease()
    with LeaseClient(secured.address) as client, pytest.raises(Unauthenticated):
        client.lease()


# -- owner only -----------------------------------------------------------------------------


def test_another_client_cannot_bump_or_roll_and_learns_nothing(
    raw: Callable[[], RawLease], lease_pki: LeasePki
) -> None:
    owner, attacker = raw(), raw()
    owner.call("hello", token=_token(lease_pki, "producer"))
    attacker.call("hello", token=_token(lease_pki, "other"))
    lease = owner.call("lease")
    bumped = owner.call(
        "bump", pid=lease["pid"], generation=lease["generation"], secret=lease["secret"]
    )
    assert bumped["error"] is None
    mine = attacker.call("lease")  # the attacker's own pid and secret
    wrong = bytearray(lease["secret"])
    wrong[-1] ^= 0xFF
    attempts: list[dict[str, Any]] = [
        {"pid": lease["pid"], "generation": bumped["generation"]},  # no secret
        {"pid": lease["pid"], "generation": bumped["generation"], "secret": bytes(wrong)},
        {"pid": lease["pid"], "generation": bumped["generation"], "secret": mine["secret"]},
        {"pid": lease["pid"], "generation": 0, "secret": mine["secret"]},
        {"pid": mine["pid"] + 1, "generation": 0, "secret": mine["secret"]},  # not issued
        {"pid": 10**15, "generation": 5, "secret": mine["secret"]},  # never claimed
        {"pid": 10**15, "generation": 5, "secret": b"\x00" * 24},
    ]
    replies = []
    for fields in attempts:
        for op in ("bump", "roll"):
            reply = attacker.call(op, **fields)
            replies.append({k: v for k, v in reply.items() if k != "id"})
    assert all(r["error"] == "NOT_OWNER" for r in replies), replies
    assert len({repr(sorted(r.items())) for r in replies}) == 1, "replies differ"
    assert not any(ch.isdigit() for ch in replies[0]["message"])
    assert set(replies[0]) == {"v", "error", "message"}
    # Nothing changed: the owner still bumps from its generation.
    again = owner.call(
        "bump", pid=lease["pid"], generation=bumped["generation"], secret=lease["secret"]
    )
    assert again["error"] is None and again["generation"] == bumped["generation"] + 1


def test_roll_is_owner_only_and_once(secured: LeaseServerThread, lease_pki: LeasePki) -> None:
    with LeaseClient(secured.address, token=_token(lease_pki, "producer")) as owner:
        lease = owner.lease()
        other = LeaseClient(secured.address, token=_token(lease_pki, "other"))
        with other, pytest.raises(NotOwner):
            other.roll(lease.pid, lease.generation, b"")
        successor = owner.roll(lease.pid, lease.generation, lease.secret)
        assert successor.pid != lease.pid
        from pidfence.pid_allocator import StaleGeneration

        with pytest.raises(StaleGeneration) as stale:
            owner.roll(lease.pid, lease.generation, lease.secret)
        assert stale.value.successor == successor.pid


# -- signing ----------------------------------------------------------------------------------


def test_every_grant_carries_a_valid_cert(secured: LeaseServerThread, lease_pki: LeasePki) -> None:
    keys = load_public_keys([lease_pki.public_key])
    with LeaseClient(secured.address, token=_token(lease_pki, "producer")) as client:
        lease = client.lease()
        bumped = client.bump(lease.pid, lease.generation, lease.secret)
        rolled = client.roll(bumped.pid, bumped.generation, lease.secret)
        now = int(time.time() * 1000)
        for grant in (lease, bumped, rolled):
            check = verify_cert(grant.cert, keys, grant.pid, grant.generation, now)
            assert check.ok, check
            assert check.expire_ms == grant.expire_ms
        assert verify_cert(lease.cert, keys, lease.pid, lease.generation + 1, now).reason == (
            "other_identity"
        )


# -- liveness ---------------------------------------------------------------------------------


def _answered(server: LeaseServerThread, op: str) -> float:
    registry = server.metrics.registry
    if op == "lease":
        return registry.get_sample_value("pidfence_leases_total") or 0.0
    labels = {"code": "STALE_GENERATION"}
    return registry.get_sample_value("pidfence_request_errors_total", labels) or 0.0


@pytest.mark.parametrize("op", ["lease", "bump"])
@pytest.mark.alone  # asserts a duration: no other test may run beside it (tests/README.md)
def test_flood_on_one_connection_leaves_pings_on_another_answered(
    secured: LeaseServerThread, raw: Callable[[], RawLease], lease_pki: LeasePki, op: str
) -> None:
    flooder, pinger = raw(), raw()
    flooder.call("hello", token=_token(lease_pki, "producer"))
    pinger.call("hello", token=_token(lease_pki, "other"))
    lease = flooder.call("lease")
    if op == "lease":
        frame = encode_frame({"v": 1, "op": "lease", "id": 1})
    else:  # stale bumps by the owner: each one is a ZooKeeper read
        frame = encode_frame(
            {
                "v": 1,
                "op": "bump",
                "id": 1,
                "pid": lease["pid"],
                "generation": 0,
                "secret": lease["secret"],
            }
        )
    flood = frame * 20_000
    sender = threading.Thread(target=lambda: _send_ignoring_reset(flooder.sock, flood))
    sender.start()  # never reads a reply: the server must push back, not buffer or spin
    try:
        deadline = time.monotonic() + 60
        while _answered(secured, op) < 500:  # the flood is being served before we ping
            assert time.monotonic() < deadline, "the flood never reached the server"
            time.sleep(0.01)
        waits = []
        for _ in range(20):
            started = time.monotonic()
            reply = pinger.call("ping")
            waits.append(time.monotonic() - started)
            assert reply["error"] is None
        assert max(waits) < 1.0, waits
    finally:
        flooder.close()
        sender.join(30)


def _send_ignoring_reset(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # closed by the test once the pings are done
        sock.sendall(data)


# -- TLS ----------------------------------------------------------------------------------------


def test_tls_and_mutual_tls(
    lease_server_factory: Callable[..., LeaseServerThread],
    lease_pki: LeasePki,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain_tls = lease_server_factory(tls_cert=lease_pki.server_cert, tls_key=lease_pki.server_key)
    with LeaseClient(plain_tls.address, tls=client_tls_context(lease_pki.ca)) as client:
        assert client.lease().pid >= 1
    # A plain client is told the server wants TLS and which setting gives it (not retriable: a
    # rerun meets the same refusal); the server logs the failed handshake.
    with (
        caplog.at_level(logging.WARNING, "pidfence.lease_server.audit"),
        LeaseClient(plain_tls.address, retries=0) as client,
        pytest.raises(LeaseTlsMismatch, match=r"wants TLS.*PIDFENCE_LEASE_TLS_CA") as plain,
    ):
        client.lease()
    assert not plain.value.retriable
    assert any("tls_failed" in r.getMessage() for r in caplog.records), caplog.text
    other_ca = make_lease_pki(tmp_path / "other").ca  # a client that trusts another CA
    with (
        LeaseClient(plain_tls.address, retries=0, tls=client_tls_context(other_ca)) as client,
        pytest.raises(LeaseTlsMismatch, match="PIDFENCE_LEASE_TLS_CA"),
    ):
        client.lease()
    mutual = lease_server_factory(
        tls_cert=lease_pki.server_cert,
        tls_key=lease_pki.server_key,
        tls_client_ca=lease_pki.ca,
    )
    no_cert = LeaseClient(mutual.address, retries=0, tls=client_tls_context(lease_pki.ca))
    with no_cert, pytest.raises(LeaseServerUnreachable):  # handshake refused: no client cert
        no_cert.lease()
    with_cert = client_tls_context(lease_pki.ca, lease_pki.client_cert, lease_pki.client_key)
    with LeaseClient(mutual.address, tls=with_cert) as client:
        assert client.lease().pid >= 1


# -- connection cap per address ---------------------------------------------------------------


def test_connections_per_address_are_capped(
    lease_server_factory: Callable[..., LeaseServerThread],
) -> None:
    server = lease_server_factory(max_connections_per_address=4)
    held = [RawLease(server.address) for _ in range(4)]
    try:
        for conn in held:
            assert conn.call("ping")["error"] is None
        refused = RawLease(server.address)
        reply = refused.recv()
        assert reply is not None and reply["error"] == "UNAVAILABLE"
        assert "this address" in reply["message"]
        refused.close()
        other_host = RawLease(server.address, source="127.0.0.2")  # another client address
        assert other_host.call("ping")["error"] is None
        other_host.close()
    finally:
        for conn in held:
            conn.close()
