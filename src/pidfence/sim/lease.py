"""An in-memory lease server with DESIGN §5 semantics, for the simulation."""

from __future__ import annotations

import random
from dataclasses import dataclass

from pidfence.wire import PidfenceError


class SimLeaseError(PidfenceError):
    """A bump the real lease server would refuse (``UNKNOWN_PID`` or ``STALE_GENERATION``).

    In the simulation this is a bug in the simulated producer: fix the schedule logic.
    """


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease: the pid, its generation and when it ends (epoch ms)."""

    pid: int
    generation: int
    expire_ms: int


class SimLeaseServer:
    """Unique pids, unique generations per pid, fixed lifetime, no renewal (DESIGN §5).

    Args:
        rng: randomness (a new pid starts at a random generation, as the real server does).
        lifetime_ms: lease lifetime.
    """

    def __init__(self, rng: random.Random, lifetime_ms: int) -> None:
        self._rng = rng
        self.lifetime_ms = lifetime_ms
        self._next_pid = rng.randrange(1, 1 << 40)
        self._latest: dict[int, Lease] = {}

    def lease(self, now_ms: int) -> Lease:
        """A new pid, never issued before."""
        lease = Lease(self._next_pid, self._rng.randrange(0, 1 << 20), now_ms + self.lifetime_ms)
        self._next_pid += 1
        self._latest[lease.pid] = lease
        return lease

    def bump(self, pid: int, generation: int, now_ms: int) -> Lease:
        """The next generation of a live pid whose latest generation is ``generation``.

        Raises:
            SimLeaseError: the pid is unknown or expired, or ``generation`` is not its latest.
        """
        current = self._latest.get(pid)
        if current is None or current.expire_ms <= now_ms:
            raise SimLeaseError(f"UNKNOWN_PID: pid {pid} not issued or expired at {now_ms}")
        if current.generation != generation:
            raise SimLeaseError(
                f"STALE_GENERATION: pid {pid} is at {current.generation}, not {generation}"
            )
        bumped = Lease(pid, generation + 1, current.expire_ms)
        self._latest[pid] = bumped
        return bumped
