"""Adoption through the authority: what the table does with a pid it could not see start.

A mixin of :class:`~pidfence.broker_plugin.rules.RulesKernel` (DESIGN §4 amended a third time).
Inside a horizon (where the table could not have seen producers start: a trimmed head, a late
start, lost offsets) a FENCE it never saw may precede what it reads, so the log alone cannot
tell a producer's records from a zombie's. The table asks the lease authority
(:data:`~pidfence.broker_plugin.entry.Authority`) before it creates an entry there:

* under signing, first the certificate: a record at ``seq > 0`` without one is ``UNVERIFIED``,
  one with a bad one ``FORGED`` (nobody is asked about a forgery);
* no authority, or no answer: a record at ``seq > 0`` is ``UNKNOWN_PID`` (no adoption); a
  FENCE or a ``seq 0`` creates its entry as the proposal says (nothing is adopted);
* the lease ended at the record's time: ``UNKNOWN_PID`` (an ended lease is never adopted,
  whatever the table saw of it before);
* a generation above the authority's: ``INVALID_GENERATION`` (nobody was granted it);
* the authority's generation: created, or adopted at ``seq > 0`` (its head reported);
* an older generation: the record waits (:class:`~pidfence.broker_plugin.entry.Pending`) until
  the log shows it came before the FENCEs of the generations after it, else it is ``FENCED``.

Inside a horizon the FENCE (and its certificate) that moved a known producer's generation may be
gone too: a later generation the authority names as granted moves the entry as that FENCE would
have (:meth:`Adoption.vouches`), and a producer known before offsets that were not read is asked
about at its next record (:meth:`Adoption.confirm`): behind the authority's generation, its
records wait as an unknown pid's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pidfence.broker_plugin.entry import (
    PENDING_LIMIT,
    Authority,
    Emit,
    Entry,
    Held,
    Pending,
    Verifier,
)
from pidfence.wire import FLAG_FENCE, Verdict

#: :meth:`Adoption.ask`'s answers besides a verdict emitted.
VOUCHED = "vouched"
UNANSWERED = "unanswered"


class Adoption:
    """Authority answers and the records waiting on them (see the module docstring)."""

    authority: Authority | None
    verifier: Verifier | None
    capacity: int
    pending: dict[int, Pending]
    unconfirmed: set[int]
    touched: set[int]
    entries: dict[int, Entry]
    #: (pid, generation): waiting records being adopted, up to that generation; nobody is asked.
    vouched: tuple[int, int] | None
    grace_ms: int
    clock: int
    horizon: int
    next_arrival: int

    resolve_gaps: bool
    held: dict[int, dict[int, Held]]

    if TYPE_CHECKING:  # provided by the kernel

        def decide(self, *args: Any) -> None: ...
        def settle(self, pid: int, entry: Entry, out: list[Emit]) -> None: ...
        def live_at(self, at: int) -> int: ...
        def advance(self, ts_ms: int, out: list[Emit]) -> int: ...
        def certified(
            self, pid: int, g: int, s: int, flags: int, cert: bytes | None, ts: int
        ) -> bool: ...

    def ask(
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
    ) -> str | None:
        """Judge an unknown pid's record inside a horizon by the authority's answer (under
        signing the record proved its generation already).

        Returns :data:`VOUCHED` (create or adopt it), :data:`UNANSWERED` (no answer: create it
        only as the proposal would) or None (a verdict was emitted: refused, or waiting).
        """
        status = self.authority(pid) if self.authority is not None else None
        if status is None or not status.known:
            return UNANSWERED
        if at >= status.expire_ms:
            out.append((ref, Verdict.UNKNOWN_PID, token))
            return None
        if g > status.generation:
            out.append((ref, Verdict.INVALID_GENERATION, token))
            return None
        if g == status.generation:
            return VOUCHED
        if self.live_at(at) + len(self.pending) >= self.capacity:
            # A waiting pid holds records as an entry does: it takes a place of the capacity.
            out.append((ref, Verdict.CAPACITY, token))
            return None
        # An older generation: the record waits for the log to show where it stands.
        self.pending[pid] = Pending(g, status.expire_ms, [])
        self.wait(pid, g, s, FLAG_FENCE if fence else 0, ts, ref, out, token)
        return None

    def confirm(
        self,
        pid: int,
        entry: Entry,
        g: int,
        s: int,
        flags: int,
        ts: int,
        ref: Any,
        out: list[Emit],
        token: tuple[int, int] | None,
        cert: bytes | None,
    ) -> bool:
        """The first record of a known pid after offsets that were not read (True: judge it
        against the entry now; False: it waits).

        The authority's answer settles it: its generation is the entry's, or unknown (nothing
        changes); a record at the authority's newer generation moves the entry there, as the
        FENCE that was not read did; a record at a generation below the authority's (the
        entry's, or one between) waits (:class:`~pidfence.broker_plugin.entry.Pending`), as an
        unknown pid's does: it may be a zombie's, written after a FENCE that was not read.

        Only a record that settles it confirms the pid. One the rules will refuse (a generation
        nobody granted, a lease that ended, a FENCE or certificate that does not prove itself
        under signing) changes nothing, so a forgery cannot switch the question off for the
        zombie's records after it, and a rebuild, which skips forgeries, asks as the run did.
        """
        at = max(self.clock, ts)
        if self.authority is None or at >= self.horizon or g < entry.generation:
            return True  # an older generation is FENCED by the rules: the next record asks
        status = self.authority(pid)
        if status is None or not status.known or status.generation <= entry.generation:
            if g == entry.generation:
                self.unconfirmed.discard(pid)
            return True
        if g > entry.generation and (g >= status.generation or at >= status.expire_ms):
            live = g == status.generation and at < status.expire_ms
            if live and self._proves(pid, g, s, flags, cert, at):
                self.unconfirmed.discard(pid)
                self.touched.add(pid)
                entry.generation = g
                if self.resolve_gaps and pid in self.held:
                    # As the move the FENCE not read made: the older generation's records
                    # waiting behind a hole came before it (the authority named theirs current
                    # when they were read), so gap resolution appends them.
                    self.settle(pid, entry, out)
            return True  # otherwise the rules refuse it, and the next record asks
        self.unconfirmed.discard(pid)
        self.pending[pid] = Pending(g, status.expire_ms, [])
        self.wait(pid, g, s, flags & FLAG_FENCE, ts, ref, out, token)
        return False

    def _proves(self, pid: int, g: int, s: int, flags: int, cert: bytes | None, at: int) -> bool:
        """Whether a record at the authority's generation proves it, under signing: by its
        certificate if it has one; without, a data record is vouched for (its generation's
        certificate went with the records not read), a FENCE is not (it always carries one)."""
        if self.verifier is None:
            return True
        if cert is None:
            return not flags & FLAG_FENCE
        return self.verifier(pid, g, s, flags, cert, at) is None

    def vouches(self, pid: int, g: int, ts: int) -> bool:
        """Inside a horizon, whether the authority names generation ``g`` of ``pid`` as its
        current one, with the lease live at the record's time: a record of it moves a known
        entry there without the FENCE the table never saw. An older generation is not vouched
        for: after a newer FENCE that was not read, its records are a zombie's."""
        at = max(self.clock, ts)
        if self.authority is None or at >= self.horizon:
            return False
        status = self.authority(pid)
        return (
            status is not None
            and status.known
            and g == status.generation
            and (at < status.expire_ms)
        )

    def wait(
        self,
        pid: int,
        g: int,
        s: int,
        flags: int,
        ts: int,
        ref: Any,
        out: list[Emit],
        token: tuple[int, int] | None,
    ) -> None:
        """Hold a record of a waiting pid."""
        waiting = self.pending[pid]
        waiting.records.append(
            Held(s, g, flags, max(self.clock, ts), self.next_arrival, ref, token)
        )
        self.next_arrival += 1
        out.append((ref, Verdict.BUFFERED, token))
        self.advance(ts, out)

    def still_waiting(
        self,
        pid: int,
        g: int,
        s: int,
        fence: int,
        ts: int,
        ref: Any,
        out: list[Emit],
        token: tuple[int, int] | None,
        cert: bytes | None,
    ) -> bool:
        """A record of a pid whose records wait (True: it was decided; False: the wait ended,
        judge it now).

        The waiting records wait for the log to show the FENCEs of every generation after
        theirs, in order, up to the authority's current one: each next FENCE adds its
        generation to the wait (its records wait with the rest), the authority's current one
        proves them all (they came before it, as the strict rules would see; each is then
        judged by them in arrival order). A record of an older generation than the newest
        FENCE waiting is ``FENCED`` on its own; anything else (a data record of a newer
        generation, a FENCE further ahead, the limit of waiting records) ends the wait:
        every waiting record is ``FENCED``. Under signing each FENCE proves itself first.
        """
        waiting = self.pending[pid]
        top = waiting.generation
        if g == top:
            if len(waiting.records) < PENDING_LIMIT:
                self.wait(pid, g, s, fence, ts, ref, out, token)
                return True
        elif g < top:
            out.append((ref, Verdict.FENCED, token))
            return True
        elif fence and g == top + 1 and len(waiting.records) < PENDING_LIMIT:
            status = self.authority(pid) if self.authority is not None else None
            if status is not None and status.known and g <= status.generation:
                if not self.certified(pid, g, s, FLAG_FENCE, cert, ts):
                    out.append((ref, Verdict.FORGED, token))
                    return True
                if g < status.generation:
                    waiting.generation = g
                    self.wait(pid, g, s, fence, ts, ref, out, token)
                    return True
                self.adopt_waiting(pid, g, out)
                return False
        refused = self.unproven(pid, g, s, fence, cert, ts)
        if refused is not None:
            # Only a record that proves its generation ends the wait: a forgery changes nothing
            # (and a rebuild, which skips forgeries, goes on waiting as the run did).
            out.append((ref, refused, token))
            return True
        del self.pending[pid]
        out.extend((h.ref, Verdict.FENCED, h.token) for h in waiting.records)
        if pid in self.entries:
            # A known pid's: the record that ended the wait is asked about in turn.
            self.unconfirmed.add(pid)
        return False

    def unproven(
        self, pid: int, g: int, s: int, fence: int, cert: bytes | None, ts: int
    ) -> Verdict | None:
        """Under signing, the verdict of a record that does not prove generation ``g`` (None:
        it proves it, or nothing is signed): by its certificate, or, a data record without one,
        by the authority vouching for its generation."""
        if self.verifier is None:
            return None
        if cert is None:
            if not fence and self.vouches(pid, g, ts):
                return None
            return Verdict.FORGED if fence else Verdict.UNVERIFIED
        flags = FLAG_FENCE if fence else 0
        return None if self.certified(pid, g, s, flags, cert, ts) else Verdict.FORGED

    def adopt_waiting(self, pid: int, g: int, out: list[Emit]) -> None:
        """The FENCE of the authority's generation ``g`` proved the waiting records: judge
        each by the rules, in arrival order (none asks again; each proved its generation)."""
        waiting = self.pending.pop(pid)
        self.vouched = (pid, g)
        try:
            for h in waiting.records:
                self.decide(pid, h.generation, h.seq, h.flags, h.ts_ms, h.ref, out, h.token)
        finally:
            self.vouched = None

    def covered(self, pid: int, g: int) -> bool:
        """Whether waiting records being adopted vouch for ``(pid, g)``."""
        vouched = self.vouched
        return vouched is not None and vouched[0] == pid and g <= vouched[1]

    def expire_waiting(self, now: int, out: list[Emit]) -> None:
        """Waiting records of pids whose lease ended (plus the grace) are ``FENCED``."""
        ended = [pid for pid, w in self.pending.items() if w.expire_ms + self.grace_ms <= now]
        for pid in ended:
            out.extend((h.ref, Verdict.FENCED, h.token) for h in self.pending.pop(pid).records)
