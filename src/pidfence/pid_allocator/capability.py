"""Pid secrets: the capability that ``bump`` and ``roll`` require (DESIGN.md §5 amended).

A secret is ``block start (8 bytes) || blake2b(key=block salt, pid)`` (16 bytes). Any lease
server recomputes it from the block record (one cached ZooKeeper read, never a directory
listing: the block start travels in the secret), so issuing a lease writes nothing per pid.
The block record, and with it the salt, is readable only by lease servers when ZooKeeper ACLs
are on. The secret never changes over a pid's generations.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_BYTES = 24
_MAC_BYTES = 16
_PERSON = b"pidfence-secret"


def _mac(salt: bytes, pid: int) -> bytes:
    return hashlib.blake2b(
        pid.to_bytes(8, "big"), key=salt, digest_size=_MAC_BYTES, person=_PERSON
    ).digest()


def secret_hasher(salt: bytes) -> hashlib.blake2b:
    """The keyed hash state of a block's secrets, to ``copy()`` per pid (see
    :func:`secret_from`): keying blake2b costs as much as hashing, so a server keys it once per
    block."""
    return hashlib.blake2b(key=salt, digest_size=_MAC_BYTES, person=_PERSON)


def secret_from(block_start: int, hasher: hashlib.blake2b, pid: int) -> bytes:
    """``make_secret(block_start, salt, pid)`` from ``secret_hasher(salt)``."""
    h = hasher.copy()
    h.update(pid.to_bytes(8, "big"))
    return block_start.to_bytes(8, "big") + h.digest()


def make_secret(block_start: int, salt: bytes, pid: int) -> bytes:
    """The secret of ``pid`` issued from the block starting at ``block_start`` with ``salt``."""
    return block_start.to_bytes(8, "big") + _mac(salt, pid)


def block_hint(secret: bytes) -> int | None:
    """The block start a secret names, or None when it cannot be a secret at all."""
    if len(secret) != SECRET_BYTES:
        return None
    start = int.from_bytes(secret[:8], "big")
    return start if start >= 1 else None


def secret_matches(secret: bytes, block_start: int, salt: bytes, pid: int) -> bool:
    """Constant-time check that ``secret`` is the secret of ``pid`` from that block."""
    return hmac.compare_digest(secret, make_secret(block_start, salt, pid))
