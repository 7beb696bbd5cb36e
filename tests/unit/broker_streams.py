"""Random record streams for the broker-rules property tests, and a reference model of DESIGN §4.

The reference model is a direct transcription of the §4 table with the plainest data structures
(a dict and linear scans), so the real table's ring, batch path and snapshots are checked against
something obviously right.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import strategies as st

from pidfence.broker_plugin import (
    MAX_HOLES,
    PENDING_LIMIT,
    Authority,
    BatchResult,
    ProducerStateTable,
    Verifier,
)
from pidfence.wire import (
    FLAG_FENCE,
    MalformedHeader,
    PidState,
    PidStatus,
    Verdict,
    decode_pf,
    encode_pf,
)
from pidfence.wire.cert import verify_cert


@dataclass
class StreamKnobs:
    """How nasty a generated stream is."""

    pids: int = 4
    records: int = 200
    dup_rate: float = 0.1
    swap_rate: float = 0.05
    bump_rate: float = 0.03
    zombie_rate: float = 0.03
    fence_rate: float = 0.02
    odd_rate: float = 0.05
    ts_step_max: int = 50
    ts_back_rate: float = 0.05
    resend_rate: float = 0.02
    #: Records stamped up to ``skew_ms`` ahead (a producer's clock, or Kafka's 1 h allowance).
    skew_rate: float = 0.0
    skew_ms: int = 0
    #: A producer leaps 2-4 generations (killed after its bumps, before its checkpoint); half the
    #: time it then writes one FENCE per generation from its old one up (``resume``).
    leap_rate: float = 0.0
    #: A run of 1-12 of a producer's records never reaches the log (Kafka lost them).
    loss_rate: float = 0.0
    #: Share of producers whose head the reader never saw (they start at a seq up to 40).
    late_start_rate: float = 0.0


@dataclass
class _Producer:
    pid: int
    generation: int
    next_seq: int = 0
    sent: list[tuple[int, int]] = field(default_factory=list)


def make_stream(rng: random.Random, knobs: StreamKnobs) -> list[tuple[bytes | None, int]]:
    """(pf header or None, ts_ms) records: in order with duplicates, reorders, bumps, zombies."""
    producers = [_Producer(pid=i + 1, generation=rng.randrange(0, 10)) for i in range(knobs.pids)]
    for p in producers:
        if knobs.late_start_rate and rng.random() < knobs.late_start_rate:
            p.next_seq = rng.randrange(1, 41)
    out: list[tuple[bytes | None, int]] = []
    delayed: list[tuple[int, bytes]] = []  # (emit when len(out) reaches, header)
    ts = 1_000
    while len(out) < knobs.records:
        due = [d for d in delayed if d[0] <= len(out)]
        for d in due:
            delayed.remove(d)
            out.append((d[1], ts))
        ts += rng.randrange(0, knobs.ts_step_max + 1)
        stamp = ts - rng.randrange(0, 20) if rng.random() < knobs.ts_back_rate else ts
        if knobs.skew_ms and rng.random() < knobs.skew_rate:
            stamp = ts + rng.randrange(knobs.skew_ms)
        p = rng.choice(producers)
        roll = rng.random()
        if roll < knobs.odd_rate:
            kind = rng.randrange(5)
            if kind == 0:
                out.append((None, stamp))
            elif kind == 1:
                out.append((bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12))), stamp))
            elif kind == 2:
                out.append((encode_pf(0, 0, rng.randrange(5)), stamp))
            elif kind == 3:  # unknown producer mid-stream
                out.append((encode_pf(1000 + rng.randrange(5), 0, rng.randrange(1, 9)), stamp))
            else:  # generation jump by two
                out.append((encode_pf(p.pid, p.generation + 2, p.next_seq), stamp))
            continue
        roll -= knobs.odd_rate
        if roll < knobs.dup_rate and p.sent:
            seq, gen = rng.choice(p.sent[-8:])
            out.append((encode_pf(p.pid, gen, seq), stamp))
            continue
        roll -= knobs.dup_rate
        if roll < knobs.bump_rate:
            p.generation += 1
            continue
        roll -= knobs.bump_rate
        if roll < knobs.zombie_rate and p.generation > 0:
            out.append((encode_pf(p.pid, p.generation - 1, p.next_seq), stamp))
            continue
        roll -= knobs.zombie_rate
        if roll < knobs.fence_rate:
            p.generation += 1
            out.append((encode_pf(p.pid, p.generation, p.next_seq, FLAG_FENCE), stamp))
            continue
        roll -= knobs.fence_rate
        if roll < knobs.resend_rate and p.next_seq:
            # Resume after a crash: a new generation re-sends its last records (pipelined, so
            # they may land in any order) while the old generation's copies may be held.
            p.generation += 1
            back = rng.randrange(1, min(4, p.next_seq) + 1)
            seqs = list(range(p.next_seq - back, p.next_seq))
            rng.shuffle(seqs)
            for seq in seqs:
                out.append((encode_pf(p.pid, p.generation, seq), stamp))
                p.sent.append((seq, p.generation))
            continue
        roll -= knobs.resend_rate
        if roll < knobs.leap_rate:
            old = p.generation
            p.generation += rng.randrange(2, 5)
            if rng.random() < 0.5:
                for g in range(old + 1, p.generation + 1):
                    out.append((encode_pf(p.pid, g, p.next_seq, FLAG_FENCE), stamp))
            continue
        roll -= knobs.leap_rate
        if roll < knobs.loss_rate:
            lost = rng.randrange(1, 13)
            p.sent.extend((p.next_seq + i, p.generation) for i in range(lost))
            p.next_seq += lost
            continue
        roll -= knobs.loss_rate
        if roll < knobs.swap_rate:
            # Pipelining retry: the second record lands first, the first one a little later —
            # sometimes re-sent by a successor generation, which fences the waiting record.
            a, b = p.next_seq, p.next_seq + 1
            out.append((encode_pf(p.pid, p.generation, b), stamp))
            p.sent.append((b, p.generation))
            if rng.random() < 0.3:
                p.generation += 1
            delayed.append((len(out) + rng.randrange(0, 6), encode_pf(p.pid, p.generation, a)))
            p.sent.append((a, p.generation))
            p.next_seq += 2
            continue
        out.append((encode_pf(p.pid, p.generation, p.next_seq), stamp))
        p.sent.append((p.next_seq, p.generation))
        p.next_seq += 1
    return out


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
    #: (pid, generation, first, last, ref, kind) of every gap, in the order found.
    gaps: list[tuple[int, int, int, int, Any, str]] = field(default_factory=list, init=False)

    def open_horizon(self, point: int) -> None:
        self.horizon = max(self.horizon, point + self.lifetime)
        self.unconfirmed |= set(self.entries)

    def _covered(self, pid: int, g: int) -> bool:
        return self.vouched is not None and self.vouched[0] == pid and g <= self.vouched[1]

    def _vouches(self, pid: int, g: int, ts: int) -> bool:
        at = max(self.clock, ts)
        if self.authority is None or at >= self.horizon:
            return False
        status = self.authority(pid)
        return (
            status is not None and status.known and g <= status.generation and at < status.expire_ms
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
                for h in sorted((h for h in self.held if h["pid"] == pid), key=_arrival):
                    out.append((h["ref"], Verdict.OUT_OF_ORDER))
                    self.held.remove(h)
            else:
                break

    def _leap(
        self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int
    ) -> Verdict | None:
        """g > gE + 1: None if judged as gE + 1 (a verifier and a proof), else the verdict."""
        if self._covered(pid, g) or (cert is None and self._vouches(pid, g, ts)):
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

    def _ok(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int) -> bool:
        if any(x["pid"] == pid and x["gen"] == g for x in self.held):
            return True  # a held record of this generation proved it
        if self._covered(pid, g):
            return True
        if self.verifier is not None and cert is None and self._vouches(pid, g, ts):
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
            self.unconfirmed.discard(pid)
            st = self.authority(pid)
            if st is not None and st.known and st.generation > e[0]:
                if g > e[0] and g <= st.generation and at < st.expire_ms:
                    e[0] = g
                elif g == e[0]:
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
            out.append((ref, Verdict.APPENDED))
            if moved and self.resolve_gaps:
                self._settle(pid, e, out)
            else:
                self._release(pid, e, out)
            self._land(ts, out)
        elif s - e[1] - 1 > self.window and not (self.resolve_gaps and _ranges(e[4]) < MAX_HOLES):
            out.append((ref, Verdict.OUT_OF_ORDER))
        elif s - e[1] - 1 > self.window:
            if moves and not self._ok(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED))
                return
            mine = [x for x in self.held if x["pid"] == pid]
            low = min(mine, key=lambda x: x["seq"]) if mine else None
            if low is None:
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

    def _settle(self, pid: int, e: list[Any], out: list[tuple[Any, Verdict]]) -> None:
        """The generation moved: older held records that reached the log before any held record
        of a newer generation land after their holes (gap mode); later ones are fenced."""
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


# ---- certificates for the signed-generation tests (shared by several test modules)


def good(pid: int, g: int) -> bytes:
    return b"ok:%d:%d" % (pid, g)


class FakeVerifier:
    """Accepts exactly ``good(pid, g)``; counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(
        self, pid: int, g: int, s: int, flags: int, cert: bytes | None, now_ms: int
    ) -> str | None:
        self.calls.append((pid, g))
        if cert is None:
            return "missing"
        return None if cert == good(pid, g) else "other_identity"


def cert_verifier(keys: Sequence[Ed25519PublicKey], missing: str = "missing") -> Verifier:
    """A broker verifier that checks real lease certificates against ``keys``; a record without
    one is refused with the reason ``missing``."""

    def verifier(pid: int, g: int, s: int, f: int, cert: bytes | None, now_ms: int) -> str | None:
        if cert is None:
            return missing
        check = verify_cert(cert, keys, pid, g, now_ms)
        return None if check.ok else check.reason

    return verifier


def with_certs(
    rng: random.Random, stream: list[tuple[bytes | None, int]], forge: float
) -> list[bytes | None]:
    """A certificate per record: mostly valid for its header, sometimes absent or wrong."""
    certs: list[bytes | None] = []
    for header, _ in stream:
        try:
            pf = decode_pf(header) if header is not None else None
        except ValueError:
            pf = None
        roll = rng.random()
        if pf is None or roll < forge / 2:
            certs.append(None)
        elif roll < forge:
            certs.append(good(pf.pid, pf.generation + 1))
        else:
            certs.append(good(pf.pid, pf.generation))
    return certs


Stream = list[tuple[bytes | None, int]]


def twin_tables(
    args: tuple[int, int, int],
    *,
    signed: bool = False,
    resolve_gaps: bool = False,
    authority: Authority | None = None,
) -> tuple[ProducerStateTable, ReferenceTable]:
    """The real table and the reference model with the same settings, for :func:`offer_alike`.

    Args:
        args: capacity, lifetime (ms) and reorder window, as :data:`table_args` draws them.
        signed: give each its own :class:`FakeVerifier`.
        resolve_gaps: turn gap resolution on in both.
        authority: the lease authority both ask (see :func:`fixed_authority`).
    """
    capacity, lifetime, window = args
    table = ProducerStateTable(
        capacity,
        lifetime,
        window,
        verifier=FakeVerifier() if signed else None,
        resolve_gaps=resolve_gaps,
        authority=authority,
    )
    ref = ReferenceTable(
        capacity, lifetime, window, FakeVerifier() if signed else None, resolve_gaps, authority
    )
    return table, ref


def fixed_authority(answers: dict[int, tuple[int, int] | None]) -> Authority:
    """An authority that answers ``pid -> (generation, lease end)`` (None or absent: unknown)."""

    def authority(pid: int) -> PidStatus:
        found = answers.get(pid)
        if found is None:
            return PidStatus.unknown(pid)
        return PidStatus(pid, PidState.LIVE, *found)

    return authority


#: What an authority answers about the streams' pids (1..6 and the odd 1000..1004): a generation
#: near theirs, and a lease end inside or past the streams' time span.
authority_answers = st.dictionaries(
    st.sampled_from([*range(1, 7), *range(1000, 1005)]),
    st.none() | st.tuples(st.integers(0, 14), st.integers(0, 30_000)),
    max_size=11,
)


def offer_alike(
    table: ProducerStateTable,
    ref: ReferenceTable,
    stream: Stream,
    certs: list[bytes | None] | None = None,
    opens: Collection[int] = (),
    where: str = "",
) -> list[list[tuple[Any, Verdict]]]:
    """Offer every record of ``stream`` (``ref=i``, with ``certs[i]`` when given) to ``table``
    and to the reference model, asserting they decide alike; return each record's decisions.

    A horizon is opened on both just before each record index in ``opens``; ``where`` prefixes
    the failure message (e.g. the seed).
    """
    decided: list[list[tuple[Any, Verdict]]] = []
    for i, (header, ts) in enumerate(stream):
        if i in opens:
            table.open_horizon(ts)
            ref.open_horizon(ts)
        cert = None if certs is None else certs[i]
        got = [(d.ref, d.verdict) for d in table.offer_header(header, ts, i, cert)]
        assert got == ref.offer_header(header, ts, i, cert), f"{where}record {i}"
        decided.append(got)
    return decided


def offer_one_by_one(
    table: ProducerStateTable, stream: Stream, opens: Collection[int] = ()
) -> tuple[dict[int, Verdict], list[int]]:
    """Offer every record of ``stream`` to ``table`` alone (``ref=i``), opening the horizon just
    before each record index in ``opens``: each record's final verdict, and the refs in the
    order they went to the log (``APPENDED`` and ``NON_IDEMPOTENT`` both do)."""
    final: dict[int, Verdict] = {}
    log: list[int] = []
    for i, (header, ts) in enumerate(stream):
        if i in opens:
            table.open_horizon(ts)
        for d in table.offer_header(header, ts, ref=i):
            final[d.ref] = d.verdict
            if d.verdict.appended:
                log.append(d.ref)
    return final, log


def note_batch(result: BatchResult, start: int, final: dict[int, Verdict], log: list[int]) -> None:
    """Note a batch of the stream's records from index ``start`` on (``refs`` = their indexes)
    as :func:`offer_one_by_one` reports records: each decided record's verdict (held records
    it released included) into ``final``, the refs it sent to the log, in order, onto ``log``."""
    for d in result.released:
        final[d.ref] = d.verdict
    for row, verdict in enumerate(result.verdicts()):
        final[start + row] = verdict
    for idx in result.log_order.tolist():
        log.append(start + idx if idx >= 0 else result.released[-idx - 1].ref)


def flush_alike(table: ProducerStateTable, ref: ReferenceTable, stream: Stream) -> None:
    """Flush both just past the stream's last record: they release alike and keep the same
    (generation, highwater) per live pid."""
    end = stream[-1][1] + 1 if stream else 0
    assert [(d.ref, d.verdict) for d in table.flush(end)] == ref.flush(end)
    live = {p: table.get(p)[:2] for p in table.entries}  # type: ignore[index]
    assert live == {p: tuple(e[:2]) for p, e in ref.entries.items()}
    holes = {p: {s for a, b in table.open_holes(p) for s in range(a, b + 1)} for p in live}
    assert holes == {p: e[4] for p, e in ref.entries.items()}


def knobs_strategy_of(
    pids: int, records: int, odd_rate: float, **more: st.SearchStrategy[Any]
) -> st.SearchStrategy[StreamKnobs]:
    """:class:`StreamKnobs` with up to ``pids`` producers, ``records`` records and the usual
    fault rates; ``more`` draws further knobs."""
    return st.builds(
        StreamKnobs,
        pids=st.integers(1, pids),
        records=st.integers(0, records),
        dup_rate=st.floats(0, 0.3),
        swap_rate=st.floats(0, 0.2),
        bump_rate=st.floats(0, 0.1),
        zombie_rate=st.floats(0, 0.1),
        fence_rate=st.floats(0, 0.1),
        odd_rate=st.floats(0, odd_rate),
        ts_step_max=st.integers(0, 80),
        ts_back_rate=st.floats(0, 0.2),
        resend_rate=st.floats(0, 0.1),
        **more,
    )


#: (capacity, lifetime, reorder window)
table_args = st.tuples(st.integers(1, 8), st.integers(1, 3000), st.integers(0, 4))


def batched_streams(
    knobs: st.SearchStrategy[StreamKnobs], shortest: int = 0
) -> tuple[st.SearchStrategy[Any], ...]:
    """What a batch-path property draws first: a stream (its seed and ``knobs``), the table's
    :data:`table_args`, and the sizes of the batches :func:`batches` cuts the stream into (at
    least ``shortest``: 0 allows an empty batch)."""
    return (
        st.integers(0, 2**32),
        knobs,
        table_args,
        st.lists(st.integers(shortest, 60), max_size=8),
    )


def batches(stream: Stream, cuts: Sequence[int]) -> Iterator[tuple[int, int, list[Any], list[int]]]:
    """``stream`` cut into batches of the sizes ``cuts``, the rest in a last one: each batch's
    (start, end, headers, stamps)."""
    start = 0
    for size in [*cuts, len(stream)]:
        chunk = stream[start : start + size]
        end = start + len(chunk)
        yield start, end, [h for h, _ in chunk], [t for _, t in chunk]
        start = end


def restored(snapshot: bytes | None, args: tuple[int, int, int]) -> ProducerStateTable:
    """The table ``snapshot`` restores (None: a new one of ``args``, capacity, lifetime and
    window)."""
    return ProducerStateTable(*args) if snapshot is None else ProducerStateTable.restore(snapshot)


def decide_alike_after(
    live: ProducerStateTable,
    rebuilt: ProducerStateTable,
    more: Stream,
    certs: Sequence[bytes | None] | None = None,
) -> None:
    """``live`` and ``rebuilt`` decide every record of ``more`` (after the live clock) alike."""
    base = live.clock if live.clock > -(2**62) else 0
    for i, (header, ts) in enumerate(more):
        cert = None if certs is None else certs[i]
        a = live.offer_header(header, base + ts, 10_000 + i, cert)
        b = rebuilt.offer_header(header, base + ts, 10_000 + i, cert)
        assert a == b, f"record {i} after the rebuild"
