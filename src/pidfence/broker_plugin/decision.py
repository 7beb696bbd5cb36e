"""The outcome of offering one record to a :class:`ProducerStateTable`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pidfence.wire import Verdict

#: Code → verdict for the uint8 ``verdict`` arrays of the batch path.
VERDICT_CODES: Final[tuple[Verdict, ...]] = tuple(Verdict)
#: Verdict → code.
CODE_OF: Final[dict[Verdict, int]] = {v: i for i, v in enumerate(VERDICT_CODES)}


@dataclass(frozen=True, slots=True)
class Decision:
    """One record's verdict. ``ref`` is whatever the caller passed with the record."""

    ref: Any
    verdict: Verdict
