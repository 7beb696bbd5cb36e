"""``ProducerSession``: the producer's lease session as a state machine with no I/O.

Every decision of the producer's lease lifecycle lives here; the callers do the I/O and report
back. :class:`~pidfence.producer.IdempotentProducer` drives it with confluent-kafka and a
:class:`~pidfence.pid_allocator.LeaseClient`; the simulation (:mod:`pidfence.sim`) runs that same
producer over a simulated Kafka client, lease server and clock. Time is a parameter (``now_ms``)
of every call that depends on it.

What it decides:

* **the lease states** (:class:`~pidfence.producer.state.LeaseState`, checked transitions) and
  when a rollover is due (``rollover_fraction`` of the lifetime; never after the lease end);
* **stamping only while the lease is live** (:meth:`sendable`, :meth:`ended`);
* **the roll and its handover**: drain first (:meth:`begin_roll`, :meth:`drained`), then the
  successor inherits what it must not send again (:meth:`rolled`); a refused roll fences, an
  unanswered one keeps the old lease until it ends (:meth:`roll_unanswered`);
* **which certificate a record carries** besides ``pf`` (:meth:`extras`, :mod:`.headers`): ONE
  decision for FENCE and data records (placed certificates, re-stamped every ``restamp_ms``),
  and the ``ready`` lanes stamped inline until :attr:`deadline_ns`; the record MAC (``pfm``) is
  added by whoever sends the record, from the sequencer's key;
* **a resume**: the lifetime it continues with, the topics it fences and scans, the FENCE records
  (:meth:`fences`, under the pid and generation it continues, successor included), and what the
  recovery scan's findings mean (:meth:`scanned`: re-send under the same pid, skip after a
  rollover).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pidfence.producer import recovery
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.errors import DrainFailed, LeaseExpired, ProducerError, ProducerFenced
from pidfence.producer.headers import Fence, Header, cert_headers, mac_headers, owes_cert
from pidfence.producer.lease import Resumed
from pidfence.producer.recovery import (
    CertVerifier,
    Highs,
    Holes,
    ScanState,
    apply_scan,
    scan_state,
)
from pidfence.producer.sequencer import Sequencer
from pidfence.producer.state import LeaseState, LeaseStateMachine
from pidfence.wire import FLAG_FENCE, decode_pf

log = logging.getLogger(__name__)

_NONE: tuple[Header, ...] = ()


class ProducerSession:
    """The lease session of one producer: states, rollover, stamping decisions, resume plan.

    Not thread-safe: one producer thread drives it.

    Args:
        config: the producer settings (rollover fraction, default lifetime, message timeout,
            clock skew).
    """

    def __init__(self, config: ProducerConfig) -> None:
        self._fraction = config.rollover_fraction
        self._default_lifetime_ms = config.default_lifetime_ms
        self._message_timeout_ms = config.message_timeout_ms
        self._skew_ms = config.clock_skew_ms
        self._scan_late_ms = config.scan_late_ms
        self._restamp_ms = config.restamp_ms
        self._resolve_gaps = config.sink_resolves_gaps
        #: When every partition's next record carries the ``pfc`` again (epoch ms).
        self._restamp_at = 0
        self._machine = LeaseStateMachine()
        self._seq: Sequencer | None = None
        #: The sequencer while ``LEASED``, else None: the stamping loop checks one attribute.
        self.live: Sequencer | None = None
        #: When the next rollover is due (epoch ms); never after the lease end.
        self.rollover_at = 0
        #: Until this time (ns on the same base), :attr:`live`'s ``ready`` lanes may be stamped
        #: inline: no rollover is due and :meth:`extras` stays empty for them.
        self.deadline_ns = 0
        #: pid -> lease end of every pid this session held (the send ledger's ``expire_ms``).
        self.lease_ends: dict[int, int] = {}
        self.rollovers = 0
        #: Records not sent because the recovery scan found them in Kafka already.
        self.skipped = 0
        self._followed: int | None = None

    # ---- states -------------------------------------------------------------------------

    @property
    def state(self) -> LeaseState:
        """The lease state."""
        return self._machine.state

    @property
    def sequencer(self) -> Sequencer:
        """The current (or, once closed, the last) sequencer.

        Raises:
            ProducerError: no pid was ever leased.
        """
        if self._seq is None:
            raise ProducerError(f"the producer is {self.state}: it holds no pid")
        return self._seq

    def current(self) -> Sequencer:
        """The sequencer of the ``LEASED`` state.

        Raises:
            ProducerFenced: the session is ``FENCED``.
            ProducerError: any other state (``CLOSED``, mid-roll, never leased).
        """
        state = self._machine.state
        if state is LeaseState.FENCED:
            raise ProducerFenced(
                "the producer is FENCED: another owner moved its pid on; stop this instance"
            )
        if state is not LeaseState.LEASED or self._seq is None:
            raise ProducerError(f"the producer is {state}: it cannot send")
        return self._seq

    def _move(self, to: LeaseState) -> None:
        self._machine.move(to)
        self.live = self._seq if to is LeaseState.LEASED else None

    def leased(self, sequencer: Sequencer) -> None:
        """A lease (or a resume's bump or roll) was granted: send under ``sequencer``."""
        self._seq = sequencer
        self.lease_ends[sequencer.pid] = sequencer.expire_ms
        lifetime = sequencer.lifetime_ms or self._default_lifetime_ms
        margin = round(lifetime * (1 - self._fraction))
        if margin <= self._message_timeout_ms:
            log.warning(
                "the rollover margin (%d ms) is not above message_timeout_ms (%d ms): a process "
                "paused with records in flight could deliver them after its lease ended; lower "
                "message_timeout_ms (`--message-timeout` of pidfence produce and copy) or "
                "rollover_fraction",
                margin,
                self._message_timeout_ms,
            )
        self._set_rollover(sequencer.expire_ms - margin)
        self._move(LeaseState.LEASED)

    def refused(self) -> None:
        """The lease server refused this session's lineage (a resume or a roll): ``FENCED``."""
        self._move(LeaseState.FENCED)

    def close(self) -> None:
        """``CLOSED`` (terminal)."""
        if self._machine.state is not LeaseState.CLOSED:
            self._move(LeaseState.CLOSED)

    # ---- time ---------------------------------------------------------------------------

    def _set_rollover(self, at_ms: int) -> None:
        if self._seq is not None:
            # The stamping loop checks the lease end only once the rollover point has passed.
            at_ms = min(at_ms, self._seq.expire_ms)
        self.rollover_at = at_ms
        self._set_deadline()

    def _set_deadline(self) -> None:
        """Inline stamping stops at the rollover point, or at the next re-stamp (signing on)."""
        at_ms = self.rollover_at
        if self._restamps():
            at_ms = min(at_ms, self._restamp_at)
        self.deadline_ns = at_ms * 1_000_000

    def _restamps(self) -> bool:
        return bool(self._restamp_ms) and self._seq is not None and self._seq.cert is not None

    def _restamp(self, now_ms: int) -> None:
        """Past the re-stamp time: every partition's next record carries the ``pfc`` again."""
        if not self._restamps() or now_ms < self._restamp_at:
            return
        current = self.sequencer
        for tp in current.certified:
            current.unready(*tp)
        current.certified.clear()
        self._restamp_at = now_ms + self._restamp_ms
        self._set_deadline()

    def rollover_due(self, now_ms: int) -> bool:
        """True once ``now_ms`` passed the rollover point."""
        return now_ms >= self.rollover_at

    def ended(self, now_ms: int) -> bool:
        """True once the current lease has ended: nothing may be stamped under it any more."""
        return now_ms >= self.sequencer.expire_ms

    def sendable(self, now_ms: int) -> Sequencer:
        """The sequencer to stamp with at ``now_ms`` (roll first when :meth:`rollover_due`).

        Raises:
            ProducerFenced / ProducerError: not ``LEASED``.
            LeaseExpired: the lease has ended (the rollover could not happen in time).
        """
        seq = self.current()
        if self.ended(now_ms):
            raise LeaseExpired(
                f"the lease of pid {seq.pid} ended at {seq.expire_ms} before it could be rolled "
                "over; retry (resume from the last checkpoint) once a lease server answers"
            )
        return seq

    # ---- rollover -----------------------------------------------------------------------

    def begin_roll(self) -> Sequencer:
        """``LEASED`` -> ``DRAINING``; returns the sequencer to drain and roll."""
        current = self.current()
        self._move(LeaseState.DRAINING)
        return current

    def drain_budget_s(self, now_ms: int) -> float:
        """How long the drain may wait: until the old lease ends (its records must land in it)."""
        return max((self.sequencer.expire_ms - now_ms) / 1000.0, 0.0)

    def drain_aborted(self) -> None:
        """The drain raised (a delivery error): back to ``LEASED``, nothing was rolled."""
        self._move(LeaseState.LEASED)

    def drained(self, left: int) -> None:
        """The drain ended with ``left`` records unacknowledged; ``DRAINING`` -> ``ROLLING``.

        Raises:
            DrainFailed: ``left > 0``: back to ``LEASED``, nothing may go out under a new pid.
        """
        if left:
            self._move(LeaseState.LEASED)
            pid = self.sequencer.pid
            raise DrainFailed(
                f"{left} records under pid {pid} were not acknowledged before its lease ended; "
                "nothing was sent under a new pid. Resume from the last checkpoint"
            )
        self._move(LeaseState.ROLLING)

    def roll_refused(self) -> None:
        """The roll was refused (another owner moved the pid on): ``FENCED``."""
        self.refused()

    def roll_unanswered(self, reason: Exception, now_ms: int) -> None:
        """No lease server answered the roll: keep the old lease, retry inside it.

        The retry is due a quarter of the remaining lease later.

        Raises:
            LeaseExpired: the old lease has ended: nothing can be sent any more.
        """
        self._move(LeaseState.LEASED)
        current = self.sequencer
        if self.ended(now_ms):
            raise LeaseExpired(
                f"the lease of pid {current.pid} ended at {current.expire_ms} and it could "
                f"not be rolled over ({reason}); retry (resume from the last checkpoint) once a "
                "lease server answers"
            ) from reason
        self._set_rollover(now_ms + max((current.expire_ms - now_ms) // 4, 1))

    def roll_lapsed(self) -> None:
        """The roll found the pid forgotten (its lease ended over a retention ago): back to
        ``LEASED`` under the ended lease, under which nothing is sent (``LeaseExpired``)."""
        self._move(LeaseState.LEASED)

    def rolled(self, successor: Sequencer, now_ms: int) -> ProducerCheckpoint:
        """The roll succeeded: hand over to ``successor``; returns its checkpoint to store.

        The successor skips what its predecessor must not see sent twice
        (:func:`~pidfence.producer.recovery.handover`) and inherits its topics.
        """
        current = self.sequencer
        for tp, runs in recovery.handover(current).items():
            for n, sends in runs:
                successor.with_skip({tp: n}, {tp: sends})
        successor.topics = current.topics | {t for t, _ in current.partitions()}
        self.leased(successor)
        self.rollovers += 1
        log.info("rolled pid %d over to pid %d", current.pid, successor.pid)
        return successor.checkpoint(now_ms)

    # ---- stamping -----------------------------------------------------------------------

    def owes(self, topic: str, partition: int, flags: int) -> bool:
        """Whether a record of (topic, partition) carries a ``pfc`` (cheap: no signature)."""
        return owes_cert(self.sequencer, topic, partition, flags)

    def extras(
        self, topic: str, partition: int, seq: int, flags: int, now_ms: int
    ) -> tuple[Header, ...]:
        """The certificate header a record carries besides ``pf``: the one decision, for every
        record (:func:`~pidfence.producer.headers.cert_headers`); the sender adds ``pfm``. A
        partition whose next record needs nothing is stamped inline by the producer's loop
        until :attr:`deadline_ns` (see :meth:`sent`), so this is asked on the slow path only."""
        del now_ms
        return cert_headers(self.sequencer, topic, partition, seq, flags)

    def stamp(
        self, topic: str, partition: int, now_ms: int
    ) -> tuple[bytes, tuple[Header, ...]] | None:
        """The ``pf`` header and extra headers of the next data record of (topic, partition),
        or None when that record is skipped (already in Kafka under the predecessor pid)."""
        current = self.sequencer
        if current.skip and current.skips_next(topic, partition):
            current.take_skip(topic, partition)
            self.skipped += 1
            return None
        self._restamp(now_ms)
        extras = self.extras(topic, partition, current.peek(topic, partition), 0, now_ms)
        if extras:
            current.certified.add((topic, partition))
        return current.stamp(topic, partition), extras

    def unstamp(self, topic: str, partition: int, extras: tuple[Header, ...]) -> None:
        """Undo :meth:`stamp`: the record was never handed to Kafka."""
        current = self.sequencer
        current.rewind(topic, partition)
        if extras:
            current.certified.discard((topic, partition))

    def sent(self, topic: str, partition: int, now_ms: int) -> None:
        """A stamped record was handed to Kafka: let the loop stamp the partition inline from
        now on when its next record owes no skip and no certificate (the loop adds the record
        MAC itself, from :attr:`Sequencer.mac_hasher`)."""
        del now_ms
        current = self.sequencer
        if (topic, partition) in current.skip:
            # A position of the skip run sent after all (a predecessor's hole): taken only now,
            # so a record that never reached the client (a full queue) keeps its place.
            current.take_skip(topic, partition)
            return
        if self.owes(topic, partition, 0):
            return
        current.mark_ready(topic, partition)

    # ---- resume -------------------------------------------------------------------------

    def resumed(
        self, resumed: Resumed, checkpoint: ProducerCheckpoint, topics: Iterable[str]
    ) -> list[str]:
        """Continue ``checkpoint`` as the lease server allowed; returns the topics to FENCE and
        scan: the checkpoint's, those it has seqs on and the caller's (a checkpoint saved
        before its first record names none, yet its pid may have written since)."""
        sequencer = resumed.sequencer
        self._followed = resumed.followed
        if resumed.how == "bumped":
            sequencer.lifetime_ms = checkpoint.lifetime_ms or self._default_lifetime_ms
        self.leased(sequencer)
        names = set(checkpoint.topics) | {t for t, _ in checkpoint.next_seq} | set(topics)
        sequencer.topics |= names
        return sorted(names)

    def fences(self, walk_from: int, partitions: Iterable[TopicPartition]) -> list[Fence]:
        """The FENCE records a resume writes before any data (DESIGN §6): ``partitions`` and
        every partition with a counter, one per generation from ``walk_from`` up to the current
        one (the rules accept one step at a time)."""
        current = self.sequencer
        out = []
        for topic, partition, header in current.fences(walk_from, partitions):
            # Only the current generation has a cert; the walk's lower FENCEs cannot carry one.
            top = header == current.fence_header(topic, partition)
            pf = decode_pf(header)
            extras = self.extras(topic, partition, pf.seq, FLAG_FENCE, 0) if top else _NONE
            if top:
                current.fenced[(topic, partition)] = pf.generation
            extras += mac_headers(
                current, topic, partition, pf.seq, FLAG_FENCE, None, b"", pf.generation
            )
            out.append(Fence(topic, partition, header, extras))
        return out

    def scan_needed(self, checkpoint: ProducerCheckpoint) -> bool:
        """Whether the recovery scan runs; a checkpoint without ``taken_ms`` (an older
        pidfence) cannot be scanned: its skips are carried over and a warning says why."""
        if checkpoint.taken_ms:
            return True
        current = self.sequencer
        log.warning(
            "checkpoint of pid %d has no taken_ms (written by an older pidfence): no recovery "
            "scan; records its owner sent after it may be appended twice if this instance rolls "
            "over before re-sending them",
            checkpoint.pid,
        )
        if current.pid != checkpoint.pid:
            current.with_skip(checkpoint.skip, checkpoint.resend)
        return False

    def scan_state(
        self, checkpoint: ProducerCheckpoint, verifier: CertVerifier | None
    ) -> tuple[ScanState, int]:
        """The scan's starting state and its start time (``taken_ms`` less the clock skew)."""
        current = self.sequencer
        state = scan_state(
            checkpoint,
            current.pid,
            verifier,
            self._followed,
            self._resolve_gaps,
            recovery.scan_keys(checkpoint, current, self._followed),
            self._scan_late_ms,
        )
        return state, checkpoint.taken_ms - self._skew_ms

    def scanned(
        self, checkpoint: ProducerCheckpoint, highs: Highs, holes: Holes | None = None
    ) -> None:
        """What the scan found: re-send up to it under the same pid, or skip it after a roll
        (but for the holes the sink skipped, which are sent)."""
        current = self.sequencer
        apply_scan(current, checkpoint, highs, self._followed, holes)
        if current.ahead or current.skip:
            log.info(
                "recovery scan: pid %d re-sends up to %s; skips %s (already in Kafka)",
                current.pid,
                current.ahead,
                current.skip,
            )

    def bumped(self, sequencer: Sequencer, now_ms: int) -> ProducerCheckpoint:
        """A bump of the live pid was granted: stamp under ``sequencer``'s generation from now
        on (the state stays ``LEASED``, the lease end is the pid's); returns its checkpoint."""
        self._seq = self.live = sequencer
        return sequencer.checkpoint(now_ms)

    def checkpoint(self, now_ms: int) -> ProducerCheckpoint:
        """The identity and next seqs to store (take it when nothing is in flight)."""
        return self.current().checkpoint(now_ms)
