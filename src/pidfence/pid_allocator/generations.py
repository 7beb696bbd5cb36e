"""Starting generations, derived so any lease server can recompute them.

A block record in ZooKeeper carries a random salt; a pid's starting generation is a keyed hash of
(salt, pid) below ``GENERATION_START_LIMIT``. The issuing server hands it out without a ZooKeeper
write, and a server that did not issue the pid can still check a bump's first generation.
Starting below 2^30 leaves 2^30 bumps of headroom under the 2^31 limit.
"""

from __future__ import annotations

import hashlib

GENERATION_LIMIT = 2**31
GENERATION_START_LIMIT = 2**30


def initial_generation(salt: bytes, pid: int) -> int:
    """The starting generation of ``pid`` issued from a block with ``salt``."""
    digest = hashlib.blake2b(pid.to_bytes(8, "big"), key=salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") % GENERATION_START_LIMIT


def generation_hasher(salt: bytes) -> hashlib.blake2b:
    """The keyed hash state of a block's starting generations, to ``copy()`` per pid."""
    return hashlib.blake2b(key=salt, digest_size=8)


def generation_from(hasher: hashlib.blake2b, pid: int) -> int:
    """``initial_generation(salt, pid)`` from ``generation_hasher(salt)``."""
    h = hasher.copy()
    h.update(pid.to_bytes(8, "big"))
    return int.from_bytes(h.digest(), "big") % GENERATION_START_LIMIT
