"""Issue 22 case 7, against two ``pidfence lease-server`` processes on one real ZooKeeper with a
short lifetime: a bump or roll via the server that did not issue the pid returns and records the
end the issuer granted, and succeeds until that end (the old rule took the block's claim time
and answered UNKNOWN_PID up to ``--block-ttl`` early)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pidfence.pid_allocator import LeaseClient, StaleGeneration, UnknownPid
from pidfence.pid_allocator.capability import block_hint
from pidfence.services.lease_server import LeasePki, LeaseServerProcess
from pidfence.wire import load_public_keys, verify_cert

pytestmark = pytest.mark.timeout(180)

LIFETIME_MS = 20_000
#: The second lease comes from the same block this long after its claim.
ISSUED_AFTER_S = 6


def _wait_until_ms(epoch_ms: int) -> None:
    while time.time() * 1000 < epoch_ms:
        time.sleep(0.05)


def test_a_bump_via_another_server_keeps_the_issuers_end(
    lease_process_factory: Callable[..., LeaseServerProcess], lease_pki: LeasePki
) -> None:
    settings = {"lifetime_ms": LIFETIME_MS, "signing_key": lease_pki.signing_key}
    issuer = lease_process_factory("issuer", **settings)
    other = lease_process_factory("other", **settings)
    keys = load_public_keys([lease_pki.public_key])
    with LeaseClient(issuer.address) as at_issuer, LeaseClient(other.address) as at_other:
        first = at_issuer.lease()  # the issuer claims a block now
        time.sleep(ISSUED_AFTER_S)
        lease = at_issuer.lease()
        assert block_hint(lease.secret) == block_hint(first.secret)  # same block, issued later
        assert lease.expire_ms - first.expire_ms >= (ISSUED_AFTER_S - 1) * 1000

        bumped = at_other.bump(lease.pid, lease.generation, lease.secret)
        assert abs(bumped.expire_ms - lease.expire_ms) <= 1000
        check = verify_cert(bumped.cert, keys, bumped.pid, bumped.generation, 0)
        assert check.ok and check.expire_ms == bumped.expire_ms

        # Past the end the old rule gave (the block's claim + lifetime, about ``first``'s end),
        # still inside the issuer's: the other server bumps, and every server agrees.
        _wait_until_ms(first.expire_ms + 1000)
        assert time.time() * 1000 < lease.expire_ms - 1000, "the machine was too slow to tell"
        again = at_other.bump(lease.pid, bumped.generation, lease.secret)
        assert again.expire_ms == bumped.expire_ms
        via_issuer = at_issuer.bump(lease.pid, again.generation, lease.secret)
        assert via_issuer.expire_ms == bumped.expire_ms

        successor = at_other.roll(lease.pid, via_issuer.generation, lease.secret)
        with pytest.raises(StaleGeneration) as stale:
            at_issuer.bump(lease.pid, via_issuer.generation, lease.secret)
        assert stale.value.successor == successor.pid

        # After the true end: the lease is over at every server.
        ended = at_issuer.lease()
        _wait_until_ms(ended.expire_ms + 200)
        for client in (at_other, at_issuer):
            with pytest.raises(UnknownPid):
                client.bump(ended.pid, ended.generation, ended.secret)
