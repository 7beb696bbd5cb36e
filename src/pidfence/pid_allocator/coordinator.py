"""What a lease server needs from its coordination store (ZooKeeper, or memory in unit tests).

Calls are blocking; the server runs them on an executor, never on its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgpack


@dataclass(frozen=True, slots=True)
class Block:
    """A claimed range of pids ``[start, end)`` and what any server needs to judge its pids.

    Attributes:
        start: first pid of the block.
        end: one past the last pid.
        owner: id of the server that claimed it.
        token: random claim token; tells an ambiguous claim apart on re-read.
        claimed_ms: claim time (epoch ms).
        lifetime_ms: lease lifetime of pids issued from it.
        ttl_ms: the owner issues from this block only before ``claimed_ms + ttl_ms``.
        salt: key of the starting-generation hash.
    """

    start: int
    end: int
    owner: str
    token: str
    claimed_ms: int
    lifetime_ms: int
    ttl_ms: int
    salt: bytes

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.start <= pid < self.end

    @property
    def last_expiry_ms(self) -> int:
        """No lease issued from this block lives past this instant."""
        return self.claimed_ms + self.ttl_ms + self.lifetime_ms

    def encode(self) -> bytes:
        """The block record's znode data."""
        data: bytes = msgpack.packb(
            {
                "v": 1,
                "start": self.start,
                "end": self.end,
                "owner": self.owner,
                "token": self.token,
                "claimed_ms": self.claimed_ms,
                "lifetime_ms": self.lifetime_ms,
                "ttl_ms": self.ttl_ms,
                "salt": self.salt,
            },
            use_bin_type=True,
        )
        return data

    @classmethod
    def decode(cls, data: bytes) -> Block:
        """Parse a block record written by ``encode``."""
        m: dict[str, Any] = msgpack.unpackb(data, raw=False)
        return cls(
            int(m["start"]),
            int(m["end"]),
            str(m["owner"]),
            str(m["token"]),
            int(m["claimed_ms"]),
            int(m["lifetime_ms"]),
            int(m["ttl_ms"]),
            bytes(m["salt"]),
        )


@dataclass(frozen=True, slots=True)
class BlockRequest:
    """What a claim asks for; the store decides ``start``."""

    size: int
    owner: str
    token: str
    claimed_ms: int
    lifetime_ms: int
    ttl_ms: int
    salt: bytes


class Coordinator(Protocol):
    """Shared state of every lease server."""

    @property
    def connected(self) -> bool:
        """Whether the store is reachable now (False while ZooKeeper is SUSPENDED or LOST)."""
        ...

    @property
    def writes(self) -> int:
        """Write transactions sent so far (for metrics and the bench)."""
        ...

    def claim_block(self, request: BlockRequest) -> Block:
        """Claim the next free block of ``request.size`` pids.

        Raises:
            LeaseServiceUnavailable: the store is unreachable or the outcome could not be read.
        """
        ...

    def find_block(self, pid: int) -> Block | None:
        """The claimed block holding ``pid``, or None if no server ever claimed it."""
        ...

    def bump_generation(
        self, pid: int, generation: int, initial: int, expire_ms: int, token: str, now_ms: int
    ) -> tuple[int, int]:
        """Move ``pid`` from ``generation`` to ``generation + 1`` by compare-and-set.

        Args:
            pid: the pid.
            generation: the caller's current generation.
            initial: the pid's starting generation (used when it was never bumped).
            expire_ms: the lease end to record when it was never bumped.
            token: unique per logical bump; a retry with the same token gets the same answer.
            now_ms: current time, to refuse expired pids.

        Returns:
            (new generation, expire_ms).

        Raises:
            StaleGeneration, UnknownPid, LeaseCapacityExhausted, LeaseServiceUnavailable.
        """
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def encode_generation(generation: int, expire_ms: int, token: str) -> bytes:
    """A generation znode's data."""
    data: bytes = msgpack.packb({"g": generation, "e": expire_ms, "t": token}, use_bin_type=True)
    return data


def decode_generation(data: bytes) -> tuple[int, int, str]:
    """(generation, expire_ms, token) of a generation znode."""
    m: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return int(m["g"]), int(m["e"]), str(m["t"])
