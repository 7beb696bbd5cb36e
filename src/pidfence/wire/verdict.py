"""The named outcome of the broker-side rules for one record (DESIGN §4)."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What the broker rules decided for one record.

    ``APPENDED`` and ``NON_IDEMPOTENT`` records go to the log; ``BUFFERED`` is not final (the
    record is held for reordering and decided later); every other verdict drops the record.
    """

    APPENDED = "APPENDED"
    NON_IDEMPOTENT = "NON_IDEMPOTENT"
    MALFORMED = "MALFORMED"
    CAPACITY = "CAPACITY"
    FENCE = "FENCE"
    UNKNOWN_PID = "UNKNOWN_PID"
    FENCED = "FENCED"
    INVALID_GENERATION = "INVALID_GENERATION"
    DUPLICATE = "DUPLICATE"
    BUFFERED = "BUFFERED"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    #: Would create an entry or move the generation without a valid ``pfc`` certificate
    #: (DESIGN §3 amended); appended last so the batch path's uint8 codes stay stable.
    FORGED = "FORGED"
    #: A producer the sink met first beyond its horizon (DESIGN §4 amended again), at a record
    #: without the certificate that adoption needs under signing. Not a forgery: a genuine
    #: producer's records before its next certificate. Appended last, as ``FORGED`` was.
    UNVERIFIED = "UNVERIFIED"

    @property
    def appended(self) -> bool:
        """True when the record is written to the output log."""
        return self in _APPENDED

    @property
    def final(self) -> bool:
        """False only for ``BUFFERED``: the record's fate is decided by a later call."""
        return self is not Verdict.BUFFERED


_APPENDED = frozenset({Verdict.APPENDED, Verdict.NON_IDEMPOTENT})
