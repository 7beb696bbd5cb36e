"""The value types of the broker rules: entries, held records, gaps, verdict names, settings.

Shared by the rules kernel (:mod:`~pidfence.broker_plugin.rules`), the batch path and snapshots.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict

from pidfence.wire import PidStatus, Verdict

NO_CLOCK: Final = -(2**63)
#: Most open holes (ranges of skipped seqs) one producer keeps; past it a gap is not skipped.
MAX_HOLES: Final = 16
#: Most records of one pid held while they wait for the log to show them before the next
#: generations' FENCEs (see :class:`Pending`); past it the wait ends: they are ``FENCED``.
PENDING_LIMIT: Final = 256

#: Internal decision: (caller's ref, verdict, batch token of the record or None).
Emit = tuple[Any, Verdict, "tuple[int, int] | None"]
#: ``verifier(pid, generation, seq, flags, cert, now_ms)``: None when ``cert`` (the record's
#: ``pfc`` header) proves the record (pid, generation, seq, flags), else the reason it does not
#: ("missing", "malformed", "other_identity", "expired", "other_place", ...). A verifier is made
#: for one (topic, partition): placed statements name both (DESIGN §3 amended again).
Verifier = Callable[[int, int, int, int, "bytes | None", int], "str | None"]
#: ``authority(pid)``: what the lease authority says of ``pid`` (the lease servers' ``describe``),
#: or None when it has no answer. Asked only where the table could not have seen a producer start
#: (inside a horizon), and for records waiting on an answer (see :class:`Pending`).
Authority = Callable[[int], "PidStatus | None"]


#: What a gap report says: ``lost`` (the reorder window overflowed past seqs that never came:
#: they stay open, see :class:`Entry`), ``head`` (the producer was adopted beyond the horizon at
#: a later seq: its earlier seqs were before the table's view), ``filled`` (a record arrived late
#: for an open hole and was appended).
GapKind = Literal["lost", "head", "filled"]


@dataclass(frozen=True, slots=True)
class Gap:
    """Seqs ``first .. last`` of (pid, generation) the table skipped, did not see, or filled late.

    ``ref`` is the caller's ref of the record right after the gap (the sink passes Kafka
    offsets), ``kind`` says how the gap was found (see :data:`GapKind`).
    """

    pid: int
    generation: int
    first: int
    last: int
    ref: Any
    kind: GapKind


@dataclass(slots=True, eq=False)
class Entry:
    """A live producer's state on this partition.

    ``holes`` are the open holes below ``highwater``: sorted, disjoint ``[first, last]`` seq
    ranges a gap skipped (at most :data:`MAX_HOLES`), or None. A record that fills one is still
    appended (DESIGN §4 amended a third time: a skipped gap stays open).
    """

    generation: int
    highwater: int
    first_seen: int
    serial: int
    holes: list[list[int]] | None = None


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


@dataclass(slots=True)
class Pending:
    """Records of a pid met where the table could not see it start, at a generation older than
    the one the authority named: each may be a zombie's record written after a FENCE the table
    never saw, or a record written before the next generation's FENCE. They wait, in arrival
    order, until the log shows which: the FENCEs of each next generation, in order, up to the
    authority's (they came before them and are adopted), or anything else (they are
    ``FENCED``, as they are once the lease ends, ``expire_ms`` plus the grace: no FENCE of it
    can follow). ``generation`` is the newest waiting generation (the last FENCE waiting).
    """

    generation: int
    expire_ms: int
    records: list[Held]


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
        value = ts_ms
    elif isinstance(ts_ms, numbers.Integral) and not isinstance(ts_ms, bool):
        value = int(ts_ms)
    else:
        raise TypeError(
            f"ts_ms must be an int (epoch milliseconds, the Kafka record timestamp), "
            f"got {type(ts_ms).__name__} {ts_ms!r}; nothing was decided"
        )
    if -(2**63) <= value < 2**63:
        return value
    raise ValueError(f"ts_ms {value} is outside Kafka's int64 timestamps; nothing was decided")


def _integral(value: Any) -> Any:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return value


def as_int_fields(pid: Any, generation: Any, seq: Any, flags: Any) -> tuple[Any, Any, Any, Any]:
    """numpy and other integral values as plain ints (anything else unchanged)."""
    return _integral(pid), _integral(generation), _integral(seq), _integral(flags)


#: ``ts_ms`` as an exact int (see :func:`_timestamp`).
as_timestamp = _timestamp
