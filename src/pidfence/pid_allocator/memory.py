"""An in-memory coordinator: the ZooKeeper rules without ZooKeeper, for unit tests and demos."""

from __future__ import annotations

import bisect
import threading
from dataclasses import replace

from pidfence.pid_allocator.bumps import next_generation
from pidfence.pid_allocator.coordinator import Block, BlockRequest
from pidfence.pid_allocator.errors import LeaseServiceUnavailable, StaleGeneration


class MemoryCoordinator:
    """Thread-safe stand-in for ``ZkCoordinator``; share one between servers to model a cluster.

    ``connected`` can be flipped by tests to model a SUSPENDED ZooKeeper.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._starts: list[int] = []
        self._blocks: dict[int, Block] = {}
        self._gens: dict[int, tuple[int, int, str]] = {}
        self._writes = 0
        self.up = True

    @property
    def connected(self) -> bool:
        """False while a test says the store is down."""
        return self.up

    @property
    def writes(self) -> int:
        """Write transactions so far."""
        return self._writes

    def _check_up(self) -> None:
        if not self.up:
            raise LeaseServiceUnavailable("coordination store unreachable; retry shortly")

    def claim_block(self, request: BlockRequest) -> Block:
        """Claim ``[next, next + size)``."""
        with self._lock:
            self._check_up()
            start = self._next
            block = Block(
                start,
                start + request.size,
                request.owner,
                request.token,
                request.claimed_ms,
                request.lifetime_ms,
                request.ttl_ms,
                request.salt,
            )
            self._next = block.end
            self._starts.append(start)
            self._blocks[start] = block
            self._writes += 1
            return replace(block)

    def find_block(self, pid: int) -> Block | None:
        """The block holding ``pid``."""
        with self._lock:
            self._check_up()
            i = bisect.bisect_right(self._starts, pid) - 1
            if i < 0:
                return None
            block = self._blocks[self._starts[i]]
            return block if pid in block else None

    def bump_generation(
        self, pid: int, generation: int, initial: int, expire_ms: int, token: str, now_ms: int
    ) -> tuple[int, int]:
        """Compare-and-set the generation of ``pid``."""
        with self._lock:
            self._check_up()
            current, expire, stored_token = self._gens.get(pid, (initial, expire_ms, ""))
            try:
                new = next_generation(pid, generation, current, expire, now_ms)
            except StaleGeneration:
                if stored_token == token and current == generation + 1:
                    return current, expire
                raise
            self._gens[pid] = (new, expire, token)
            self._writes += 1
            return new, expire

    def close(self) -> None:
        """Nothing to release."""
