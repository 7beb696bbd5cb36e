"""The lease ring: a fixed-capacity circular buffer of issued leases in issue order.

Every lease has the same lifetime, so issue order is expiry order: expired leases leave from the
head, new ones join at the tail, and because one server issues pids in increasing order a lookup is
a binary search on pid. A live lease is never dropped; a full ring refuses new leases.

Times are the server's steady clock (``clock.SteadyClock``), so a wall-clock step never drops a
live lease. Each entry remembers the client it was issued to (token name, or address without
auth); one client holds at most ``share`` slots, so it cannot lock everyone else out.

An expired lease leaves its slot as it was until a new lease reuses it, so :meth:`LeaseRing.recall`
still answers for it (the lease server's ``describe`` tells an ended lease's exact end that way).
"""

from __future__ import annotations

from dataclasses import dataclass

from pidfence.pid_allocator.declaration import SettingsError
from pidfence.pid_allocator.errors import LeaseCapacityExhausted


@dataclass(frozen=True, slots=True)
class RingEntry:
    """One issued lease: its pid, starting generation and end (epoch ms)."""

    pid: int
    generation: int
    expire_ms: int


class LeaseRing:
    """Fixed-capacity ring of live leases.

    Args:
        capacity: how many live leases it holds at most (>= 1).
        share: how many live leases one client may hold at most (default: all).
    """

    def __init__(self, capacity: int, share: int | None = None) -> None:
        if capacity < 1:
            raise SettingsError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.share = capacity if share is None else max(1, min(share, capacity))
        self._pids = [0] * capacity
        self._gens = [0] * capacity
        self._expires = [0] * capacity
        self._clients: list[str] = [""] * capacity
        self._held: dict[str, int] = {}
        self._head = 0
        self._size = 0

    def held_by(self, client: str) -> int:
        """Live leases (as of the last expiry) issued to ``client``."""
        return self._held.get(client, 0)

    def __len__(self) -> int:
        return self._size

    def live(self, now_ms: int) -> int:
        """Leases live at ``now_ms``: :func:`len` less the ended ones not yet expired from the
        head (ends rise in ring order: one binary search). Changes nothing, so a metrics scrape
        may call it from another thread."""
        head, size, expires, cap = self._head, self._size, self._expires, self.capacity
        lo, hi = 0, size
        while lo < hi:
            mid = (lo + hi) // 2
            if expires[(head + mid) % cap] <= now_ms:
                lo = mid + 1
            else:
                hi = mid
        return size - lo

    def expire(self, now_ms: int) -> int:
        """Drop leases that ended at or before ``now_ms`` from the head; return how many."""
        dropped = 0
        while self._size and self._expires[self._head] <= now_ms:
            client = self._clients[self._head]
            left = self._held[client] - 1
            if left:
                self._held[client] = left
            else:
                del self._held[client]
            self._head = (self._head + 1) % self.capacity
            self._size -= 1
            dropped += 1
        return dropped

    def ensure_room(self, now_ms: int, client: str = "") -> None:
        """Expire the head, then raise ``LeaseCapacityExhausted`` if no slot is free for
        ``client``."""
        self.expire(now_ms)
        if self._size == self.capacity:
            raise LeaseCapacityExhausted(
                f"lease ring full: {self.capacity} live leases; start more lease servers or "
                "raise --capacity"
            )
        if self._held.get(client, 0) >= self.share:
            raise LeaseCapacityExhausted(
                f"this client holds its whole share of the lease ring ({self.share} live "
                "leases); reuse pids, or raise --client-share"
            )

    def append(
        self, pid: int, generation: int, expire_ms: int, now_ms: int, client: str = ""
    ) -> None:
        """Add a lease at the tail.

        Raises:
            LeaseCapacityExhausted: every slot holds a live lease, or ``client`` holds its share.
            ValueError: ``pid`` is not above the newest pid (pids are monotonic per server).
        """
        self.ensure_room(now_ms, client)
        self.add_checked(pid, generation, expire_ms, client)

    def add_checked(self, pid: int, generation: int, expire_ms: int, client: str = "") -> None:
        """:meth:`append` right after ``ensure_room(now_ms, client)`` passed for the same lease
        (the lease path checks room first and must not expire the head twice).

        Raises:
            LeaseCapacityExhausted: called without room (a caller bug, never a silent drop).
            ValueError: ``pid`` is not above the newest pid.
        """
        size = self._size
        if size == self.capacity or self._held.get(client, 0) >= self.share:
            raise LeaseCapacityExhausted("lease ring full (add_checked without ensure_room)")
        if size and pid <= self._pids[(self._head + size - 1) % self.capacity]:
            raise ValueError(f"pid {pid} is not above the newest pid in the ring")
        tail = (self._head + self._size) % self.capacity
        self._pids[tail] = pid
        self._gens[tail] = generation
        self._expires[tail] = expire_ms
        self._clients[tail] = client
        self._held[client] = self._held.get(client, 0) + 1
        self._size += 1

    def recall(self, pid: int) -> RingEntry | None:
        """The lease of ``pid``, live or ended, while its slot was not reused; else None.

        Slots hold pids in issue order around the ring starting at the tail (the oldest written
        slot; slots never written hold 0), so one binary search finds it.
        """
        cap, start = self.capacity, (self._head + self._size) % self.capacity
        pids = self._pids
        lo, hi = 0, cap
        while lo < hi:
            mid = (lo + hi) // 2
            if pids[(start + mid) % cap] < pid:
                lo = mid + 1
            else:
                hi = mid
        slot = (start + lo) % cap
        if lo == cap or pids[slot] != pid:
            return None
        return RingEntry(pid, self._gens[slot], self._expires[slot])

    def find(self, pid: int, now_ms: int) -> RingEntry | None:
        """The live lease of ``pid``, or None when it is not here or has expired."""
        lo, hi = 0, self._size
        while lo < hi:
            mid = (lo + hi) // 2
            if self._pids[(self._head + mid) % self.capacity] < pid:
                lo = mid + 1
            else:
                hi = mid
        if lo == self._size:
            return None
        slot = (self._head + lo) % self.capacity
        if self._pids[slot] != pid or self._expires[slot] <= now_ms:
            return None
        return RingEntry(pid, self._gens[slot], self._expires[slot])
