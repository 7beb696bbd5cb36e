"""Connection slots, counted from a connection's first byte (DESIGN.md §5 amended again).

Two pools. A connection is **pending** from accept until it is admitted: during its TLS
handshake and, with auth tokens, until its ``hello`` succeeded. Pending connections have a pool
of their own (``max_pending_connections``), so however many an attacker opens they never take the
room of admitted clients (``max_connections``), and open files stay bounded by the two caps.

A full pending pool does not refuse a newcomer: it evicts the pending connection that made the
least progress, oldest first (stage 0: nothing yet, or a TLS handshake still running; stage 1:
handshake done or first bytes in, waiting for ``hello``). A real client needs milliseconds to
pass through; a connection held half-open is the oldest at stage 0 and goes first, so a flood of
half-open connections churns itself, not the clients. The per-address cap works the same way: a
new connection from an address at its cap evicts that address's least advanced pending one, and is
refused only when all of them are admitted.
"""

from __future__ import annotations

from typing import Protocol

STAGE_NEW = 0
STAGE_STARTED = 1


class Slot(Protocol):
    """What admission needs of a connection."""

    address: str
    stage: int


class Admission:
    """Pending and admitted connections, per address too.

    Args:
        max_connections: admitted connections at most.
        max_pending: pending connections at most.
        max_per_address: connections (pending and admitted) from one address at most.
    """

    def __init__(self, max_connections: int, max_pending: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self._stages: tuple[dict[Slot, None], dict[Slot, None]] = ({}, {})
        self._admitted: set[Slot] = set()
        self._by_address: dict[str, dict[Slot, None]] = {}

    @property
    def pending(self) -> int:
        """Pending connections now."""
        return len(self._stages[0]) + len(self._stages[1])

    @property
    def admitted(self) -> int:
        """Admitted connections now."""
        return len(self._admitted)

    def accept(self, slot: Slot) -> tuple[str | None, list[Slot]]:
        """Count a new connection as pending.

        Returns:
            (None, connections to close to make room) when it is in; (why not, []) when it is
            refused (its address holds only admitted connections, up to its cap).
        """
        evicted: list[Slot] = []
        mine = self._by_address.get(slot.address, {})
        if len(mine) >= self.max_per_address:
            victim = self._least_advanced(mine)
            if victim is None:
                return (
                    f"{len(mine)} connections from this address already; close idle ones "
                    "(--max-connections-per-address)",
                    [],
                )
            evicted.append(victim)
            self.release(victim)
        if self.pending >= self.max_pending:
            stage = self._stages[0] or self._stages[1]
            victim = next(iter(stage))
            evicted.append(victim)
            self.release(victim)
        slot.stage = STAGE_NEW
        self._stages[STAGE_NEW][slot] = None
        self._by_address.setdefault(slot.address, {})[slot] = None
        return None, evicted

    def _least_advanced(self, slots: dict[Slot, None]) -> Slot | None:
        """The pending one of ``slots`` (in accept order) at the lowest stage, oldest first."""
        for stage in self._stages:
            for candidate in slots:
                if candidate in stage:
                    return candidate
        return None

    def advance(self, slot: Slot) -> None:
        """The pending connection finished its TLS handshake or sent its first bytes."""
        if slot.stage == STAGE_NEW and slot in self._stages[STAGE_NEW]:
            del self._stages[STAGE_NEW][slot]
            slot.stage = STAGE_STARTED
            self._stages[STAGE_STARTED][slot] = None

    def admit(self, slot: Slot) -> str | None:
        """Move a pending connection to the admitted pool; None, or why it is refused (the
        caller closes it)."""
        if slot in self._admitted:
            return None
        if len(self._admitted) >= self.max_connections:
            return "connection limit reached; try another lease server"
        self._stages[slot.stage].pop(slot, None)
        self._admitted.add(slot)
        return None

    def release(self, slot: Slot) -> None:
        """Forget a connection (idempotent)."""
        self._admitted.discard(slot)
        for stage in self._stages:
            stage.pop(slot, None)
        mine = self._by_address.get(slot.address)
        if mine is not None:
            mine.pop(slot, None)
            if not mine:
                del self._by_address[slot.address]
