"""The proposal's circular buffer: producer entries in creation order, expired from the head."""

from __future__ import annotations

from collections.abc import Iterator


class EntryRing:
    """A fixed-capacity ring of ``(pid, creation)`` pairs in creation order.

    Entries are appended at the tail and expire from the head, so expiry costs O(1) per entry and
    memory is fixed at ``capacity`` slots. ``creation`` is the entry's creation serial, which
    delta snapshots compare with their base.
    """

    __slots__ = ("_count", "_head", "_pids", "_serials", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._pids = [0] * capacity
        self._serials = [0] * capacity
        self._head = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        """True when every slot holds an entry."""
        return self._count == self.capacity

    def append(self, pid: int, serial: int) -> None:
        """Add the newest entry at the tail."""
        if self._count == self.capacity:
            raise OverflowError("ring is full")
        tail = (self._head + self._count) % self.capacity
        self._pids[tail] = pid
        self._serials[tail] = serial
        self._count += 1

    def head(self) -> tuple[int, int]:
        """The oldest entry."""
        if not self._count:
            raise IndexError("ring is empty")
        return self._pids[self._head], self._serials[self._head]

    def pop(self) -> tuple[int, int]:
        """Remove and return the oldest entry."""
        item = self.head()
        self._head = (self._head + 1) % self.capacity
        self._count -= 1
        return item

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for i in range(self._count):
            slot = (self._head + i) % self.capacity
            yield self._pids[slot], self._serials[slot]
