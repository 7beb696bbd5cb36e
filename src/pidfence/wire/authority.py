"""What the lease authority says of one pid: the answer of the lease server's ``describe``.

The lease servers are the authority on a pid's generation and lease (DESIGN §4 amended a third
time): a sink that could not see a producer start asks them before it adopts the producer. The
answer travels from the server to the sink and is recorded with the batch it decided, so both
sides agree on it byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class PidState(StrEnum):
    """A pid's lease as the authority knows it.

    ``live``: leased, not rolled, lease not ended. ``retired``: rolled into a successor (its
    generation is final). ``ended``: its lease ended (never rolled). ``unknown``: never issued,
    past its retention, or issued by a server that does not know it (another server's pid it
    holds no record of): the sink adopts nothing on such an answer.
    """

    LIVE = "live"
    RETIRED = "retired"
    ENDED = "ended"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PidStatus:
    """The authority's answer about ``pid``.

    Attributes:
        pid: the pid asked about.
        state: see :class:`PidState`.
        generation: the pid's current generation (its last one when retired); -1 when unknown.
        expire_ms: its lease end (epoch ms; for an ended pid whose exact end the server no
            longer knows, the earliest end it can have had); 0 when unknown.
    """

    pid: int
    state: PidState
    generation: int = -1
    expire_ms: int = 0

    @property
    def known(self) -> bool:
        """Whether the authority vouches for anything about the pid."""
        return self.state is not PidState.UNKNOWN

    def to_list(self) -> list[Any]:
        """``[pid, state, generation, expire_ms]``: how a batch records the answer."""
        return [self.pid, self.state.value, self.generation, self.expire_ms]

    @classmethod
    def from_list(cls, row: Any) -> PidStatus:
        """The answer back from :meth:`to_list`.

        Raises:
            ValueError: ``row`` is not such a list.
        """
        if (
            not isinstance(row, list | tuple)
            or len(row) != 4
            or not all(type(n) is int for n in (row[0], row[2], row[3]))
            or not isinstance(row[1], str)
            or row[1] not in {s.value for s in PidState}
        ):
            raise ValueError(
                f"a recorded authority answer is [pid, state, generation, expire_ms], not {row!r}"
            )
        pid, state, generation, expire_ms = row
        return cls(pid, PidState(state), generation, expire_ms)

    @classmethod
    def unknown(cls, pid: int) -> PidStatus:
        """The answer that vouches for nothing."""
        return cls(pid, PidState.UNKNOWN)
