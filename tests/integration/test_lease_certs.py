"""Certificates v2 naming the producer's key, and per-lease record MAC keys, from a
``pidfence lease-server`` started by its CLI with TLS, tokens, signing and
``--record-mac-secret`` (issue 22, the lease server's side of the binding and of per-record
mode)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pidfence.pid_allocator import (
    LeaseClient,
    MalformedRequest,
)
from pidfence.services.lease_server import LeasePki, LeaseServerProcess
from pidfence.wire import derive_record_key, load_mac_secret, load_public_keys, verify_cert

pytestmark = pytest.mark.timeout(180)


def test_grants_name_the_producer_key_and_carry_the_mac_key(
    lease_process_factory: Callable[..., LeaseServerProcess], lease_pki: LeasePki
) -> None:
    server = lease_process_factory(
        "binding",
        **lease_pki.server_options(),
        signing_key=lease_pki.signing_key,
        record_mac_secret=lease_pki.record_mac_secret,
    )
    keys = load_public_keys([lease_pki.public_key])
    secret = load_mac_secret(lease_pki.record_mac_secret)
    producer = [Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(3)]
    with LeaseClient(server.address, **lease_pki.client_options()) as client:
        lease = client.lease(key=producer[0])
        bumped = client.bump(lease.pid, lease.generation, lease.secret, key=producer[1])
        rolled = client.roll(bumped.pid, bumped.generation, lease.secret, key=producer[2])
        plain = client.lease()  # no key: the v1 certificate, as before
        with pytest.raises(MalformedRequest, match="32 bytes"):
            client.lease(key=producer[0][:31])
    for grant, key in zip((lease, bumped, rolled), producer, strict=True):
        check = verify_cert(grant.cert, keys, grant.pid, grant.generation, 0)
        assert (check.ok, check.version, check.producer_key) == (True, 2, key)
        assert check.expire_ms == grant.expire_ms
        assert grant.mac_key == derive_record_key(secret, grant.pid)
    # A roll also answers the rolled pid's key: its owner's recovery scan checks its records.
    assert rolled.prior_mac_key == derive_record_key(secret, bumped.pid)
    assert lease.prior_mac_key is None and bumped.prior_mac_key is None
    check = verify_cert(plain.cert, keys, plain.pid, plain.generation, 0)
    assert (check.ok, check.version, check.producer_key) == (True, 1, None)
    assert plain.mac_key == derive_record_key(secret, plain.pid)
    assert "mac_key" not in repr(lease) and "secret" not in repr(lease)


def test_record_mac_keys_are_not_sent_in_clear_unless_told(
    lease_process_factory: Callable[..., LeaseServerProcess], lease_pki: LeasePki, zk_chroot: str
) -> None:
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pidfence.cli import main; main()",
            "lease-server",
            "--zk",
            zk_chroot,
            "--listen",
            "127.0.0.1:0",
            "--record-mac-secret",
            str(lease_pki.record_mac_secret),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2
    assert "--record-mac-secret" in refused.stderr and "TLS" in refused.stderr
    trusted = lease_process_factory(
        "trusted", record_mac_secret=lease_pki.record_mac_secret, insecure=True
    )
    with LeaseClient(trusted.address) as client:
        assert client.lease().mac_key is not None
