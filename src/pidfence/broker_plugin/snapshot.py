"""Full and incremental snapshots of a :class:`RulesKernel`.

Framing: ``b"PFS1"`` + CRC32 (big-endian u32) of the payload + the msgpack payload. A full snapshot
holds every live entry in ring order (with its open holes) and every held and waiting record. A
delta holds only what changed since the previous snapshot or delta: entries created since then
(live ones, in ring order), entries updated since then, how many older entries expired from the
ring's head, the clock and the held and waiting records (bounded per producer, so small). Deltas
are chained by epoch; applying a delta to the wrong base raises :class:`CorruptSnapshot`, as does
any damage at all.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Final, TypeVar, Unpack

import msgpack

from pidfence.broker_plugin.entry import (
    MAX_HOLES,
    Entry,
    Held,
    Pending,
    SettingOverrides,
    check_overrides,
)
from pidfence.broker_plugin.errors import CorruptSnapshot
from pidfence.broker_plugin.rules import RulesKernel

MAGIC: Final = b"PFS1"
#: Version 3 adds the open holes of each entry and the records waiting on the authority.
VERSION: Final = 3
K = TypeVar("K", bound=RulesKernel)
V = TypeVar("V")
_HEADER = struct.Struct(">4sI")


def _frame(payload: dict[str, Any]) -> bytes:
    try:
        body = msgpack.packb(payload)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"cannot snapshot: a held record's ref is not msgpack-serialisable ({exc}); "
            "pass ints, strings, bytes or tuples of them as refs"
        ) from exc
    return _HEADER.pack(MAGIC, zlib.crc32(body)) + body


def _unframe(data: bytes, kind: str) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CorruptSnapshot(f"snapshot must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise CorruptSnapshot(f"snapshot truncated ({len(data)} bytes)")
    magic, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptSnapshot(f"bad magic {magic!r}: not a pidfence state snapshot")
    body = data[_HEADER.size :]
    if zlib.crc32(body) != crc:
        raise CorruptSnapshot("CRC mismatch: the snapshot is damaged")
    try:
        payload = msgpack.unpackb(body, strict_map_key=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptSnapshot(f"undecodable snapshot body: {exc}") from exc
    if not isinstance(payload, dict):
        raise CorruptSnapshot("snapshot body is not a map")
    if payload.get("v") != VERSION:
        raise CorruptSnapshot(f"unsupported snapshot version {payload.get('v')!r}")
    if payload.get("kind") != kind:
        raise CorruptSnapshot(f"expected a {kind} snapshot, got {payload.get('kind')!r}")
    return payload


def _held_rows(table: RulesKernel) -> list[list[Any]]:
    return [
        [pid, h.seq, h.generation, h.flags, h.ts_ms, h.arrival, h.ref]
        for pid, by_seq in table.held.items()
        for h in by_seq.values()
    ]


def _pending_rows(table: RulesKernel) -> list[list[Any]]:
    return [
        [pid, w.generation, w.expire_ms]
        + [[h.seq, h.generation, h.flags, h.ts_ms, h.arrival, h.ref] for h in w.records]
        for pid, w in table.pending.items()
    ]


def _mark_clean(table: RulesKernel, epoch: int) -> None:
    table.epoch = epoch
    table.base_serial = table.next_serial
    table.touched.clear()
    table.expired_since = 0


def full_snapshot(table: RulesKernel) -> bytes:
    """Every live entry (ring order) and every held record."""
    epoch = table.epoch + 1
    entries = [
        [pid, serial, e.generation, e.highwater, e.first_seen, e.holes]
        for pid, serial in table.ring
        for e in (table.entries[pid],)
    ]
    data = _frame(
        {
            "v": VERSION,
            "kind": "full",
            "epoch": epoch,
            "cfg": [
                table.capacity,
                table.lifetime_ms,
                table.reorder_window,
                table.grace_ms,
                int(table.resolve_gaps),
            ],
            "entries": entries,
            **_moving(table),
        }
    )
    _mark_clean(table, epoch)
    return data


def delta_snapshot(table: RulesKernel) -> bytes:
    """What changed since the previous snapshot; work proportional to the producers touched."""
    epoch = table.epoch + 1
    updated: list[list[Any]] = []
    for pid in table.touched:
        entry = table.entries.get(pid)
        if entry is not None and entry.serial < table.base_serial:
            updated.append([pid, entry.generation, entry.highwater, entry.holes])
    # Entries created since the last snapshot are the ring's tail (creation order).
    tail = []
    for pid, serial in _reverse_ring(table):
        if serial < table.base_serial:
            break
        e = table.entries[pid]
        tail.append([pid, serial, e.generation, e.highwater, e.first_seen, e.holes])
    data = _frame(
        {
            "v": VERSION,
            "kind": "delta",
            "prev": table.epoch,
            "epoch": epoch,
            "expired": table.expired_since,
            "new": tail[::-1],
            "updated": sorted(updated, key=lambda row: row[0]),
            **_moving(table),
        }
    )
    _mark_clean(table, epoch)
    return data


def _moving(table: RulesKernel) -> dict[str, Any]:
    """What a full snapshot and a delta both carry whole: counters, held and waiting records."""
    return {
        "clock": table.clock,
        "horizon": table.horizon,
        "serial": table.next_serial,
        "arrival": table.next_arrival,
        "held": _held_rows(table),
        "pending": _pending_rows(table),
        "unconfirmed": sorted(table.unconfirmed),
        "stale": sorted(table.stale),
    }


def _reverse_ring(table: RulesKernel) -> Any:
    ring = table.ring
    n = len(ring)
    # EntryRing exposes forward iteration only; index from the tail without copying the ring.
    for i in range(n - 1, -1, -1):
        slot = (ring._head + i) % ring.capacity
        yield ring._pids[slot], ring._serials[slot]


class _CapacityOverride(Exception):
    """A capacity override too small for the snapshot (raised to the caller as ValueError)."""


def _given(override: V | None, stored: V) -> V:
    return stored if override is None else override


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise CorruptSnapshot(f"{what}: expected int, got {type(value).__name__}")
    return value


def _entry_row(row: Any) -> list[Any]:
    """``[pid, serial, generation, highwater, first_seen, holes]``."""
    if not isinstance(row, list) or len(row) != 6:
        raise CorruptSnapshot(
            "entry row must be [pid, serial, generation, highwater, first_seen, holes]"
        )
    return [*(_int(v, "entry field") for v in row[:5]), _holes(row[5])]


def _holes(raw: Any) -> list[list[int]] | None:
    """Open holes as stored: None, or sorted disjoint ``[first, last]`` ranges."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_HOLES:
        raise CorruptSnapshot(f"holes must be 1..{MAX_HOLES} ranges")
    last = -1
    for hole in raw:
        if not isinstance(hole, list) or len(hole) != 2:
            raise CorruptSnapshot("a hole must be [first, last]")
        first, end = _int(hole[0], "hole"), _int(hole[1], "hole")
        if not last < first <= end:
            raise CorruptSnapshot("holes must be sorted, disjoint ranges")
        last = end
    return [list(hole) for hole in raw]


def restore_chain(
    cls: type[K], full: bytes, deltas: list[bytes], **overrides: Unpack[SettingOverrides]
) -> K:
    """Apply ``deltas`` to ``full`` and build the table (see module docstring).

    Raises:
        CorruptSnapshot: any damage to ``full`` or a delta, or a delta applied to the wrong base.
        ValueError: an override is impossible, or ``capacity`` is below the snapshot's live
            entries (a caller's mistake, not damage: falling back to an older snapshot would not
            help).
    """
    check_overrides(overrides)
    try:
        return _restore(cls, full, deltas, overrides)
    except CorruptSnapshot:
        raise
    except _CapacityOverride as exc:
        raise ValueError(str(exc)) from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as exc:
        raise CorruptSnapshot(f"inconsistent snapshot: {exc.__class__.__name__}: {exc}") from exc


def _restore(cls: type[K], full: bytes, deltas: list[bytes], overrides: SettingOverrides) -> K:
    payload = _unframe(full, "full")
    cfg = payload["cfg"]
    if not isinstance(cfg, list) or len(cfg) != 5:
        raise CorruptSnapshot(
            "cfg must be [capacity, lifetime_ms, reorder_window, grace_ms, resolve_gaps]"
        )
    cap, life, window, grace = (_int(v, "cfg") for v in cfg[:4])
    gaps = bool(_int(cfg[4], "cfg"))
    epoch = _int(payload["epoch"], "epoch")
    rows = [_entry_row(r) for r in payload["entries"]]
    state = payload
    for raw in deltas:
        delta = _unframe(raw, "delta")
        if _int(delta["prev"], "prev") != epoch:
            raise CorruptSnapshot(
                f"delta follows epoch {delta['prev']} but the chain is at epoch {epoch}"
            )
        epoch = _int(delta["epoch"], "epoch")
        expired = _int(delta["expired"], "expired")
        if not 0 <= expired <= len(rows):
            raise CorruptSnapshot(f"delta expires {expired} of {len(rows)} entries")
        rows = rows[expired:]
        index = {row[0]: row for row in rows}
        for upd in delta["updated"]:
            if not isinstance(upd, list) or len(upd) != 4:
                raise CorruptSnapshot("updated row must be [pid, generation, highwater, holes]")
            pid, gen, high = (_int(v, "updated field") for v in upd[:3])
            if pid not in index:
                raise CorruptSnapshot(f"delta updates pid {pid}, which the base does not hold")
            index[pid][2], index[pid][3] = gen, high
            index[pid][5] = _holes(upd[3])
        rows.extend(_entry_row(r) for r in delta["new"])
        state = delta
    capacity = overrides.get("capacity")
    table = cls(
        cap if capacity is None else capacity,
        _given(overrides.get("lifetime_ms"), life),
        _given(overrides.get("reorder_window"), window),
        _given(overrides.get("grace_ms"), grace),
        resolve_gaps=_given(overrides.get("resolve_gaps"), gaps),
    )
    if len(rows) > table.capacity:
        if capacity is not None and len(rows) <= cap:
            raise _CapacityOverride(
                f"the snapshot holds {len(rows)} live entries; restore with capacity >= "
                f"{len(rows)} (got {capacity}) or leave capacity unset"
            )
        raise CorruptSnapshot(f"{len(rows)} entries exceed capacity {table.capacity}")
    last_serial = -1
    last_seen = -(2**63)
    for pid, serial, gen, high, first_seen, holes in rows:
        if pid in table.entries or pid <= 0:
            raise CorruptSnapshot(f"pid {pid} is duplicated or invalid")
        if serial <= last_serial or first_seen < last_seen:
            raise CorruptSnapshot("entries are not in creation order")
        if gen < 0 or high < -1 or (holes and holes[-1][1] > high):
            raise CorruptSnapshot(f"pid {pid} has an invalid generation, highwater or hole")
        last_serial, last_seen = serial, first_seen
        table.entries[pid] = Entry(gen, high, first_seen, serial, holes)
        table.ring.append(pid, serial)
    table.clock = _int(state["clock"], "clock")
    table.horizon = _int(state["horizon"], "horizon")
    table.next_serial = _int(state["serial"], "serial")
    table.next_arrival = _int(state["arrival"], "arrival")
    if table.next_serial <= last_serial:
        raise CorruptSnapshot("serial counter is behind the entries")
    for row in state["held"]:
        if not isinstance(row, list) or len(row) != 7:
            raise CorruptSnapshot("held row must have 7 fields")
        pid, seq, gen, flags, ts, arrival = (_int(v, "held field") for v in row[:6])
        if pid not in table.entries:
            raise CorruptSnapshot(f"held record of pid {pid}, which has no entry")
        ref = row[6]
        by_seq = table.held.setdefault(pid, {})
        if seq in by_seq or arrival >= table.next_arrival:
            raise CorruptSnapshot(f"held record {pid}/{seq} is inconsistent")
        by_seq[seq] = Held(seq, gen, flags, ts, arrival, _freeze(ref))
    for row in state["pending"]:
        _restore_pending(table, row)
    for pid in state["unconfirmed"]:
        if _int(pid, "unconfirmed pid") not in table.entries:
            raise CorruptSnapshot(f"unconfirmed pid {pid} has no entry")
        table.unconfirmed.add(pid)
    for pid in state["stale"]:
        if _int(pid, "stale pid") not in table.entries:
            raise CorruptSnapshot(f"stale pid {pid} has no entry")
        table.stale.add(pid)
    _mark_clean(table, epoch)
    return table


def _restore_pending(table: RulesKernel, row: Any) -> None:
    """One waiting pid: ``[pid, generation, expire_ms, [seq, gen, flags, ts, arrival, ref]...]``."""
    if not isinstance(row, list) or len(row) < 4:
        raise CorruptSnapshot("pending row must be [pid, generation, expire_ms, record...]")
    pid, gen, expire = (_int(v, "pending field") for v in row[:3])
    if pid in table.pending or pid <= 0:
        raise CorruptSnapshot(f"waiting records of pid {pid} are inconsistent")
    records = []
    for rec in row[3:]:
        if not isinstance(rec, list) or len(rec) != 6:
            raise CorruptSnapshot("a waiting record must have 6 fields")
        seq, g, flags, ts, arrival = (_int(v, "pending field") for v in rec[:5])
        if arrival >= table.next_arrival:
            raise CorruptSnapshot(f"waiting record {pid}/{seq} is inconsistent")
        records.append(Held(seq, g, flags, ts, arrival, _freeze(rec[5])))
    table.pending[pid] = Pending(gen, expire, records)


def _freeze(ref: Any) -> Any:
    """msgpack turns tuples into lists; give callers their tuples back (hashable refs)."""
    if isinstance(ref, list):
        return tuple(_freeze(r) for r in ref)
    return ref
