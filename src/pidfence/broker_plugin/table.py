"""One partition's producer state and the broker-side rules of DESIGN §4.

The table keeps ``pid -> (generation, highwater, first_seen_ms)`` for every live producer of one
(topic, partition), in a fixed-size ring in creation order (the proposal's circular buffer), and
decides each offered record with the cases of DESIGN §4, in the order the table lists them.

State is a function of the records that land (DESIGN §4 amended): a rejected record never changes
anything, not even the clock. Only ``APPENDED`` and ``FENCE`` records create entries or move
``generation``/``highwater``; records that land (appended, ``FENCE`` or held for reordering) move
the clock to the largest timestamp seen among them. A record is judged at ``max(clock, its
timestamp)`` (an entry whose life ended by then is unknown to it, a full ring whose oldest entry
ended has room), but only a record that lands makes that time the clock and expires entries. An
entry is
created with ``first_seen_ms`` = the clock, so the ring stays ordered by expiry time, and expires
once the clock reaches ``first_seen_ms + lifetime_ms + grace_ms``. An expired pid is unknown again:
``seq == 0`` starts a new entry, ``seq > 0`` is ``UNKNOWN_PID``.

With a ``verifier`` (signed generations, DESIGN §3 amended), a record that would create an entry,
move ``generation`` or be held under the next generation must carry a certificate the verifier
accepts, else it is ``FORGED``; this happens once per (pid, generation), since afterwards the entry
itself says the generation was proven. A record several generations ahead (``g > gE + 1``) with a
valid certificate is judged as if ``g`` were ``gE + 1`` (a producer killed between its bumps and
its checkpoint resumes there); without a verifier or a certificate it stays ``INVALID_GENERATION``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from pidfence.broker_plugin.decision import Decision
from pidfence.broker_plugin.ring import EntryRing
from pidfence.wire import (
    FLAG_FENCE,
    GENERATION_LIMIT,
    PID_LIMIT,
    SEQ_LIMIT,
    MalformedHeader,
    Verdict,
    decode_pf,
)

_NO_CLOCK: Final = -(2**63)

#: Internal decision: (caller's ref, verdict, batch token of the record or None).
Emit = tuple[Any, Verdict, "tuple[int, int] | None"]
#: ``verifier(pid, generation, cert, now_ms)``: None when ``cert`` proves (pid, generation), else
#: the reason it does not ("malformed", "wrong_length", "other_identity", "expired", ...).
Verifier = Callable[[int, int, "bytes | None", int], "str | None"]

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


class ProducerStateTable:
    """The broker-side rules for one (topic, partition).

    Args:
        capacity: most live producer entries kept (ring size); a new producer beyond it is refused
            with ``CAPACITY``, live state is never evicted.
        lifetime_ms: how long an entry lives after its first record (the lease lifetime).
        reorder_window: how far past ``highwater + 1`` a record may be held for reordering
            (0 disables holding: such records are ``OUT_OF_ORDER`` at once).
        grace_ms: extra life added to every entry: at least how far ahead of real time a record
            timestamp may be (Kafka's ``log.message.timestamp.after.max.ms``, 1 h by default), so
            no accepted record can expire a producer whose lease is live.
        verifier: checks ``pfc`` certificates (see :data:`Verifier`); ``None`` accepts every
            record (signing off). Not part of the state or of snapshots.
    """

    def __init__(
        self,
        capacity: int,
        lifetime_ms: int,
        reorder_window: int = 5,
        grace_ms: int = 0,
        verifier: Verifier | None = None,
    ) -> None:
        check_settings(
            capacity=capacity,
            lifetime_ms=lifetime_ms,
            reorder_window=reorder_window,
            grace_ms=grace_ms,
        )
        self.capacity = capacity
        self.lifetime_ms = lifetime_ms
        self.reorder_window = reorder_window
        self.grace_ms = grace_ms
        self.verifier = verifier
        #: ``FORGED`` verdicts by reason since the caller last cleared it (not state).
        self.forged: dict[str, int] = {}
        self.entries: dict[int, Entry] = {}
        self.ring = EntryRing(capacity)
        self.held: dict[int, dict[int, Held]] = {}
        self.clock = _NO_CLOCK
        self.next_serial = 0
        self.next_arrival = 0
        # Change tracking for incremental snapshots (see snapshot.py).
        self.epoch = 0
        self.base_serial = 0
        self.touched: set[int] = set()
        self.expired_since = 0

    # ----------------------------------------------------------------------------- public API

    def __len__(self) -> int:
        """Number of live producer entries."""
        return len(self.entries)

    def get(self, pid: int) -> tuple[int, int, int] | None:
        """``(generation, highwater, first_seen_ms)`` of a live pid, else ``None``."""
        entry = self.entries.get(pid)
        if entry is None:
            return None
        return entry.generation, entry.highwater, entry.first_seen

    @property
    def held_count(self) -> int:
        """Records currently held for reordering."""
        return sum(len(h) for h in self.held.values())

    def offer(
        self,
        pid: int,
        generation: int,
        seq: int,
        ts_ms: int,
        flags: int = 0,
        ref: Any = None,
        cert: bytes | None = None,
    ) -> list[Decision]:
        """Decide one record (DESIGN §4).

        Returns the decisions this call made, in log order: this record's verdict (``BUFFERED``
        when held), held records it released, then held records of entries its timestamp expired.
        ``cert`` is the record's ``pfc`` header value (only read when a verifier is set).
        """
        if type(ts_ms) is not int:
            ts_ms = _timestamp(ts_ms)
        out: list[Emit] = []
        if not _valid(pid, generation, seq, flags):
            # numpy and other integral types are fine; anything else is MALFORMED.
            pid, generation, seq, flags = (_integral(v) for v in (pid, generation, seq, flags))
        if _valid(pid, generation, seq, flags):
            self.decide(pid, generation, seq, flags, ts_ms, ref, out, None, cert)
        else:
            out.append((ref, MALFORMED, None))
        return [Decision(r, v) for r, v, _ in out]

    def offer_header(
        self, header: bytes | None, ts_ms: int, ref: Any = None, cert: bytes | None = None
    ) -> list[Decision]:
        """Decide one record from its raw ``pf`` header value (``None`` when absent)."""
        if header is not None:
            try:
                pf = decode_pf(header)
            except MalformedHeader:
                return [Decision(ref, MALFORMED)]
            return self.offer(pf.pid, pf.generation, pf.seq, ts_ms, pf.flags, ref, cert)
        if type(ts_ms) is not int:
            ts_ms = _timestamp(ts_ms)
        out: list[Emit] = [(ref, NON_IDEMPOTENT, None)]
        self.advance(ts_ms, out)
        return [Decision(r, v) for r, v, _ in out]

    def flush(self, ts_ms: int) -> list[Decision]:
        """Close the reorder window: every held record becomes ``OUT_OF_ORDER``.

        ``ts_ms`` moves the clock first (pass :attr:`clock` to close the window without it).
        """
        if type(ts_ms) is not int:
            ts_ms = _timestamp(ts_ms)
        out: list[Emit] = []
        self.advance(ts_ms, out)
        self.flush_held(out)
        return [Decision(r, v) for r, v, _ in out]

    def flush_held(self, out: list[Emit]) -> None:
        """Every held record becomes ``OUT_OF_ORDER`` (in arrival order)."""
        for held in sorted(
            (h for by_seq in self.held.values() for h in by_seq.values()), key=lambda h: h.arrival
        ):
            out.append((held.ref, OUT_OF_ORDER, held.token))
        self.touched.update(self.held)
        self.held.clear()

    def offer_batch(self, headers: Any, ts_ms: Any, refs: Any = None, certs: Any = None) -> Any:
        """Decide many records at once; same decisions as :meth:`offer_header` one by one.

        See :func:`pidfence.broker_plugin.batch.offer_batch` for the arguments and result.
        """
        from pidfence.broker_plugin.batch import offer_batch

        return offer_batch(self, headers, ts_ms, refs, certs)

    def snapshot(self) -> bytes:
        """Full state as bytes (msgpack, versioned, CRC-checked)."""
        from pidfence.broker_plugin.snapshot import full_snapshot

        return full_snapshot(self)

    def snapshot_delta(self) -> bytes:
        """Only what changed since the previous :meth:`snapshot` or :meth:`snapshot_delta`."""
        from pidfence.broker_plugin.snapshot import delta_snapshot

        return delta_snapshot(self)

    @classmethod
    def restore(
        cls,
        data: bytes,
        *,
        capacity: int | None = None,
        lifetime_ms: int | None = None,
        reorder_window: int | None = None,
        grace_ms: int | None = None,
    ) -> ProducerStateTable:
        """Rebuild a table from :meth:`snapshot` bytes; ``CorruptSnapshot`` on any damage.

        Keyword arguments override the snapshot's settings (a capacity smaller than the live
        entries is refused).
        """
        return cls.restore_chain(
            data,
            (),
            capacity=capacity,
            lifetime_ms=lifetime_ms,
            reorder_window=reorder_window,
            grace_ms=grace_ms,
        )

    @classmethod
    def restore_chain(
        cls,
        full: bytes,
        deltas: Iterable[bytes],
        *,
        capacity: int | None = None,
        lifetime_ms: int | None = None,
        reorder_window: int | None = None,
        grace_ms: int | None = None,
    ) -> ProducerStateTable:
        """Rebuild a table from a full snapshot and the deltas taken after it, in order."""
        from pidfence.broker_plugin.snapshot import restore_chain

        return restore_chain(
            cls,
            full,
            list(deltas),
            capacity=capacity,
            lifetime_ms=lifetime_ms,
            reorder_window=reorder_window,
            grace_ms=grace_ms,
        )

    def state(self) -> tuple[Any, ...]:
        """A canonical, comparable view of the whole state (for tests and equality)."""
        ring = tuple(
            (
                pid,
                serial,
                self.entries[pid].generation,
                self.entries[pid].highwater,
                self.entries[pid].first_seen,
            )
            for pid, serial in self.ring
        )
        held = tuple(
            sorted(
                (pid, h.seq, h.generation, h.flags, h.ts_ms, h.arrival, repr(h.ref))
                for pid, by_seq in self.held.items()
                for h in by_seq.values()
            )
        )
        return (
            self.capacity, self.lifetime_ms, self.reorder_window, self.grace_ms, self.clock,
            self.next_serial, self.next_arrival, ring, held,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateTable):
            return NotImplemented
        return self.state() == other.state()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ProducerStateTable(capacity={self.capacity}, lifetime_ms={self.lifetime_ms}, "
            f"reorder_window={self.reorder_window}, live={len(self.entries)}, "
            f"held={self.held_count}, clock={self.clock})"
        )

    # ------------------------------------------------------------------------- the rules

    def advance(self, ts_ms: int, out: list[Emit]) -> int:
        """Move the clock to ``max(clock, ts_ms)`` and expire entries; returns the clock."""
        if ts_ms > self.clock:
            self.clock = ts_ms
            self.expire(ts_ms, out)
        return self.clock

    def expire(self, now: int, out: list[Emit]) -> None:
        """Drop entries whose life ended at or before ``now``, oldest first."""
        ring = self.ring
        life = self.lifetime_ms + self.grace_ms
        while len(ring):
            pid, serial = ring.head()
            entry = self.entries[pid]
            if entry.first_seen + life > now:
                return
            ring.pop()
            del self.entries[pid]
            if serial < self.base_serial:
                # Entries created since the last snapshot never reached one; deltas skip them.
                self.expired_since += 1
            self.touched.discard(pid)
            held = self.held.pop(pid, None)
            if held:
                # The producer's life ended with a gap open: its held records can never be appended.
                for h in sorted(held.values(), key=lambda h: h.arrival):
                    out.append((h.ref, OUT_OF_ORDER, h.token))

    def create(self, pid: int, generation: int, highwater: int, now: int) -> None:
        """Add a new entry at the ring's tail."""
        self.entries[pid] = Entry(generation, highwater, now, self.next_serial)
        self.ring.append(pid, self.next_serial)
        self.next_serial += 1

    def certified(self, pid: int, g: int, cert: bytes | None, ts: int) -> bool:
        """Whether (pid, g) is proven by ``cert`` (always, without a verifier); counts failures.

        Expiry is judged at ``max(clock, ts)``: a record cannot make a stale certificate fresh
        by carrying an old timestamp.
        """
        if self.verifier is None:
            return True
        reason = self.verifier(pid, g, cert, max(self.clock, ts))
        if reason is None:
            return True
        self.forged[reason] = self.forged.get(reason, 0) + 1
        return False

    def proven(self, pid: int, g: int, cert: bytes | None, ts: int) -> bool:
        """Whether the next generation ``g`` of ``pid`` may move ``gE`` (or be held).

        Held records of the next generation were proven when they were held (their release moves
        ``gE``), so one of them proves its siblings: the ``pfc`` rides only on the first record
        the producer sent under a generation, which need not be the first to arrive.
        """
        held = self.held.get(pid)
        if held is not None and any(h.generation == g for h in held.values()):
            return True
        return self.certified(pid, g, cert, ts)

    def leap(self, pid: int, g: int, cert: bytes | None, ts: int) -> Verdict | None:
        """Whether a record of generation ``g > gE + 1`` may be judged as ``gE + 1``.

        Returns None when it may: a verifier is set and the generation is proven (by a held
        record of the same generation, or by ``cert``). The lease server issued a signed
        generation, and generations only grow, so every older one stays fenced. Otherwise the
        verdict: ``INVALID_GENERATION`` without a verifier or without a certificate (the rule of
        DESIGN §4), ``FORGED`` when a certificate is there and the verifier refuses it.
        """
        if self.verifier is None:
            return INVALID_GENERATION
        held = self.held.get(pid)
        if held is not None and any(h.generation == g for h in held.values()):
            return None
        if cert is None:
            return INVALID_GENERATION
        return None if self.certified(pid, g, cert, ts) else FORGED

    def decide(
        self,
        pid: int,
        g: int,
        s: int,
        flags: int,
        ts: int,
        ref: Any,
        out: list[Emit],
        token: tuple[int, int] | None,
        cert: bytes | None = None,
    ) -> None:
        """Apply DESIGN §4 to one decoded record, in the table's order of cases.

        The record is decided against the state as it is (the clock included); only if it lands
        does its timestamp move the clock (DESIGN §4 amended).
        """
        if pid == 0:
            out.append((ref, NON_IDEMPOTENT, token))
            self.advance(ts, out)
            return
        fence = flags & FLAG_FENCE
        entry = self.entries.get(pid)
        life = self.lifetime_ms + self.grace_ms
        at = ts if ts > self.clock else self.clock
        if entry is not None and entry.first_seen + life <= at:
            # Expired at this record's time; it only leaves the ring if the record lands.
            entry = None
        if entry is None:
            if self.ring.full and self.entries[self.ring.head()[0]].first_seen + life > at:
                out.append((ref, CAPACITY, token))
            elif fence or s == 0:
                if not self.certified(pid, g, cert, ts):
                    out.append((ref, FORGED, token))
                    return
                out.append((ref, FENCE if fence else APPENDED, token))
                self.advance(ts, out)
                self.create(pid, g, s - 1 if fence else 0, self.clock)
            else:
                out.append((ref, UNKNOWN_PID, token))
            return
        current = entry.generation
        if g < current:
            out.append((ref, FENCED, token))
            return
        leapt = g > current + 1
        if leapt:
            refused = self.leap(pid, g, cert, ts)
            if refused is not None:
                out.append((ref, refused, token))
                return
        # A proven leap is judged as the next generation, its proof already given.
        moves = g != current and not leapt
        if fence:
            if moves and not self.proven(pid, g, cert, ts):
                out.append((ref, FORGED, token))
                return
            self.touched.add(pid)
            entry.generation = g
            out.append((ref, FENCE, token))
            self.advance(ts, out)
            return
        high = entry.highwater
        if s <= high:
            # Rejected: no state change, even under the next generation (Kafka's rule).
            out.append((ref, DUPLICATE, token))
            return
        if s == high + 1:
            if moves and not self.proven(pid, g, cert, ts):
                out.append((ref, FORGED, token))
                return
            self.touched.add(pid)
            entry.generation = g
            entry.highwater = s
            out.append((ref, APPENDED, token))
            if pid in self.held:
                self.release(pid, entry, out)
            self.advance(ts, out)
            return
        if s - high - 1 > self.reorder_window:
            out.append((ref, OUT_OF_ORDER, token))
            return
        held = self.held.get(pid)
        waiting = held.get(s) if held is not None else None
        if waiting is not None and g <= waiting.generation:
            # The same record arrived twice while waiting, or an older generation's copy of a
            # record a newer generation is already holding.
            out.append((ref, DUPLICATE if g == waiting.generation else FENCED, token))
            return
        if moves and not self.proven(pid, g, cert, ts):
            out.append((ref, FORGED, token))
            return
        self.touched.add(pid)
        if waiting is not None and held is not None:
            # A successor generation re-sent a record a zombie's copy of which is waiting: the
            # waiting copy could only be fenced at release, and calling the resend a DUPLICATE of
            # it would lose the record. Fence the zombie's copy now and hold the resend instead.
            del held[s]
            out.append((waiting.ref, FENCED, waiting.token))
        if held is None:
            held = self.held[pid] = {}
        held[s] = Held(s, g, flags, max(self.clock, ts), self.next_arrival, ref, token)
        self.next_arrival += 1
        out.append((ref, BUFFERED, token))
        self.advance(ts, out)

    def release(self, pid: int, entry: Entry, out: list[Emit]) -> None:
        """Append held records that now follow the highwater, re-checking each one."""
        held = self.held[pid]
        while True:
            nxt = held.pop(entry.highwater + 1, None)
            if nxt is None:
                break
            if nxt.generation < entry.generation:
                # A generation bump while it waited: a zombie's record.
                out.append((nxt.ref, FENCED, nxt.token))
                break
            entry.generation = nxt.generation
            entry.highwater = nxt.seq
            out.append((nxt.ref, APPENDED, nxt.token))
        if not held:
            del self.held[pid]


_SETTING_MINIMUM: Final = {"capacity": 1, "lifetime_ms": 1, "reorder_window": 0, "grace_ms": 0}


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


def _valid(pid: Any, generation: Any, seq: Any, flags: Any) -> bool:
    return (
        type(pid) is int
        and type(generation) is int
        and type(seq) is int
        and type(flags) is int
        and 0 <= pid < PID_LIMIT
        and 0 <= generation < GENERATION_LIMIT
        and 0 <= seq < SEQ_LIMIT
        and flags in (0, FLAG_FENCE)
    )
