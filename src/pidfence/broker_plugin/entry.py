"""The value types of the broker rules: entries, held records, gaps, verdict names, settings.

Shared by the rules kernel (:mod:`~pidfence.broker_plugin.rules`), the batch path and snapshots.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

from pidfence.wire import Verdict

NO_CLOCK: Final = -(2**63)

#: Internal decision: (caller's ref, verdict, batch token of the record or None).
Emit = tuple[Any, Verdict, "tuple[int, int] | None"]
#: ``verifier(pid, generation, seq, flags, cert, now_ms)``: None when ``cert`` (the record's
#: ``pfc`` header) proves the record (pid, generation, seq, flags), else the reason it does not
#: ("missing", "malformed", "other_identity", "expired", "other_place", ...). A verifier is made
#: for one (topic, partition): placed statements name both (DESIGN §3 amended again).
Verifier = Callable[[int, int, int, int, "bytes | None", int], "str | None"]

APPENDED: Final = Verdict.APPENDED
NON_IDEMPOTENT: Final = Verdict.NON_IDEMPOTENT
MALFORMED: Final = Verdict.MALFORMED
CAPACITY: Final = Verdict.CAPACITY
FENCE: Final = Verdict.FENCE
UNKNOWN_PID: Final = Verdict.UNKNOWN_PID
FENCED: Final = Verdict.FENCED
INVALID_GENERATION: Final = Verdict.INVALID_GENERATION
DUPLICATE: Final = Verdict.DUPLICATE
BUFFERED: Final = Verdict.BUFFERED
OUT_OF_ORDER: Final = Verdict.OUT_OF_ORDER
FORGED: Final = Verdict.FORGED
UNVERIFIED: Final = Verdict.UNVERIFIED

#: Why seqs are missing: ``lost`` (the reorder window overflowed past them), ``head`` (the
#: producer was adopted beyond the horizon at a later seq).
GapKind = Literal["lost", "head"]


@dataclass(frozen=True, slots=True)
class Gap:
    """Seqs ``first .. last`` of (pid, generation) that the table will never append.

    ``ref`` is the caller's ref of the record right after the gap (the sink passes Kafka
    offsets), ``kind`` says how the gap was found (see :data:`GapKind`).
    """

    pid: int
    generation: int
    first: int
    last: int
    ref: Any
    kind: GapKind


class Entry:
    """A live producer's state on this partition."""

    __slots__ = ("first_seen", "generation", "highwater", "serial")

    def __init__(self, generation: int, highwater: int, first_seen: int, serial: int) -> None:
        self.generation = generation
        self.highwater = highwater
        self.first_seen = first_seen
        self.serial = serial


@dataclass(slots=True)
class Held:
    """A record held for reordering until its predecessor arrives."""

    seq: int
    generation: int
    flags: int
    ts_ms: int
    arrival: int
    ref: Any
    #: (call id, row) of the batch call that held it; not part of snapshots.
    token: tuple[int, int] | None = None


_SETTING_MINIMUM: Final = {"capacity": 1, "lifetime_ms": 1, "reorder_window": 0, "grace_ms": 0}


class SettingOverrides(TypedDict, total=False):
    """Settings that replace a snapshot's when a table is restored or rebuilt (absent or
    ``None``: keep the snapshot's). Each is documented on
    :class:`~pidfence.broker_plugin.rules.RulesKernel`."""

    capacity: int | None
    lifetime_ms: int | None
    reorder_window: int | None
    grace_ms: int | None
    resolve_gaps: bool | None


def check_overrides(overrides: SettingOverrides) -> None:
    """Refuse unknown or impossible :class:`SettingOverrides`.

    Raises:
        TypeError: a keyword that is not a setting.
        ValueError: a setting is not an int or is below its minimum.
    """
    unknown = sorted(set(overrides) - set(SettingOverrides.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}")
    check_settings(
        capacity=overrides.get("capacity"),
        lifetime_ms=overrides.get("lifetime_ms"),
        reorder_window=overrides.get("reorder_window"),
        grace_ms=overrides.get("grace_ms"),
    )


def check_settings(**settings: int | None) -> None:
    """Refuse impossible table settings (``None`` = not given, skipped).

    Raises:
        ValueError: a setting is not an int or is below its minimum.
    """
    for name, value in settings.items():
        low = _SETTING_MINIMUM[name]
        if value is not None and (type(value) is not int or value < low):
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _timestamp(ts_ms: Any) -> int:
    """``ts_ms`` as an int (numpy ints are fine); the clock must stay an exact int."""
    if type(ts_ms) is int:
        return ts_ms
    if isinstance(ts_ms, numbers.Integral) and not isinstance(ts_ms, bool):
        return int(ts_ms)
    raise TypeError(
        f"ts_ms must be an int (epoch milliseconds, the Kafka record timestamp), "
        f"got {type(ts_ms).__name__} {ts_ms!r}; nothing was decided"
    )


def _integral(value: Any) -> Any:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def as_int_fields(pid: Any, generation: Any, seq: Any, flags: Any) -> tuple[Any, Any, Any, Any]:
    """numpy and other integral values as plain ints (anything else unchanged)."""
    return _integral(pid), _integral(generation), _integral(seq), _integral(flags)


#: ``ts_ms`` as an exact int (see :func:`_timestamp`).
as_timestamp = _timestamp
