"""The producer's lease state machine: explicit states, checked transitions."""

from __future__ import annotations

from enum import StrEnum

from pidfence.producer.errors import InvalidTransition


class LeaseState(StrEnum):
    """Where the producer's pid lease stands.

    ``UNLEASED`` (constructed) -> ``LEASED`` (sending) -> ``ROLLING`` (leasing the next pid before
    expiry) -> ``LEASED`` again; ``CLOSED`` after :meth:`close`; ``FENCED`` when another producer
    took over this producer's checkpoint (terminal: nothing may be sent any more).
    """

    UNLEASED = "UNLEASED"
    LEASED = "LEASED"
    ROLLING = "ROLLING"
    CLOSED = "CLOSED"
    FENCED = "FENCED"


_ALLOWED: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.UNLEASED: frozenset({LeaseState.LEASED, LeaseState.CLOSED, LeaseState.FENCED}),
    LeaseState.LEASED: frozenset({LeaseState.ROLLING, LeaseState.CLOSED, LeaseState.FENCED}),
    LeaseState.ROLLING: frozenset({LeaseState.LEASED, LeaseState.CLOSED, LeaseState.FENCED}),
    LeaseState.CLOSED: frozenset(),
    LeaseState.FENCED: frozenset({LeaseState.CLOSED}),
}


class LeaseStateMachine:
    """Holds the current :class:`LeaseState`; :meth:`move` refuses transitions not in the table."""

    def __init__(self) -> None:
        self.state = LeaseState.UNLEASED

    def move(self, to: LeaseState) -> None:
        """Go to ``to``.

        Raises:
            InvalidTransition: ``to`` is not reachable from the current state.
        """
        if to not in _ALLOWED[self.state]:
            raise InvalidTransition(
                f"lease state {self.state} cannot go to {to}; allowed: "
                f"{sorted(_ALLOWED[self.state]) or 'none (terminal)'}"
            )
        self.state = to
