"""The downstream job of seed 003: unique users per minute, as a pure pyarrow function.

Each record value is a JSON object with ``uid`` (any JSON scalar, compared as text) and ``ts``, the
event time as Unix time: a value below ``10**11`` is seconds (fractions allowed), otherwise
milliseconds (``10**11`` s is the year 5138, ``10**11`` ms is 1973). The minute of an event is
``floor(ts_ms / 60000) * 60000`` (epoch ms). Values that are not JSON objects with both fields are
counted in :func:`unique_users_per_minute`'s ``skipped`` metadata, never silently mixed in.

Duplicates and zombie writes cannot inflate a *distinct* count, but they inflate the per-minute
``events`` count, and a zombie that re-processes with a fresh clock or uid mapping (or any loss)
moves ``users``; so the result carries both, and the demo compares the raw topic, the output log and
the truth from :func:`truth_from_ledger`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Final

import pyarrow as pa

from pidfence.ledger import LedgerEntry, value_digest
from pidfence.verify.errors import VerifyInputError

_SECONDS_BELOW: Final = 10**11
_MINUTE_MS: Final = 60_000

RESULT_SCHEMA: Final = pa.schema(
    [("minute", pa.int64()), ("users", pa.int64()), ("events", pa.int64())]
)


def event_ms(ts: Any) -> int:
    """Event time in epoch milliseconds from a ``ts`` in seconds or milliseconds (see module)."""
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        # json.loads accepts NaN and Infinity; int() of them raises OverflowError, not ValueError.
        raise VerifyInputError(f"ts must be a number of seconds or milliseconds, got {ts!r}")
    if isinstance(ts, int):
        return ts * 1000 if abs(ts) < _SECONDS_BELOW else ts
    # round, not truncate: 1.001 * 1000 is 1000.99... in binary floating point.
    return round(ts * 1000) if abs(ts) < _SECONDS_BELOW else round(ts)


def parse_event(value: bytes | str | None) -> tuple[str, int] | None:
    """``(uid, event_ms)`` of one record value, or ``None`` when it is not a usable event."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
        if not isinstance(doc, dict) or "uid" not in doc or "ts" not in doc:
            return None
        return str(doc["uid"]), event_ms(doc["ts"])
    except (ValueError, UnicodeDecodeError):
        return None


def unique_users_per_minute(table: pa.Table) -> pa.Table:
    """Distinct ``uid`` per event-time minute, from any table with a ``value`` column.

    Args:
        table: raw topic records or the output log (only ``value`` is read).

    Returns:
        Columns ``minute`` (epoch ms of the minute start), ``users`` (distinct uids) and
        ``events`` (records), sorted by minute. ``schema.metadata[b"skipped"]`` is the number
        of values that were not events.
    """
    if "value" not in table.column_names:
        raise VerifyInputError("unique_users_per_minute needs a 'value' column of JSON records")
    return _aggregate(table.column("value").to_pylist())


def truth_from_ledger(ledger: Iterable[LedgerEntry], values: pa.Table) -> pa.Table:
    """The true per-minute counts: each event that reached Kafka counted exactly once.

    An event is a distinct value: a zombie's fenced copy of an event and its replacement's copy
    (under the same pid, or under a new pid after a lease rollover) are one event, counted once.

    The ledger holds digests, not values, so the values come from a table that contains every
    acknowledged record at least once (the raw topic, columns ``pid, partition, seq, value`` and
    ``topic``). Each ledger identity ``(pid, topic, partition, seq)`` is looked up there, with its
    digest checked; records the ledger does not name (the ``pf`` opt-out, pid 0) are all counted.
    So are, once per distinct value, records with a pid that no ledger names: a producer killed
    after Kafka wrote a record but before its acknowledgement reached the ledger sent a real
    event, and its resumer skips what the recovery scan finds in Kafka instead of re-sending it,
    so no ledger will ever name it (the checker calls these ``unacknowledged``).

    Args:
        ledger: acknowledged records (fence entries are ignored).
        values: the raw topic's records, with the header fields decoded into columns.

    Raises:
        ValueError: an acknowledged record's value is missing from ``values`` (say which).
    """
    wanted = {(e.pid, e.topic, e.partition, e.seq): e.digest for e in ledger if not e.fence}
    cols = {c: values.column(c).to_pylist() for c in ("pid", "topic", "partition", "seq", "value")}
    found: dict[tuple[int, str, int, int], bytes | None] = {}
    extra: list[bytes | None] = []
    unnamed: list[bytes | None] = []
    for pid, topic, partition, seq, value in zip(*cols.values(), strict=True):
        if not pid:
            extra.append(value)
            continue
        ident = (int(pid), str(topic), int(partition), int(seq))
        digest = wanted.get(ident)
        if digest is None:
            unnamed.append(value)
        elif ident not in found and value_digest(value) == digest:
            found[ident] = value
    missing = [ident for ident in wanted if ident not in found]
    if missing:
        raise VerifyInputError(
            f"{len(missing)} acknowledged record(s) have no value in the table, e.g. "
            f"{missing[:3]} (pid, topic, partition, seq); pass the raw topic's records"
        )
    distinct = {value_digest(v): v for v in (*found.values(), *unnamed) if v}
    return _aggregate([*distinct.values(), *extra])


def _aggregate(values: list[Any]) -> pa.Table:
    users: dict[int, set[str]] = defaultdict(set)
    events: dict[int, int] = defaultdict(int)
    skipped = 0
    for value in values:
        event = parse_event(value)
        if event is None:
            skipped += 1
            continue
        uid, ms = event
        minute = ms // _MINUTE_MS * _MINUTE_MS
        users[minute].add(uid)
        events[minute] += 1
    minutes = sorted(users)
    schema = RESULT_SCHEMA.with_metadata({b"skipped": str(skipped).encode()})
    return pa.table(
        {
            "minute": pa.array(minutes, pa.int64()),
            "users": pa.array([len(users[m]) for m in minutes], pa.int64()),
            "events": pa.array([events[m] for m in minutes], pa.int64()),
        },
        schema=schema,
    )
