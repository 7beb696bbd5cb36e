"""The batch path: many records at once, the same decisions as one-by-one ``offer_header``.

Most records of a healthy stream are boring: a known producer's next sequence number, or an exact
resend of one already appended. This module decides those with numpy, per producer, and sends every
producer with anything unusual in the batch (a gap, a fence, a generation change, held records, an
expiry or a capacity limit in reach, a new producer whose certificate does not verify) through the
exact per-record rules in record order. Both paths write the same state, so the result is identical
to ``offer_header`` record by record (a property test holds it to that).

The clock moves only with records that land (DESIGN §4 amended): fast-path rows that are appended
and header-less rows move it; for each exact-path row the clock is first brought up to the landed
fast rows before it, then the row is decided exactly as ``offer`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pidfence.broker_plugin.decision import CODE_OF, VERDICT_CODES, Decision
from pidfence.broker_plugin.decode import DecodedHeaders, decode_headers
from pidfence.broker_plugin.entry import NO_CLOCK, Emit
from pidfence.broker_plugin.rules import RulesKernel
from pidfence.wire import Verdict

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
BoolArr = npt.NDArray[np.bool_]

_APPENDED: Final = CODE_OF[Verdict.APPENDED]
_DUPLICATE: Final = CODE_OF[Verdict.DUPLICATE]
_NON_IDEMPOTENT: Final = CODE_OF[Verdict.NON_IDEMPOTENT]
_MALFORMED: Final = CODE_OF[Verdict.MALFORMED]
_FORGED: Final = CODE_OF[Verdict.FORGED]
_UNDECIDED: Final = 255
# Sequences this large go through the exact path, so relative arithmetic cannot overflow.
_SEQ_FAST_LIMIT: Final = 2**62


@dataclass
class BatchResult:
    """Decisions of one :func:`offer_batch` call, aligned to its input rows.

    ``verdict`` holds uint8 codes (``VERDICT_CODES[code]`` is the :class:`Verdict`; rows still held
    when the call ended are ``BUFFERED``). ``pid``, ``generation``, ``seq`` and ``flags`` are the
    decoded headers (0 where missing or malformed). ``log_order`` lists what was appended, in log
    order: ``i >= 0`` is input row ``i``; ``i < 0`` is ``released[-i - 1]``, a record held by an
    earlier call and appended during this one. ``released`` also holds the final verdicts of earlier
    calls' held records that this call dropped.
    """

    verdict: U8
    pid: I64
    generation: I64
    seq: I64
    flags: U8
    log_order: I64
    released: list[Decision] = field(default_factory=list)

    def verdicts(self) -> list[Verdict]:
        """The verdicts as enum members."""
        return [VERDICT_CODES[c] for c in self.verdict.tolist()]

    def counts(self) -> dict[Verdict, int]:
        """How many rows got each verdict."""
        codes, counts = np.unique(self.verdict, return_counts=True)
        return {
            VERDICT_CODES[c]: int(n) for c, n in zip(codes.tolist(), counts.tolist(), strict=True)
        }


def _cert_list(certs: Any, n: int) -> list[bytes | None]:
    if certs is None:
        return [None] * n
    if isinstance(certs, pa.ChunkedArray | pa.Array):
        values: list[bytes | None] = certs.to_pylist()
    else:
        values = list(certs)
    if len(values) != n:
        raise ValueError(f"certs has {len(values)} items for {n} headers")
    return values


def offer_batch(
    table: RulesKernel,
    headers: pa.Array | Sequence[bytes | None],
    ts_ms: Any,
    refs: Sequence[Any] | None = None,
    certs: pa.Array | Sequence[bytes | None] | None = None,
    forged: BoolArr | Sequence[bool] | None = None,
    forged_reason: str = "mac",
) -> BatchResult:
    """Decide a batch of records in order; identical to ``offer_header`` row by row.

    Args:
        table: the partition's state (updated in place).
        headers: the ``pf`` header value of each record (``None``/null when absent), as a pyarrow
            binary array or a sequence of bytes.
        ts_ms: each record's timestamp (int64 array-like), the table's only clock.
        refs: what to remember for records that stay held past this call (default: row index);
            must be msgpack-serialisable if the table is snapshotted while they are held.
        certs: each record's ``pfc`` header value (``None`` when absent); read only for records
            the table's verifier must check.
        forged: rows the caller already knows are forged (e.g. a per-record MAC that does not
            verify): an idempotent one is ``FORGED`` without reaching the rules, so it changes
            no state, and counts under ``forged_reason`` in ``table.forged``.
    """
    dec = decode_headers(headers)
    n = len(dec.pid)
    ts = np.asarray(ts_ms, dtype=np.int64)
    if ts.shape != (n,):
        raise ValueError(f"ts_ms has shape {ts.shape}, expected ({n},)")
    if refs is not None and len(refs) != n:
        raise ValueError(f"refs has {len(refs)} items for {n} headers")
    verdict = np.full(n, _UNDECIDED, dtype=np.uint8)
    if n == 0:
        return BatchResult(
            verdict, dec.pid, dec.generation, dec.seq, dec.flags, np.empty(0, np.int64)
        )
    verdict[~dec.present | (dec.present & ~dec.malformed & (dec.pid == 0))] = _NON_IDEMPOTENT
    verdict[dec.malformed] = _MALFORMED
    candidate = dec.present & ~dec.malformed & (dec.pid != 0)
    if forged is not None:
        refused = np.asarray(forged, dtype=bool)
        if refused.shape != (n,):
            raise ValueError(f"forged has shape {refused.shape}, expected ({n},)")
        refused = refused & candidate
        count = int(refused.sum())
        if count:
            verdict[refused] = _FORGED
            candidate &= ~refused
            table.forged[forged_reason] = table.forged.get(forged_reason, 0) + count
    plan = _plan(table, dec, candidate, ts, certs)
    fast_rows, fast_codes, final_states, creations, slow_rows = plan
    verdict[fast_rows] = fast_codes
    # The clock as the landed non-exact rows move it: appended fast rows and header-less rows.
    landed = np.full(n, NO_CLOCK, dtype=np.int64)
    appended_fast = fast_rows[fast_codes == _APPENDED]
    landed[appended_fast] = ts[appended_fast]
    opt_out_rows = verdict == _NON_IDEMPOTENT
    landed[opt_out_rows] = ts[opt_out_rows]
    landed_clock = np.maximum.accumulate(landed)

    # Tokens of this call's rows are cleared before returning, so any constant tells them apart
    # from records held by earlier calls (whose token is None).
    call = 0
    events_time: list[int] = []
    events_sub: list[int] = []
    events_idx: list[int] = []
    released: list[Decision] = []

    def collect(out: list[Emit], time: int) -> None:
        for sub, (ref, v, token) in enumerate(out, start=1):
            if token is not None and token[0] == call:
                row = token[1]
                verdict[row] = CODE_OF[v]
                if v is Verdict.APPENDED:
                    events_time.append(time)
                    events_sub.append(sub)
                    events_idx.append(row)
            else:
                released.append(Decision(ref, v))
                if v is Verdict.APPENDED:
                    events_time.append(time)
                    events_sub.append(sub)
                    events_idx.append(-len(released))

    if len(slow_rows) or creations:
        pid_l, gen_l, seq_l = dec.pid.tolist(), dec.generation.tolist(), dec.seq.tolist()
        flags_l, ts_l, clock_l = dec.flags.tolist(), ts.tolist(), landed_clock.tolist()
        cert_l = _cert_list(certs, n) if len(slow_rows) else []
    ci = 0
    out: list[Emit] = []

    def create_upto(row: int) -> None:
        nonlocal ci
        while ci < len(creations) and creations[ci][0] < row:
            c_row, c_pid, c_gen = creations[ci]
            out.clear()
            table.advance(clock_l[c_row], out)
            table.create(c_pid, c_gen, 0, table.clock)
            collect(out, c_row)
            ci += 1

    for r in slow_rows.tolist():
        create_upto(r)
        out.clear()
        if r:
            table.advance(clock_l[r - 1], out)
        ref = refs[r] if refs is not None else r
        table.decide(
            pid_l[r], gen_l[r], seq_l[r], flags_l[r], ts_l[r], ref, out, (call, r), cert_l[r]
        )
        collect(out, r)
    create_upto(n)
    for pid, gen, high in final_states:
        entry = table.entries[pid]
        if high != entry.highwater:
            table.stale.discard(pid)  # as the per-record rules: the next seq landed
        entry.generation = gen
        entry.highwater = high
    out.clear()
    table.advance(int(landed_clock[-1]), out)
    collect(out, n)
    # Rows held by this call and still waiting keep their token; make it opaque to later calls.
    for h in table.waiting():
        if h.token is not None and h.token[0] == call:
            h.token = None
    # Header-less and pid-0 records are appended too (DESIGN §4), at their own position.
    opt_out = np.flatnonzero(opt_out_rows)
    log_order = _merge_log(n, fast_rows, fast_codes, opt_out, events_time, events_sub, events_idx)
    return BatchResult(verdict, dec.pid, dec.generation, dec.seq, dec.flags, log_order, released)


def _ascending(rows: I64, n: int) -> I64:
    """Distinct row indices below ``n`` in ascending order (O(n), unlike a sort)."""
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    return np.flatnonzero(mask).astype(np.int64)


def _stable_order(values: I64) -> I64:
    """``np.argsort(values, kind="stable")``, by radix sort when the values span < 2**32.

    numpy radix-sorts 16-bit keys only; a wider span sorts by the low then the high 16 bits,
    which is stable and still linear.
    """
    if not len(values):
        return np.empty(0, np.int64)
    low = int(values.min())
    span = int(values.max()) - low
    if span >= 2**32:
        return np.argsort(values, kind="stable").astype(np.int64)
    rel = (values - low).astype(np.uint64)
    order = np.argsort((rel & np.uint64(0xFFFF)).astype(np.uint16), kind="stable")
    if span >= 2**16:
        high = (rel[order] >> np.uint64(16)).astype(np.uint16)
        order = order[np.argsort(high, kind="stable")]
    return order.astype(np.int64)


def _merge_log(
    n: int,
    fast_rows: I64,
    fast_codes: U8,
    opt_out: I64,
    times: list[int],
    subs: list[int],
    idx: list[int],
) -> I64:
    """Every appended record of an ``n``-row call in log order: rows decided at their own
    position (fast-path and opt-out rows) sort by row; a slow row's decisions sort by (row, order
    within the call)."""
    appended = np.concatenate([fast_rows[fast_codes == _APPENDED], opt_out])
    if not times:
        return _ascending(appended, n)
    all_time = np.concatenate([appended, np.asarray(times, dtype=np.int64)])
    all_sub = np.concatenate([np.zeros(len(appended), np.int64), np.asarray(subs, np.int64)])
    all_idx = np.concatenate([appended, np.asarray(idx, dtype=np.int64)])
    order = np.lexsort((all_sub, all_time))
    return all_idx[order].astype(np.int64)


def _cert_at(certs: Any, row: int) -> bytes | None:
    if certs is None:
        return None
    if isinstance(certs, pa.ChunkedArray | pa.Array):
        value: bytes | None = certs[row].as_py()
        return value
    item: bytes | None = certs[row]
    return item


def _plan(
    table: RulesKernel,
    dec: DecodedHeaders,
    candidate: BoolArr,
    ts: I64,
    certs: Any = None,
) -> tuple[I64, U8, list[tuple[int, int, int]], list[tuple[int, int, int]], I64]:
    """Split candidate rows into vectorised producers and exact-path rows.

    Returns (fast rows, their verdict codes, final (pid, generation, highwater) of fast producers,
    fast producers created in this batch as (row, pid, generation) in row order, slow rows).
    """
    rows = np.flatnonzero(candidate)
    empty_i = np.empty(0, np.int64)
    if not len(rows):
        return empty_i, np.empty(0, np.uint8), [], [], empty_i
    order = _stable_order(dec.pid[rows])
    sr = rows[order]
    sp, sg, ss, sf = dec.pid[sr], dec.generation[sr], dec.seq[sr], dec.flags[sr]
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    sizes = np.diff(np.r_[starts, len(sr)])
    gid = np.repeat(np.arange(len(starts)), sizes)
    upids = sp[starts].tolist()
    life = table.life
    # Bounds of the clock during the batch: it never passes the largest timestamp, and an entry
    # created here is created at or after its own record's timestamp.
    last_now = max(table.clock, int(ts.max()))
    first_now = max(table.clock, int(ts.min()))
    k = len(starts)
    base = np.empty(k, np.int64)
    cur_gen = np.empty(k, np.int64)
    exists = np.empty(k, bool)
    bad = np.zeros(k, bool)
    entries, held, pending = table.entries, table.held, table.pending
    lowest = np.minimum.reduceat(ss, starts)
    for i, pid in enumerate(upids):
        entry = entries.get(pid)
        if entry is None:
            exists[i], base[i], cur_gen[i] = False, -1, 0
            bad[i] = pid in pending
        else:
            exists[i], base[i], cur_gen[i] = True, entry.highwater, entry.generation
            # An entry that may expire during the batch changes its producer's verdicts mid-way;
            # a resend may fill an open hole (records all above its holes cannot).
            bad[i] = (
                entry.first_seen + life <= last_now
                or pid in held
                or pid in pending
                or (entry.holes is not None and lowest[i] <= entry.holes[-1][1])
                or pid in table.unconfirmed
            )
    n_new = int((~exists).sum())
    if len(entries) + n_new > table.capacity or (n_new and life <= last_now - first_now):
        # CAPACITY or expiry of new entries within reach: decide everything exactly.
        return empty_i, np.empty(0, np.uint8), [], [], rows
    g_first = sg[starts]
    bad |= np.logical_or.reduceat(
        (sg != g_first[gid]) | (sf != 0) | (ss >= _SEQ_FAST_LIMIT), starts
    )
    # A generation move (and, with a verifier, a new entry) is decided record by record.
    bad |= exists & (g_first != cur_gen)
    bad |= ~exists & (ss[starts] != 0)
    if table.authority is not None and table.horizon > first_now:
        bad |= ~exists  # inside a horizon the authority decides every new entry

    # Sequence shape: every record must be a resend (s <= max so far) or the next one.
    span = int(sizes.max()) + 2
    rel = np.clip(ss - base[gid], 0, span - 1)
    key = gid * span + rel
    running = np.maximum.accumulate(key)
    prev = np.empty_like(running)
    prev[1:] = running[:-1]
    prev[starts] = np.arange(k) * span
    prev_rel = prev - gid * span
    is_next = rel == prev_rel + 1
    is_dup = rel <= prev_rel
    bad |= np.logical_or.reduceat(~(is_next | is_dup), starts)
    if table.verifier is not None:
        # A new producer's first record must prove its generation. Checked at the latest clock
        # the batch can reach (a certificate valid then is valid earlier); a failure, or one
        # that might be a timing question, goes to the exact path, which decides and counts it.
        for i in np.flatnonzero(~exists & ~bad).tolist():
            row = int(sr[starts[i]])
            cert = _cert_at(certs, row)
            if table.verifier(upids[i], int(g_first[i]), 0, 0, cert, last_now) is not None:
                bad[i] = True
    row_bad = bad[gid]
    fast_sel = ~row_bad
    fast_rows = sr[fast_sel]
    fast_codes = np.where(is_next[fast_sel], _APPENDED, _DUPLICATE).astype(np.uint8)
    ends = np.r_[starts[1:], len(sr)] - 1
    high = base + (running[ends] - np.arange(k) * span)
    good = np.flatnonzero(~bad)
    final_states = [(upids[i], int(g_first[i]), int(high[i])) for i in good.tolist()]
    for i in good.tolist():
        if exists[i]:
            table.touched.add(upids[i])
    new_good = good[~exists[good]]
    creations = sorted((int(sr[starts[i]]), upids[i], int(g_first[i])) for i in new_good.tolist())
    slow_rows = _ascending(sr[row_bad], len(candidate))
    return fast_rows, fast_codes, final_states, creations, slow_rows
