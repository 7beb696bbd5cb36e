"""Connection slots, counted from a connection's first byte (DESIGN.md §5 amended again).

Two pools. A connection is **pending** from accept until it is admitted: during its TLS
handshake and, with auth tokens, until its ``hello`` succeeded. Pending connections have a pool of
their own (``max_pending_connections``), so however many an attacker opens they never take the
room of admitted clients (``max_connections``), and open files stay bounded by the caps.

A full pending pool does not refuse a newcomer: it evicts a pending connection that made the
least progress (stage 0: nothing yet, or a TLS handshake still running; stage 1: handshake done or
first bytes in, waiting for ``hello``), taken from the address holding the most of those, oldest
first. A real client needs milliseconds to pass through; connections held half-open are older and
less advanced, and a flood from one address evicts its own connections before anyone else's.
``max_connections_per_address`` bounds admitted connections per address, and
``max_connections_per_client`` those of one client (a token's name, counted at ``hello``) over
all its addresses, so no token can hold every admitted slot.
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
    """Pending and admitted connections.

    Args:
        max_connections: admitted connections at most.
        max_pending: pending connections at most.
        max_per_address: admitted connections from one address at most.
        max_per_client: admitted connections of one client (token name) at most (default:
            ``max_connections``).
    """

    def __init__(
        self,
        max_connections: int,
        max_pending: int,
        max_per_address: int,
        max_per_client: int | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.max_per_address = max_per_address
        self.max_per_client = max_connections if max_per_client is None else max_per_client
        self._clients: dict[str, set[Slot]] = {}
        self._client_of: dict[Slot, str] = {}
        # stage -> address -> its pending connections at that stage, oldest first
        self._pending: tuple[dict[str, dict[Slot, None]], ...] = ({}, {})
        #: Pending connections now.
        self.pending = 0
        self._admitted: dict[str, set[Slot]] = {}
        #: Admitted connections now.
        self.admitted = 0

    def accept(self, slot: Slot) -> list[Slot]:
        """Count a new connection as pending; return the connections to close to make room."""
        evicted: list[Slot] = []
        if self.pending >= self.max_pending:
            victim = self._victim()
            if victim is not None:
                self.release(victim)
                evicted.append(victim)
        slot.stage = STAGE_NEW
        self._add(slot)
        return evicted

    def _victim(self) -> Slot | None:
        for stage in self._pending:
            if stage:
                address = max(stage, key=lambda a: len(stage[a]))
                return next(iter(stage[address]))
        return None

    def _add(self, slot: Slot) -> None:
        self._pending[slot.stage].setdefault(slot.address, {})[slot] = None
        self.pending += 1

    def _remove_pending(self, slot: Slot) -> bool:
        stage = self._pending[slot.stage]
        mine = stage.get(slot.address)
        if mine is None or slot not in mine:
            return False
        del mine[slot]
        if not mine:
            del stage[slot.address]
        self.pending -= 1
        return True

    def advance(self, slot: Slot) -> None:
        """The pending connection finished its TLS handshake or sent its first bytes."""
        if slot.stage == STAGE_NEW and self._remove_pending(slot):
            slot.stage = STAGE_STARTED
            self._add(slot)

    def admit(self, slot: Slot, client: str | None = None) -> str | None:
        """Move a pending connection to the admitted pool, as ``client``'s (a token's name)
        when given; None, or why it is refused (the caller closes it). An admitted connection
        that names another client moves to that client's count."""
        mine = self._admitted.get(slot.address)
        known = mine is not None and slot in mine
        if not known:
            if self.admitted >= self.max_connections:
                return "connection limit reached; try another lease server"
            if mine is not None and len(mine) >= self.max_per_address:
                return (
                    f"{len(mine)} connections from this address already; close idle ones "
                    "(--max-connections-per-address)"
                )
        if client is not None and self._client_of.get(slot) != client:
            theirs = len(self._clients.get(client, ()))
            if theirs >= self.max_per_client:
                return (
                    f"{theirs} connections of client {client} already; close idle ones "
                    "(--max-connections-per-client)"
                )
            self._forget_client(slot)
            self._client_of[slot] = client
            self._clients.setdefault(client, set()).add(slot)
        if not known:
            self._remove_pending(slot)
            self._admitted.setdefault(slot.address, set()).add(slot)
            self.admitted += 1
        return None

    def _forget_client(self, slot: Slot) -> None:
        client = self._client_of.pop(slot, None)
        if client is not None:
            theirs = self._clients[client]
            theirs.discard(slot)
            if not theirs:
                del self._clients[client]

    def release(self, slot: Slot) -> None:
        """Forget a connection (idempotent)."""
        if self._remove_pending(slot):
            return
        mine = self._admitted.get(slot.address)
        if mine is not None and slot in mine:
            mine.discard(slot)
            self._forget_client(slot)
            self.admitted -= 1
            if not mine:
                del self._admitted[slot.address]
