"""The producer's lease state machine: explicit states, checked transitions."""

from __future__ import annotations

from enum import StrEnum

from pidfence.producer.errors import InvalidTransition


class LeaseState(StrEnum):
    """Where the producer's pid lease stands.

    ``UNLEASED`` (constructed) -> ``LEASED`` (sending) -> ``DRAINING`` (rollover due: waiting
    until nothing under the old pid is unacknowledged) -> ``ROLLING`` (asking the lease server to
    ``roll`` the pid into its successor) -> ``LEASED`` under the successor. A drain that fails
    goes back to ``LEASED`` (nothing was rolled); a roll the server could not answer goes back to
    ``LEASED`` under the old pid (retried later, never after the lease ends). ``FENCED`` when
    another owner moved the pid on (a bump or roll of it failed): nothing may be sent any more.
    ``CLOSED`` after :meth:`~pidfence.producer.IdempotentProducer.close`. Records are sent only
    in ``LEASED``.
    """

    UNLEASED = "UNLEASED"
    LEASED = "LEASED"
    DRAINING = "DRAINING"
    ROLLING = "ROLLING"
    CLOSED = "CLOSED"
    FENCED = "FENCED"


_ALLOWED: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.UNLEASED: frozenset({LeaseState.LEASED, LeaseState.CLOSED, LeaseState.FENCED}),
    LeaseState.LEASED: frozenset({LeaseState.DRAINING, LeaseState.CLOSED, LeaseState.FENCED}),
    LeaseState.DRAINING: frozenset({LeaseState.ROLLING, LeaseState.LEASED, LeaseState.CLOSED}),
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
