"""Pid secrets: the capability that ``bump`` and ``roll`` require (DESIGN.md §5 amended).

A secret (version 2, 28 bytes) is ``block start (8) || issue offset (4) || blake2b(key=block
salt, pid || issue offset)`` (16), where the issue offset is the milliseconds from the block's
claim to the pid's issue. Any lease server recomputes it from the block record (one cached
ZooKeeper read, never a directory listing: the block start travels in the secret), so issuing a
lease writes nothing per pid; and because the issue time is in it, authenticated by the MAC, any
server knows the exact end the issuing server granted (``claimed + offset + lifetime``), not
just the earliest it could have been (DESIGN.md §5 amended again: the true end everywhere).

The block record, and with it the salt, is readable only by lease servers when ZooKeeper ACLs
are on. A pid's secret never changes over its generations.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_BYTES = 28
_MAC_BYTES = 16
_PERSON = b"pidfence-secret2"


def secret_hasher(salt: bytes) -> hashlib.blake2b:
    """The keyed hash state of a block's secrets, to ``copy()`` per pid (see
    :func:`secret_from`): keying blake2b costs as much as hashing, so a server keys it once per
    block."""
    return hashlib.blake2b(key=salt, digest_size=_MAC_BYTES, person=_PERSON)


def secret_from(block_start: int, hasher: hashlib.blake2b, pid: int, offset_ms: int) -> bytes:
    """``make_secret(block_start, salt, pid, offset_ms)`` from ``secret_hasher(salt)``."""
    offset = offset_ms.to_bytes(4, "big")
    h = hasher.copy()
    h.update(pid.to_bytes(8, "big") + offset)
    return block_start.to_bytes(8, "big") + offset + h.digest()


def make_secret(block_start: int, salt: bytes, pid: int, offset_ms: int) -> bytes:
    """The secret of ``pid``, issued ``offset_ms`` after the claim of the block starting at
    ``block_start`` with ``salt``."""
    return secret_from(block_start, secret_hasher(salt), pid, offset_ms)


def block_hint(secret: bytes) -> int | None:
    """The block start a secret names, or None when it cannot be a secret at all."""
    if len(secret) != SECRET_BYTES:
        return None
    start = int.from_bytes(secret[:8], "big")
    return start if start >= 1 else None


def issue_offset(secret: bytes) -> int | None:
    """The issue offset (ms after the block's claim) a secret carries (None: not a secret).

    Trust it only once :func:`secret_matches` has checked the secret."""
    if len(secret) != SECRET_BYTES:
        return None
    return int.from_bytes(secret[8:12], "big")


def secret_matches(secret: bytes, block_start: int, salt: bytes, pid: int) -> bool:
    """Constant-time check that ``secret`` is the secret of ``pid`` from that block."""
    offset = issue_offset(secret)
    if offset is None:
        return False
    return hmac.compare_digest(secret, make_secret(block_start, salt, pid, offset))
