"""The rules kernel: one partition's producer state and the broker-side rules of DESIGN §4.

The kernel keeps ``pid -> (generation, highwater, first_seen_ms)`` for every live producer of one
(topic, partition), in a fixed-size ring in creation order (the proposal's circular buffer), and
decides each record with the cases of DESIGN §4, in the order the table lists them. It is pure
computation; :class:`~pidfence.broker_plugin.table.ProducerStateTable` adds the public API, the
batch path (:mod:`~pidfence.broker_plugin.batch`) decides many records at once through the same
methods, and :mod:`~pidfence.broker_plugin.snapshot` serialises the state.

State is a function of the records that land (DESIGN §4 amended): a rejected record never changes
anything, not even the clock, except that an adoption the lease authority confirms
(:mod:`~pidfence.broker_plugin.adoption`) moves the entry to the generation it names before the
record is judged. Only ``APPENDED`` and ``FENCE`` records create entries or move
``generation``/``highwater``; records that land (appended, ``FENCE`` or held for reordering) move
the clock to the largest timestamp seen among them. A record is judged at ``max(clock, its
timestamp)``; only a record that lands makes that time the clock and expires entries. An entry is
created with ``first_seen_ms`` = the clock, so the ring stays ordered by expiry time, and expires
once the clock reaches ``first_seen_ms + lifetime_ms + grace_ms``.

With a ``verifier`` (signed generations, DESIGN §3 amended), a record that would create an entry,
move ``generation`` or be held under the next generation must carry a certificate the verifier
accepts, else it is ``FORGED``. A record several generations ahead (``g > gE + 1``) with a valid
certificate is judged as if ``g`` were ``gE + 1``.

Two extensions (DESIGN §4 amended again and a third time), off by default so a default table
answers exactly as the proposal's rules do:

* **Gap resolution** (``resolve_gaps=True``): when a producer's reorder window overflows, the
  seqs below the lowest waiting record are reported as a :class:`Gap` and the producer continues
  from there, instead of every later record being ``OUT_OF_ORDER``. The skipped seqs stay open
  (:mod:`~pidfence.broker_plugin.holes`): a record that later fills one is appended and reported
  ``filled``. Only more records of the producer resolve a gap: an entry that expires with records
  waiting drops them as ``OUT_OF_ORDER``, as the proposal does.
* **Adoption** (:meth:`RulesKernel.open_horizon` and an ``authority``): up to a horizon the
  caller sets (where it could not have seen producers start), the lease authority decides what
  an unknown pid's record is (:mod:`~pidfence.broker_plugin.adoption`): adopted at ``seq > 0``
  (its unseen head reported as a gap) only at the generation the authority names, with its lease
  live. Under signing the record must carry a certificate the verifier accepts: without one it is
  ``UNVERIFIED``, with a bad one ``FORGED``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pidfence.broker_plugin import holes
from pidfence.broker_plugin.adoption import VOUCHED, Adoption
from pidfence.broker_plugin.entry import (
    NO_CLOCK,
    Authority,
    Emit,
    Entry,
    Gap,
    Held,
    Pending,
    Verifier,
    as_timestamp,
    check_settings,
)
from pidfence.broker_plugin.proofs import Proofs
from pidfence.broker_plugin.ring import EntryRing
from pidfence.wire import FLAG_FENCE, Verdict


class RulesKernel(Proofs, Adoption):
    """One partition's state and the rules that decide one record against it.

    Args:
        capacity: most live producer entries kept (ring size); a new producer beyond it is refused
            with ``CAPACITY``, live state is never evicted.
        lifetime_ms: how long an entry lives after its first record (the lease lifetime).
        reorder_window: how far past ``highwater + 1`` a record may be held for reordering
            (0 disables holding: such records are ``OUT_OF_ORDER`` at once, or open a gap).
        grace_ms: extra life added to every entry: at least how far ahead of real time a record
            timestamp may be (Kafka's ``log.message.timestamp.after.max.ms``, 1 h by default), so
            no accepted record can expire a producer whose lease is live.
        verifier: checks ``pfc`` certificates (see :data:`Verifier`); ``None`` accepts every
            record (signing off). Not part of the state or of snapshots.
        resolve_gaps: report and skip a gap when a producer's reorder window overflows, keeping
            its seqs open for a late record, instead of ``OUT_OF_ORDER``.
        authority: the lease authority's answers (see :data:`Authority`); ``None`` adopts
            nothing. Not part of the state or of snapshots.
    """

    def __init__(
        self,
        capacity: int,
        lifetime_ms: int,
        reorder_window: int = 5,
        grace_ms: int = 0,
        verifier: Verifier | None = None,
        *,
        resolve_gaps: bool = False,
        authority: Authority | None = None,
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
        self.resolve_gaps = bool(resolve_gaps)
        #: ``FORGED`` verdicts by reason since the caller last cleared it (not state).
        self.forged: dict[str, int] = {}
        #: Gaps found since the caller last cleared it (not state: the records decide them).
        self.gaps: list[Gap] = []
        self.entries: dict[int, Entry] = {}
        self.ring = EntryRing(capacity)
        self.held: dict[int, dict[int, Held]] = {}
        self.authority = authority
        #: Records waiting for the log to show where they stand (adoption.py).
        self.pending: dict[int, Pending] = {}
        #: Known pids that may have missed a FENCE in offsets not read (adoption.py).
        self.unconfirmed: set[int] = set()
        #: Pids known before offsets that were not read: their highwater may be behind the
        #: log's, so their reorder window counts records waiting, not seqs missing, until it
        #: moves again (a gap skipped from a stale highwater would swallow a timeout hole just
        #: above the unread seqs, and append what a full view holds behind it).
        self.stale: set[int] = set()
        self.vouched: tuple[int, int] | None = None
        self.clock = NO_CLOCK
        #: The entries' life when they were last expired (None: never).
        self.expired_life: int | None = None
        #: Unknown producers met at seq > 0 are adopted while a record's time is below this.
        self.horizon = NO_CLOCK
        self.next_serial = 0
        self.next_arrival = 0
        # Change tracking for incremental snapshots (see snapshot.py).
        self.epoch = 0
        self.base_serial = 0
        self.touched: set[int] = set()
        self.expired_since = 0

    @property
    def life(self) -> int:
        """How long an entry lives: the lifetime plus the timestamp grace."""
        return self.lifetime_ms + self.grace_ms

    def open_horizon(self, point_ms: int) -> None:
        """Ask the authority about unknown producers until one entry life after ``point_ms``.

        Call it where the caller could not have seen producers start (the log's start was
        trimmed, reading began mid-log, offsets were lost), with the time of the first record
        after that point. Every producer alive then ends its lease within one lifetime, and any
        producer first met later must have started after the point, where its seq 0 was seen.
        The producers known then may have missed a FENCE in what was not read: each is asked
        about at its next record (:meth:`~pidfence.broker_plugin.adoption.Adoption.confirm`).
        """
        point_ms = as_timestamp(point_ms)
        self.horizon = max(self.horizon, point_ms + self.life)
        self.unconfirmed.update(self.entries)
        self.stale.update(self.entries)

    # ------------------------------------------------------------------------- the clock

    def advance(self, ts_ms: int, out: list[Emit]) -> int:
        """Move the clock to ``max(clock, ts_ms)`` and expire entries; returns the clock.

        Entries are expired at the clock also when their life changed since the last expiry (a
        restore, or a replayed batch, under a shorter lifetime or grace): an entry left in the
        ring past its life would take a second slot when its pid starts again.
        """
        if ts_ms > self.clock or self.life != self.expired_life:
            self.clock = max(self.clock, ts_ms)
            self.expired_life = self.life
            self.expire(self.clock, out)
        return self.clock

    def expire(self, now: int, out: list[Emit]) -> None:
        """Drop entries whose life ended at or before ``now``, oldest first."""
        ring = self.ring
        life = self.life
        if self.pending:
            self.expire_waiting(now, out)
        while len(ring):
            pid, serial = ring.head()
            entry = self.entries[pid]
            if entry.first_seen + life > now:
                return
            ring.pop()
            del self.entries[pid]
            self.unconfirmed.discard(pid)
            self.stale.discard(pid)
            if serial < self.base_serial:
                # Entries created since the last snapshot never reached one; deltas skip them.
                self.expired_since += 1
            self.touched.discard(pid)
            held = self.held.pop(pid, None)
            if held:
                # The producer's life ended with a gap open: its held records can never be
                # appended (its resumer, if any, re-sent them under a successor).
                for h in sorted(held.values(), key=lambda h: h.arrival):
                    out.append((h.ref, Verdict.OUT_OF_ORDER, h.token))

    def live_at(self, at: int) -> int:
        """How many entries are still live at ``at`` (the ended ones are the ring's first)."""
        ended = 0
        for pid, _ in self.ring:
            if self.entries[pid].first_seen + self.life > at:
                break
            ended += 1
        return len(self.ring) - ended

    def create(self, pid: int, generation: int, highwater: int, now: int) -> None:
        """Add a new entry at the ring's tail."""
        self.entries[pid] = Entry(generation, highwater, now, self.next_serial)
        self.ring.append(pid, self.next_serial)
        self.next_serial += 1

    # ------------------------------------------------------------------------- the rules

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
            out.append((ref, Verdict.NON_IDEMPOTENT, token))
            self.advance(ts, out)
            return
        fence = flags & FLAG_FENCE
        if pid in self.pending and self.still_waiting(pid, g, s, fence, ts, ref, out, token, cert):
            return
        entry = self.entries.get(pid)
        at = ts if ts > self.clock else self.clock
        if entry is not None and entry.first_seen + self.life <= at:
            # Expired at this record's time; it only leaves the ring if the record lands.
            entry = None
        if entry is None:
            self.decide_new(pid, g, s, fence, ts, at, ref, out, token, cert)
            return
        if pid in self.unconfirmed and not self.confirm(
            pid, entry, g, s, flags, ts, ref, out, token, cert
        ):
            return
        current = entry.generation
        if g < current:
            out.append((ref, Verdict.FENCED, token))
            return
        leapt = g > current + 1
        if leapt:
            refused = self.leap(pid, g, s, flags, cert, ts)
            if refused is not None:
                out.append((ref, refused, token))
                return
        # A proven leap is judged as the next generation, its proof already given.
        moves = g != current and not leapt
        if fence:
            if moves and not self.proven(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED, token))
                return
            self.touched.add(pid)
            entry.generation = g
            out.append((ref, Verdict.FENCE, token))
            if g > current and self.resolve_gaps and pid in self.held:
                self.settle(pid, entry, out)
            self.advance(ts, out)
            return
        high = entry.highwater
        if s <= high:
            hole = holes.find(entry, s)
            if hole < 0:
                # Rejected: no state change (but a confirmed adoption), even under the next
                # generation (Kafka's rule).
                out.append((ref, Verdict.DUPLICATE, token))
                return
            if moves and not self.proven(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED, token))
                return
            if not holes.fill(entry, hole, s):
                out.append((ref, Verdict.OUT_OF_ORDER, token))  # it would split a hole: none left
                return
            self.touched.add(pid)
            entry.generation = g
            out.append((ref, Verdict.APPENDED, token))
            self.gaps.append(Gap(pid, g, s, s, ref, "filled"))
            if g > current and self.resolve_gaps and pid in self.held:
                self.settle(pid, entry, out)
            self.advance(ts, out)
            return
        if s == high + 1:
            if moves and not self.proven(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED, token))
                return
            self.touched.add(pid)
            self.stale.discard(pid)
            entry.generation = g
            entry.highwater = s
            out.append((ref, Verdict.APPENDED, token))
            if pid in self.held:
                if g > current and self.resolve_gaps:
                    self.settle(pid, entry, out)
                else:
                    self.release(pid, entry, out)
            self.advance(ts, out)
            return
        held = self.held.get(pid)
        if pid in self.stale and self.resolve_gaps:
            waiting_now = held or {}
            overflow = s not in waiting_now and len(waiting_now) >= self.reorder_window
        else:
            overflow = s - high - 1 > self.reorder_window
        if overflow:
            if not self.resolve_gaps or not holes.room(entry):
                out.append((ref, Verdict.OUT_OF_ORDER, token))
                return
            if moves and not self.proven(pid, g, s, flags, cert, ts):
                out.append((ref, Verdict.FORGED, token))
                return
            self.skip_gap(pid, entry, g, s, ref, out)
            # Judged again against the entry that now follows the gap.
            self.decide(pid, g, s, flags, ts, ref, out, token, cert)
            return
        waiting = held.get(s) if held is not None else None
        if waiting is not None and g <= waiting.generation:
            # The same record arrived twice while waiting, or an older generation's copy of a
            # record a newer generation is already holding.
            out.append(
                (ref, Verdict.DUPLICATE if g == waiting.generation else Verdict.FENCED, token)
            )
            return
        if moves and not self.proven(pid, g, s, flags, cert, ts):
            out.append((ref, Verdict.FORGED, token))
            return
        self.touched.add(pid)
        if waiting is not None and held is not None:
            # A successor generation re-sent a record a zombie's copy of which is waiting: the
            # waiting copy could only be fenced at release, and calling the resend a DUPLICATE of
            # it would lose the record. Fence the zombie's copy now and hold the resend instead.
            del held[s]
            out.append((waiting.ref, Verdict.FENCED, waiting.token))
        if held is None:
            held = self.held[pid] = {}
        held[s] = Held(s, g, flags, max(self.clock, ts), self.next_arrival, ref, token)
        self.next_arrival += 1
        out.append((ref, Verdict.BUFFERED, token))
        self.advance(ts, out)

    def decide_new(
        self,
        pid: int,
        g: int,
        s: int,
        fence: int,
        ts: int,
        at: int,
        ref: Any,
        out: list[Emit],
        token: tuple[int, int] | None,
        cert: bytes | None,
    ) -> None:
        """A record of a pid without a live entry: create one, adopt it, or refuse it."""
        if self.ring.full and self.entries[self.ring.head()[0]].first_seen + self.life > at:
            out.append((ref, Verdict.CAPACITY, token))
            return
        # A waiting record proved its generation when it started to wait.
        vouched = self.covered(pid, g)
        start = fence or s == 0
        inside = at < self.horizon
        if not (vouched or start or inside):
            out.append((ref, Verdict.UNKNOWN_PID, token))
            return
        if not vouched and self.verifier is not None:
            # Forgeries are refused before anyone is asked about them.
            if not start and cert is None:
                out.append((ref, Verdict.UNVERIFIED, token))
                return
            if not self.certified(pid, g, s, fence, cert, ts):
                out.append((ref, Verdict.FORGED, token))
                return
        answer = VOUCHED if vouched else None
        if not vouched and inside and self.authority is not None:
            answer = self.ask(pid, g, s, fence, ts, at, ref, out, token)
            if answer is None:
                return
        if not start and answer != VOUCHED:
            out.append((ref, Verdict.UNKNOWN_PID, token))
            return
        out.append((ref, Verdict.FENCE if fence else Verdict.APPENDED, token))
        self.advance(ts, out)
        self.create(pid, g, s - 1 if fence else s, self.clock)
        if s and not fence:
            self.gaps.append(Gap(pid, g, 0, s - 1, ref, "head"))
            if self.resolve_gaps:
                # The head stays open, as a skipped gap does: nothing of this pid below ``s``
                # was appended, and a timeout hole in it is re-sent by the resume.
                holes.add(self.entries[pid], 0, s - 1)

    def skip_gap(self, pid: int, entry: Entry, g: int, s: int, ref: Any, out: list[Emit]) -> None:
        """The window overflowed at seq ``s``: report the seqs below the lowest waiting record
        (or ``s``) as lost, keep them open, and move the highwater up to it, appending what then
        follows."""
        held = self.held.get(pid)
        low = min(*held, s) if held else s
        after = held[low].ref if held and low < s else ref
        gen = held[low].generation if held and low < s else g
        self.gaps.append(Gap(pid, gen, entry.highwater + 1, low - 1, after, "lost"))
        self.touched.add(pid)
        self.stale.discard(pid)
        holes.add(entry, entry.highwater + 1, low - 1)
        entry.highwater = low - 1
        if held:
            self.release(pid, entry, out)

    def settle(self, pid: int, entry: Entry, out: list[Emit]) -> None:
        """Gap resolution, when ``gE`` just moved: records of an older generation waiting behind
        a hole are appended after it (the hole reported and kept open), newer ones released as
        usual.

        Only those that reached the log before every waiting record of a newer generation: they
        are no zombie's writes (DESIGN §4 amended a third time: order is the log's order); a
        later one is ``FENCED``, as one is when no hole can be kept for it. The hole before them
        is Kafka's loss, or records that timed out in the producer's queue: its resumer re-sends
        those under the new generation, and they fill it.
        """
        held = self.held[pid]
        self.stale.discard(pid)
        cut = min(
            (h.arrival for h in held.values() if h.generation >= entry.generation), default=None
        )
        older = sorted(
            (h for h in held.values() if h.generation < entry.generation), key=lambda h: h.seq
        )
        for h in older:
            del held[h.seq]
            gap = h.seq > entry.highwater + 1
            if (cut is not None and h.arrival > cut) or (gap and not holes.room(entry)):
                out.append((h.ref, Verdict.FENCED, h.token))
                continue
            if gap:
                self.gaps.append(
                    Gap(pid, h.generation, entry.highwater + 1, h.seq - 1, h.ref, "lost")
                )
                holes.add(entry, entry.highwater + 1, h.seq - 1)
            entry.highwater = h.seq
            out.append((h.ref, Verdict.APPENDED, h.token))
        if held:
            self.release(pid, entry, out)
        elif pid in self.held:
            del self.held[pid]

    def release(self, pid: int, entry: Entry, out: list[Emit]) -> None:
        """Append held records that now follow the highwater, re-checking each one."""
        held = self.held[pid]
        while True:
            nxt = held.pop(entry.highwater + 1, None)
            if nxt is None:
                break
            if nxt.generation < entry.generation:
                # A generation bump while it waited: a zombie's record.
                out.append((nxt.ref, Verdict.FENCED, nxt.token))
                break
            entry.generation = nxt.generation
            entry.highwater = nxt.seq
            out.append((nxt.ref, Verdict.APPENDED, nxt.token))
        if not held:
            del self.held[pid]

    def flush_held(self, out: list[Emit]) -> None:
        """Every held record becomes ``OUT_OF_ORDER``, every waiting one ``FENCED`` (in arrival
        order)."""
        closing = [
            (h, Verdict.OUT_OF_ORDER) for by_seq in self.held.values() for h in by_seq.values()
        ]
        closing += [(h, Verdict.FENCED) for w in self.pending.values() for h in w.records]
        for held, verdict in sorted(closing, key=lambda c: c[0].arrival):
            out.append((held.ref, verdict, held.token))
        self.touched.update(self.held)
        self.held.clear()
        self.pending.clear()

    def waiting(self) -> Iterator[Held]:
        """Every record held for reordering or waiting on the authority."""
        for by_seq in self.held.values():
            yield from by_seq.values()
        for w in self.pending.values():
            yield from w.records
