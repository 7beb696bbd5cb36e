"""A reference model of DESIGN §4 for the broker-rules property tests.

A direct transcription of the §4 table with the plainest data structures (a dict and linear
scans), so the real table's ring, batch path and snapshots are checked against something
obviously right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pidfence.broker_plugin import (
    MAX_HOLES,
    PENDING_LIMIT,
)
from pidfence.wire import (
    FLAG_FENCE,
    MalformedHeader,
    PidStatus,
    Verdict,
    decode_pf,
)


class _Offer(NamedTuple):
    """One record as the reference model judges it: header fields, time, ref and certificate."""

    pid: int
    g: int
    s: int
    fence: bool
    ts: int
    ref: Any
    cert: bytes | None


@dataclass
class ReferenceTable:
    """DESIGN §4 (amended three times) with plain dicts, sets and scans; held records as a list.

    A record is judged at max(clock, its timestamp); only a record that lands (appended, FENCE or
    held) makes that the clock and expires entries; rejected records change nothing. Built as
    ``ReferenceTable(capacity, lifetime_ms, reorder_window, verifier=..., resolve_gaps=...,
    authority=...)``. Open holes are a set of seqs per entry; records waiting on the authority a
    list per pid.
    """

    capacity: int
    lifetime: int
    window: int = 5
    verifier: Callable[[int, int, int, int, bytes | None, int], str | None] | None = None
    resolve_gaps: bool = False
    authority: Callable[[int], PidStatus | None] | None = None
    entries: dict[int, list[Any]] = field(default_factory=dict, init=False)
    """pid -> [gen, high, first_seen, order, open hole seqs]"""
    held: list[dict[str, Any]] = field(default_factory=list, init=False)
    #: pid -> {"gen", "expire", "recs": [{"seq", "gen", "fence", "ts", "ref", "arrival"}]}
    pending: dict[int, dict[str, Any]] = field(default_factory=dict, init=False)
    clock: int = field(default=-(2**63), init=False)
    horizon: int = field(default=-(2**63), init=False)
    order: int = field(default=0, init=False)
    arrival: int = field(default=0, init=False)
    vouched: tuple[int, int] | None = field(default=None, init=False)
    unconfirmed: set[int] = field(default_factory=set, init=False)
    stale: set[int] = field(default_factory=set, init=False)
    #: (pid, generation, first, last, ref, kind) of every gap, in the order found.
    gaps: list[tuple[int, int, int, int, Any, str]] = field(default_factory=list, init=False)

    def open_horizon(self, point: int) -> None:
        self.horizon = max(self.horizon, point + self.lifetime)
        self.unconfirmed |= set(self.entries)
        self.stale |= set(self.entries)

    def _covered(self, pid: int, g: int) -> bool:
        return self.vouched is not None and self.vouched[0] == pid and g <= self.vouched[1]

    def _vouches(self, pid: int, g: int, ts: int) -> bool:
        at = max(self.clock, ts)
        if self.authority is None or at >= self.horizon:
            return False
        status = self.authority(pid)
        return (
            status is not None and status.known and g == status.generation and at < status.expire_ms
        )

    def _land(self, ts: int, out: list[tuple[Any, Verdict]]) -> None:
        if ts <= self.clock:
            return
        self.clock = ts
        for pid in [p for p, w in self.pending.items() if w["expire"] <= self.clock]:
            out += [(r["ref"], Verdict.FENCED) for r in self.pending.pop(pid)["recs"]]
        for pid, (_, _, first_seen, _, _) in sorted(self.entries.items(), key=lambda kv: kv[1][3]):
            if first_seen + self.lifetime <= self.clock:
                del self.entries[pid]
                self.unconfirmed.discard(pid)
                self.stale.discard(pid)
                for h in sorted((h for h in self.held if h["pid"] == pid), key=_arrival):
                    out.append((h["ref"], Verdict.OUT_OF_ORDER))
                    self.held.remove(h)
            else:
                break

    def _leap(
        self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int
    ) -> Verdict | None:
        """g > gE + 1: None if judged as gE + 1 (a verifier and a proof), else the verdict."""
        signed_fence = self.verifier is not None and flags & FLAG_FENCE
        if self._covered(pid, g) or (
            cert is None and not signed_fence and self._vouches(pid, g, ts)
        ):
            return None
        if self.verifier is None:
            return Verdict.INVALID_GENERATION
        if any(x["pid"] == pid and x["gen"] == g for x in self.held):
            return None
        if cert is None:
            return Verdict.INVALID_GENERATION
        if self.verifier(pid, g, s, flags, cert, max(self.clock, ts)) is not None:
            return Verdict.FORGED
        return None

    def _proves(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, at: int) -> bool:
        """Under signing, a record at the authority's generation proves it by its certificate;
        without one, a data record is vouched for, a FENCE is not."""
        if self.verifier is None:
            return True
        if cert is None:
            return not flags & FLAG_FENCE
        return self.verifier(pid, g, s, flags, cert, at) is None

    def _ok(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int) -> bool:
        if any(x["pid"] == pid and x["gen"] == g for x in self.held):
            return True  # a held record of this generation proved it
        if self._covered(pid, g):
            return True
        fence = flags & FLAG_FENCE  # a FENCE carries its certificate: never vouched for
        if self.verifier is not None and cert is None and not fence and self._vouches(pid, g, ts):
            return True
        return (
            self.verifier is None
            or self.verifier(pid, g, s, flags, cert, max(self.clock, ts)) is None
        )

    def offer_header(
        self, header: bytes | None, ts: int, ref: Any, cert: bytes | None = None
    ) -> list[tuple[Any, Verdict]]:
        out: list[tuple[Any, Verdict]] = []
        if header is None:
            out.append((ref, Verdict.NON_IDEMPOTENT))
            self._land(ts, out)
            return out
        try:
            h = decode_pf(header)
        except MalformedHeader:
            out.append((ref, Verdict.MALFORMED))
            return out
        if h.pid == 0:
            out.append((ref, Verdict.NON_IDEMPOTENT))
            self._land(ts, out)
            return out
        self._decide(_Offer(h.pid, h.generation, h.seq, h.is_fence, ts, ref, cert), out)
        return out

    def _hold(self, pid: int, s: int, g: int, ref: Any) -> None:
        self.held.append({"pid": pid, "seq": s, "gen": g, "ref": ref, "arrival": self.arrival})
        self.arrival += 1

    def _new(self, o: _Offer, out: list[tuple[Any, Verdict]]) -> None:
        pid, g, s, fence, ts, ref, cert = o
        flags = FLAG_FENCE if fence else 0
        at = max(self.clock, ts)
        if sum(1 for x in self.entries.values() if x[2] + self.lifetime > at) >= self.capacity:
            out.append((ref, Verdict.CAPACITY))
            return
        vouched = self._covered(pid, g)
        start = fence or s == 0
        inside = at < self.horizon
        if not (vouched or start or inside):
            out.append((ref, Verdict.UNKNOWN_PID))
            return
        if not vouched and self.verifier is not None:
            if not start and cert is None:
                out.append((ref, Verdict.UNVERIFIED))
                return
            if self.verifier(pid, g, s, flags, cert, at) is not None:
                out.append((ref, Verdict.FORGED))
                return
        known = vouched
        if not vouched and inside and self.authority is not None:
            status = self.authority(pid)
            if status is not None and status.known:
                if at >= status.expire_ms:
                    out.append((ref, Verdict.UNKNOWN_PID))
                    return
                if g > status.generation:
                    out.append((ref, Verdict.INVALID_GENERATION))
                    return
                if g < status.generation:
                    live = sum(1 for x in self.entries.values() if x[2] + self.lifetime > at)
                    if live + len(self.pending) >= self.capacity:
                        out.append((ref, Verdict.CAPACITY))
                        return
                    self.pending[pid] = {"gen": g, "expire": status.expire_ms, "recs": []}
                    self._wait(o, out)
                    return
                known = True
        if not start and not known:
            out.append((ref, Verdict.UNKNOWN_PID))
            return
        out.append((ref, Verdict.FENCE if fence else Verdict.APPENDED))
        self._land(ts, out)
        self.entries[pid] = [g, s - 1 if fence else s, self.clock, self.order, set()]
        self.order += 1
        if s and not fence:
            self.gaps.append((pid, g, 0, s - 1, ref, "head"))
            if self.resolve_gaps:  # the head stays open, as a skipped gap does
                self.entries[pid][4].update(range(s))

    def _wait(self, o: _Offer, out: list[Any]) -> None:
        w = self.pending[o.pid]
        w["recs"].append(
            {
                "seq": o.s,
                "gen": o.g,
                "fence": o.fence,
                "ts": max(self.clock, o.ts),
                "ref": o.ref,
                "arrival": self.arrival,
            }
        )
        self.arrival += 1
        out.append((o.ref, Verdict.BUFFERED))
        self._land(o.ts, out)

    def _decide(self, o: _Offer, out: list[tuple[Any, Verdict]]) -> None:
        pid, g, s, fence, ts, ref, cert = o
        flags = FLAG_FENCE if fence else 0
        w = self.pending.get(pid)
        if w is not None:
            room = len(w["recs"]) < PENDING_LIMIT
            if g == w["gen"] and room:
                self._wait(o, out)
                return
            if g < w["gen"]:
                out.append((ref, Verdict.FENCED))
                return
            status = None
            if fence and g == w["gen"] + 1 and room and self.authority is not None:
                status = self.authority(pid)
            if status is not None and status.known and g <= status.generation:
                if self.verifier is not None and self.verifier(
                    pid, g, s, FLAG_FENCE, cert, max(self.clock, ts)
                ):
                    out.append((ref, Verdict.FORGED))
                    return
                if g < status.generation:
                    w["gen"] = g
                    self._wait(o, out)
                    return
                del self.pending[pid]
                self.vouched = (pid, g)
                for r in w["recs"]:
                    self._decide(
                        _Offer(pid, r["gen"], r["seq"], r["fence"], r["ts"], r["ref"], None), out
                    )
                self.vouched = None
            else:
                del self.pending[pid]
                out += [(r["ref"], Verdict.FENCED) for r in w["recs"]]
                if pid in self.entries:
                    self.unconfirmed.add(pid)
        at = max(self.clock, ts)
        e = self.entries.get(pid)
        if e is not None and e[2] + self.lifetime <= at:
            e = None  # expired at the record's time (removed only if the record lands)
        if e is None:
            self._new(o, out)
            return
        if (
            pid in self.unconfirmed
            and self.authority is not None
            and at < self.horizon
            and g >= e[0]
        ):
            st = self.authority(pid)
            if st is None or not st.known or st.generation <= e[0]:
                if g == e[0]:
                    self.unconfirmed.discard(pid)
            elif g > e[0] and (g >= st.generation or at >= st.expire_ms):
                if (
                    g == st.generation
                    and at < st.expire_ms
                    and self._proves(pid, g, s, flags, cert, at)
                ):
                    self.unconfirmed.discard(pid)
                    e[0] = g
                    if self.resolve_gaps and any(x["pid"] == pid for x in self.held):
                        self._settle(pid, e, out)  # as the move of the FENCE not read
            else:
                self.unconfirmed.discard(pid)
                self.pending[pid] = {"gen": g, "expire": st.expire_ms, "recs": []}
                self._wait(o, out)
                return
        moves = g == e[0] + 1
        leap = self._leap(pid, g, s, flags, cert, ts) if g > e[0] + 1 else None
        if g < e[0]:
            out.append((ref, Verdict.FENCED))
        elif leap is not None:
            out.append((ref, leap))
        elif fence:
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            moved = g > e[0]
            e[0] = g
            out.append((ref, Verdict.FENCE))
            if moved and self.resolve_gaps:
                self._settle(pid, e, out)
            self._land(ts, out)
        elif s <= e[1] and s not in e[4]:
            out.append((ref, Verdict.DUPLICATE))
        elif s <= e[1]:  # an open hole
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            if s - 1 in e[4] and s + 1 in e[4] and _ranges(e[4]) >= MAX_HOLES:
                out.append((ref, Verdict.OUT_OF_ORDER))
                return
            moved = g > e[0]
            e[0] = g
            e[4].discard(s)
            out.append((ref, Verdict.APPENDED))
            self.gaps.append((pid, g, s, s, ref, "filled"))
            if moved and self.resolve_gaps:
                self._settle(pid, e, out)
            self._land(ts, out)
        elif s == e[1] + 1:
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            moved = g > e[0]
            e[0], e[1] = g, s
            self.stale.discard(pid)
            out.append((ref, Verdict.APPENDED))
            if moved and self.resolve_gaps:
                self._settle(pid, e, out)
            else:
                self._release(pid, e, out)
            self._land(ts, out)
        elif self._overflow(pid, e, s) and not (self.resolve_gaps and _ranges(e[4]) < MAX_HOLES):
            out.append((ref, Verdict.OUT_OF_ORDER))
        elif self._overflow(pid, e, s):
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            self.stale.discard(pid)
            mine = [x for x in self.held if x["pid"] == pid]
            low = min(mine, key=lambda x: x["seq"]) if mine else None
            if low is None or s < low["seq"]:
                self.gaps.append((pid, g, e[1] + 1, s - 1, ref, "lost"))
                e[4].update(range(e[1] + 1, s))
                e[1] = s - 1
            else:
                self.gaps.append((pid, low["gen"], e[1] + 1, low["seq"] - 1, low["ref"], "lost"))
                e[4].update(range(e[1] + 1, low["seq"]))
                e[1] = low["seq"] - 1
                self._release(pid, e, out)
            self._decide(o, out)
        else:
            same = [x for x in self.held if x["pid"] == pid and x["seq"] == s]
            if same and g == same[0]["gen"]:
                out.append((ref, Verdict.DUPLICATE))
                return
            if same and g < same[0]["gen"]:
                out.append((ref, Verdict.FENCED))
                return
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            # A successor's resend replaces a zombie's waiting copy of the same seq.
            for x in same:
                self.held.remove(x)
                out.append((x["ref"], Verdict.FENCED))
            self._hold(pid, s, g, ref)
            out.append((ref, Verdict.BUFFERED))
            self._land(ts, out)

    def _overflow(self, pid: int, e: list[Any], s: int) -> bool:
        """The reorder window overflows at seq ``s``: by seqs missing, or, for a pid known
        before offsets not read (gap mode), by records waiting."""
        if pid in self.stale and self.resolve_gaps:
            mine = {x["seq"] for x in self.held if x["pid"] == pid}
            return s not in mine and len(mine) >= self.window
        return s - e[1] - 1 > self.window

    def _settle(self, pid: int, e: list[Any], out: list[tuple[Any, Verdict]]) -> None:
        """The generation moved: older held records that reached the log before any held record
        of a newer generation land after their holes (gap mode); later ones are fenced."""
        if any(x["pid"] == pid for x in self.held):
            self.stale.discard(pid)
        newer = [x["arrival"] for x in self.held if x["pid"] == pid and x["gen"] >= e[0]]
        cut = min(newer, default=None)
        older = sorted(
            (x for x in self.held if x["pid"] == pid and x["gen"] < e[0]), key=lambda x: x["seq"]
        )
        for x in older:
            self.held.remove(x)
            gap = x["seq"] > e[1] + 1
            if (cut is not None and x["arrival"] > cut) or (gap and _ranges(e[4]) >= MAX_HOLES):
                out.append((x["ref"], Verdict.FENCED))
                continue
            if gap:
                self.gaps.append((pid, x["gen"], e[1] + 1, x["seq"] - 1, x["ref"], "lost"))
                e[4].update(range(e[1] + 1, x["seq"]))
            e[1] = x["seq"]
            out.append((x["ref"], Verdict.APPENDED))
        self._release(pid, e, out)

    def _release(self, pid: int, e: list[Any], out: list[tuple[Any, Verdict]]) -> None:
        while True:
            nxt = next((x for x in self.held if x["pid"] == pid and x["seq"] == e[1] + 1), None)
            if nxt is None:
                return
            self.held.remove(nxt)
            if nxt["gen"] < e[0]:
                out.append((nxt["ref"], Verdict.FENCED))
                return
            e[0], e[1] = nxt["gen"], nxt["seq"]
            out.append((nxt["ref"], Verdict.APPENDED))

    def flush(self, ts: int) -> list[tuple[Any, Verdict]]:
        out: list[tuple[Any, Verdict]] = []
        self._land(ts, out)
        closing = [(h["arrival"], h["ref"], Verdict.OUT_OF_ORDER) for h in self.held]
        closing += [
            (r["arrival"], r["ref"], Verdict.FENCED)
            for w in self.pending.values()
            for r in w["recs"]
        ]
        out += [(ref, verdict) for _, ref, verdict in sorted(closing, key=lambda c: c[0])]
        self.held.clear()
        self.pending.clear()
        return out


def _arrival(held: dict[str, Any]) -> int:
    return int(held["arrival"])


def _ranges(seqs: set[int]) -> int:
    """How many maximal runs of consecutive seqs ``seqs`` holds."""
    return sum(1 for s in seqs if s - 1 not in seqs)
