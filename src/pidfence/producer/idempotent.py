"""``IdempotentProducer``: confluent-kafka plus a leased pid, per-partition seqs and ``pf`` headers.

The API object. Its concerns live in their own modules: the lease lifecycle and lineage in
:mod:`~pidfence.producer.lease` (with the state machine of :mod:`~pidfence.producer.state`),
partition choice in :mod:`~pidfence.producer.partitioner`, seqs and headers in
:mod:`~pidfence.producer.sequencer`, acknowledgements and the send ledger in
:mod:`~pidfence.producer.delivery`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import confluent_kafka

from pidfence.ledger import LedgerError, LedgerWriter
from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.config import ProducerConfig
from pidfence.producer.delivery import DeliveryCallback, DeliveryTracker
from pidfence.producer.errors import (
    BatchMismatch,
    BrokerUnavailable,
    DrainFailed,
    LeaseExpired,
    LeaseServerDown,
    NotFlushed,
    ProducerConfigError,
    ProducerError,
    ProducerFenced,
    ReservedHeader,
    ValueTooLarge,
)
from pidfence.producer.lease import LeaseClientLike, LeaseKeeper
from pidfence.producer.partitioner import Partitioner
from pidfence.producer.recovery import (
    SKEW_MS,
    CertVerifier,
    KafkaScanner,
    Scanner,
    apply_scan,
    consumer_conf,
    scan_state,
)
from pidfence.producer.sequencer import U16X, Sequencer
from pidfence.producer.state import LeaseState, LeaseStateMachine
from pidfence.wire import PF_HEADER_KEY
from pidfence.wire.cert import CERT_HEADER_KEY

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | str | None]]
#: Stores a checkpoint together with the caller's current upstream position (see ``roll``).
SaveCheckpoint = Callable[[ProducerCheckpoint], None]

_RESERVED = (PF_HEADER_KEY, CERT_HEADER_KEY)

__all__ = ["IdempotentProducer", "LeaseClientLike", "SaveCheckpoint", "wall_clock_ms"]


def wall_clock_ms() -> int:
    """Epoch milliseconds (the lease server's time base)."""
    return time.time_ns() // 1_000_000


class IdempotentProducer:
    """An idempotent Kafka producer whose records the ``pidfence`` broker rules deduplicate.

    Construct it to lease a fresh pid, or use :meth:`resume` to continue a checkpoint.

    Args:
        config: the producer settings.
        lease_client: a :class:`pidfence.pid_allocator.LeaseClient` (or a fake in tests).
        ledger: path or :class:`~pidfence.ledger.LedgerWriter` for the send ledger (None: none).
        clock: epoch milliseconds, injectable so rollover tests run in ms.
        producer_factory: builds the Kafka client from a librdkafka dict (a fake in unit tests).
        on_roll: called with the successor's checkpoint right after each rollover that
            ``produce`` starts by itself (before the record that triggered it is sent); store it
            with the caller's upstream position (see :meth:`roll`). None: the caller rolls
            itself when :attr:`rollover_due`, or does not checkpoint at all.

    Raises:
        ProducerConfigError: a setting that breaks exactly-once (e.g. ``acks=1``).
        LeaseServerDown: no lease server answered (retriable).
    """

    def __init__(
        self,
        config: ProducerConfig,
        lease_client: LeaseClientLike,
        *,
        ledger: str | Path | LedgerWriter | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        producer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Producer,
        on_roll: SaveCheckpoint | None = None,
        _lease_now: bool = True,
    ) -> None:
        self.config = config
        self._clock = clock
        self._keeper = LeaseKeeper(lease_client, clock)
        self.on_roll = on_roll
        if ledger is not None and not config.success_reports:
            raise ProducerConfigError(
                "the send ledger is written from success reports: use success_reports=True "
                "(the default) with a ledger"
            )
        self._owns_ledger = isinstance(ledger, str | Path)
        writer = LedgerWriter(ledger) if isinstance(ledger, str | Path) else ledger
        self._delivery = DeliveryTracker(writer, config.resend_buffer)
        conf = config.to_librdkafka()
        conf.setdefault("allow.auto.create.topics", False)
        conf.setdefault("logger", logging.getLogger("pidfence.producer.librdkafka"))
        conf["on_delivery"] = self._delivery.on_delivery
        self._producer = producer_factory(conf)
        self._kafka_produce = self._producer.produce
        self._partitioner = Partitioner(
            self._producer.list_topics,
            config.bootstrap_servers,
            config.metadata_timeout_s,
            config.sticky_records,
        )
        self._machine = LeaseStateMachine()
        self._seq: Sequencer | None = None
        # The sequencer while LEASED, else None: produce() checks one attribute, not the state.
        self._live: Sequencer | None = None
        self._rollover_at = 0
        self._rollover_ns = 0
        # Nanoseconds on the clock's time base: the wall clock's own builtin when not injected.
        self._now_ns: Callable[[], int] = (
            time.time_ns if clock is wall_clock_ms else (lambda: clock() * 1_000_000)
        )
        self._tracking = self._delivery.tracking
        #: Values of the current (or last) :meth:`produce_many` handled so far.
        self.batch_done = 0
        self._max_value = config.message_max_bytes
        self.resent = 0
        self.rollovers = 0
        #: Records not sent because the recovery scan found them in Kafka already.
        self.skipped = 0
        #: How :meth:`resume` continued: ``bumped``, ``rolled``, ``followed`` or ``fresh``.
        self.resumed_how = ""
        if _lease_now:
            self._install(self._keeper.lease_new())

    # ---- lease lifecycle ------------------------------------------------------------------

    @classmethod
    def resume(
        cls,
        checkpoint: ProducerCheckpoint,
        lease_client: LeaseClientLike,
        config: ProducerConfig,
        *,
        ledger: str | Path | LedgerWriter | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        producer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Producer,
        on_roll: SaveCheckpoint | None = None,
        fence_timeout_s: float = 60.0,
        stale_probe: int = 8,
        scanner: Scanner | None = None,
        topics: Sequence[str] = (),
    ) -> IdempotentProducer:
        """Continue ``checkpoint`` through its lineage (DESIGN §9), then FENCE, then go on.

        A live pid is bumped (its seqs continue); an expired one is rolled into its successor
        (seqs from 0); a pid already rolled (by its owner right after this checkpoint, or by
        another resumer of it) is followed one step: its successor is bumped with this
        checkpoint's secret, which fences whoever holds the successor. The FENCE records are
        flushed before this returns, so the instance that held the checkpoint before is fenced on
        every partition of the checkpoint's topics at once. ``resumed_how`` says which way it
        went; ``resumed_from_expired`` is True when the pid changed. Store a checkpoint right
        after this returns (it names the new generation or pid).

        ``stale_probe``: a process killed between its bump and saving the next checkpoint leaves
        the server ahead of the stored generation; that many next generations are tried.

        Then a recovery scan (:mod:`~pidfence.producer.recovery`; ``scanner``, default a Kafka
        consumer) reads what the previous instance got into Kafka after the checkpoint, so the
        records it re-sends are never appended a second time under another pid: below that
        point they are re-sent under the same pid (deduplicated) or, after a rollover, skipped.

        Raises:
            ProducerFenced: another owner holds the lineage, or the checkpoint is stale (its pid
                was rolled over after it was taken).
            LeaseServerDown: no lease server answered.
            DeliveryFailed / BrokerUnavailable / UnknownTopic: the FENCE records could not be sent.
        """
        self = cls(
            config,
            lease_client,
            ledger=ledger,
            clock=clock,
            producer_factory=producer_factory,
            on_roll=on_roll,
            _lease_now=False,
        )
        try:
            resumed = self._keeper.resume(checkpoint, stale_probe)
        except ProducerFenced:
            self._move(LeaseState.FENCED)
            raise
        self.resumed_how = resumed.how
        sequencer = resumed.sequencer
        if resumed.how == "bumped":
            sequencer.lifetime_ms = checkpoint.lifetime_ms or config.default_lifetime_ms
        self._install(sequencer)
        # ``topics``: what the caller writes. A checkpoint saved before its first record (a
        # fresh lease) names no topic, yet its pid may have written since: fence and scan them.
        topics = sorted(
            set(checkpoint.topics) | {topic for topic, _ in checkpoint.next_seq} | set(topics)
        )
        sequencer.topics |= set(topics)
        if resumed.walk_from is not None:
            self._write_fences(fence_timeout_s, resumed.walk_from, topics)
        self._recover(checkpoint, topics, scanner)
        log.info(
            "resumed the checkpoint of pid %d (%s): pid %d at generation %d",
            checkpoint.pid,
            resumed.how,
            sequencer.pid,
            sequencer.generation,
        )
        return self

    def _recover(
        self, checkpoint: ProducerCheckpoint, topics: list[str], scanner: Scanner | None
    ) -> None:
        seq = self._sequencer()
        if not checkpoint.taken_ms:
            log.warning(
                "checkpoint of pid %d has no taken_ms (written by an older pidfence): no "
                "recovery scan; records its owner sent after it may be appended twice if this "
                "instance rolls over before re-sending them",
                checkpoint.pid,
            )
            if seq.pid != checkpoint.pid:
                seq.with_skip(checkpoint.skip)
            return
        if scanner is None:
            scanner = KafkaScanner(consumer_conf(self.config.to_librdkafka()))
        parts = [(t, p) for t in topics for p in range(self.partition_count(t))]
        if not parts:
            return  # the checkpoint's pid wrote nothing: nothing to find
        state = scan_state(checkpoint, seq.pid, self._scan_verifier())
        scanner(state, parts, checkpoint.taken_ms - SKEW_MS, dict(self._delivery.fence_ends))
        apply_scan(seq, checkpoint, state.highs)
        if seq.ahead or seq.skip:
            log.info(
                "recovery scan: pid %d re-sends up to %s; skips %s (already in Kafka)",
                seq.pid,
                seq.ahead,
                seq.skip,
            )

    def _scan_verifier(self) -> CertVerifier | None:
        if not self.config.lease_public_keys:
            return None
        from pidfence.wire.cert import KeyFileError, cert_verifier

        try:
            return cert_verifier(self.config.lease_public_keys)
        except KeyFileError as exc:
            raise ProducerConfigError(f"lease_public_keys: {exc}") from None

    @property
    def resumed_from_expired(self) -> bool:
        """True when :meth:`resume` continued under another pid than the checkpoint's."""
        return self.resumed_how in ("rolled", "followed", "fresh")

    def _install(self, sequencer: Sequencer) -> None:
        self._seq = sequencer
        self._delivery.expire_by_pid[sequencer.pid] = sequencer.expire_ms
        lifetime = sequencer.lifetime_ms or self.config.default_lifetime_ms
        margin = round(lifetime * (1 - self.config.rollover_fraction))
        if margin <= self.config.message_timeout_ms:
            log.warning(
                "the rollover margin (%d ms) is not above message_timeout_ms (%d ms): a process "
                "paused with records in flight could deliver them after its lease ended; lower "
                "message_timeout_ms or rollover_fraction",
                margin,
                self.config.message_timeout_ms,
            )
        self._set_rollover(sequencer.expire_ms - margin)
        self._move(LeaseState.LEASED)

    def _move(self, to: LeaseState) -> None:
        self._machine.move(to)
        self._live = self._seq if to is LeaseState.LEASED else None

    def _set_rollover(self, at_ms: int) -> None:
        if self._seq is not None:
            # produce() checks the lease end only once the rollover point has passed.
            at_ms = min(at_ms, self._seq.expire_ms)
        self._rollover_at = at_ms
        self._rollover_ns = at_ms * 1_000_000

    @property
    def state(self) -> LeaseState:
        """The lease state."""
        return self._machine.state

    @property
    def rollover_due(self) -> bool:
        """True once the clock passed the rollover point (the next ``produce`` rolls over)."""
        return self._clock() >= self._rollover_at

    def roll(self, save: SaveCheckpoint | None = None) -> ProducerCheckpoint:
        """Roll over to the pid's successor now; returns the successor's checkpoint.

        In order: drain (every record under the old pid acknowledged, within the old lease),
        ``roll`` through the lease server (a compare-and-set on the current generation), then
        ``save(successor's checkpoint)``. ``save`` (default: the ``on_roll`` given at
        construction) must store the checkpoint atomically with the caller's upstream position,
        which does not move during the call: the successor's seqs start at that position. A
        crash between the roll and the save is safe: resuming the older checkpoint follows the
        lineage to the successor and skips what the old pid got into Kafka after it.

        Raises:
            DrainFailed: records under the old pid were not acknowledged before its lease ended
                (or a delivery failed); nothing was sent under a new pid.
            ProducerFenced: the roll was refused (another owner bumped or rolled this pid); the
                producer is ``FENCED`` and sends nothing more.
            LeaseServerDown: no lease server answered; the old lease is kept (retriable).
            LeaseExpired: as LeaseServerDown, but the old lease has ended: nothing can be sent.
        """
        save = save if save is not None else self.on_roll
        current = self._sequencer()
        self._move(LeaseState.DRAINING)
        try:
            self._drain(current)
        except BaseException:
            self._move(LeaseState.LEASED)
            raise
        self._move(LeaseState.ROLLING)
        try:
            fresh = self._keeper.roll(current)
        except ProducerFenced:
            self._move(LeaseState.FENCED)
            raise
        except LeaseServerDown as exc:
            self._move(LeaseState.LEASED)
            now = self._clock()
            if now >= current.expire_ms:
                raise LeaseExpired(
                    f"the lease of pid {current.pid} ended at {current.expire_ms} and it could "
                    f"not be rolled over ({exc}); retry (resume from the last checkpoint) once a "
                    "lease server answers"
                ) from exc
            # Try again a little later, still inside the old lease.
            self._set_rollover(now + max((current.expire_ms - now) // 4, 1))
            raise
        fresh.with_skip(current.handover())
        fresh.topics = current.topics | {t for t, _ in current.partitions()}
        self._install(fresh)
        self.rollovers += 1
        log.info("rolled pid %d over to pid %d", current.pid, fresh.pid)
        checkpoint = fresh.checkpoint(self._clock())
        if save is not None:
            save(checkpoint)
        return checkpoint

    def _drain(self, current: Sequencer) -> None:
        # Drain inside the old lease: a record of the old pid acknowledged after its end would be
        # judged against an expired entry. The rollover point leaves 1/24 of the lifetime for it.
        budget_s = max((current.expire_ms - self._clock()) / 1000.0, 0.0)
        left = self.flush(budget_s)
        if left:
            raise DrainFailed(
                f"{left} records under pid {current.pid} were not acknowledged before its lease "
                f"ended; nothing was sent under a new pid. Resume from the last checkpoint"
            )

    def _auto_roll(self) -> None:
        seq = self._sequencer()
        try:
            self.roll()
        except LeaseServerDown as exc:
            # roll() raised LeaseExpired instead if the lease had ended; here it is still live.
            log.warning("rollover of pid %d failed (%s); retrying later", seq.pid, exc)

    def _sequencer(self) -> Sequencer:
        state = self._machine.state
        if state is LeaseState.FENCED:
            raise ProducerFenced(
                "the producer is FENCED: another owner moved its pid on; stop this instance"
            )
        if state is not LeaseState.LEASED or self._seq is None:
            raise ProducerError(f"the producer is {state}: it cannot send")
        return self._seq

    @property
    def sequencer(self) -> Sequencer:
        """The current (or, once closed, the last) sequencer: pid, generation, counters.

        Raises:
            ProducerError: no pid was ever leased.
        """
        if self._seq is None:
            raise ProducerError(f"the producer is {self._machine.state}: it holds no pid")
        return self._seq

    # ---- sending --------------------------------------------------------------------------

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` from cached metadata (fetched on first use).

        Raises:
            UnknownTopic: the topic does not exist.
            BrokerUnavailable: no broker answered within ``metadata_timeout_s``.
        """
        return self._partitioner.count(topic)

    def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
        event_id: str | None = None,
    ) -> int:
        """Send one record; returns the partition it goes to.

        Args:
            topic: an existing topic.
            value: the record value.
            key: keyed records go to Kafka's default murmur2 partition.
            partition: an explicit partition (overrides the key).
            headers: extra headers; the names ``pf`` and ``pfc`` are reserved.
            on_delivery: ``callback(err, msg)`` called after the producer's own bookkeeping.
            event_id: the upstream event this record carries, for the send ledger and the
                event-level checker (default: the value digest). Give the same id to a re-send.

        Raises:
            ReservedHeader: a header named ``pf`` or ``pfc``.
            ValueTooLarge: value larger than ``message_max_bytes``.
            UnknownTopic / BrokerUnavailable: from the first metadata lookup of ``topic``.
            DrainFailed / ProducerFenced / LeaseExpired: from a rollover due now (see
                :meth:`roll`); LeaseExpired also when the lease ended and no successor exists.
        """
        seq = self._live
        # The rollover point is never after the lease end (_set_rollover), so before it the
        # lease is live and one clock read covers both checks.
        if seq is None or self._now_ns() >= self._rollover_ns:
            seq = self._leased()
        if value.__class__ is not bytes or len(value) > self._max_value:
            value = self._value(value)
        if key.__class__ is str:
            key = key.encode()
        if partition is None:
            partition = self._partitioner.pick(topic, key, seq.pid)  # type: ignore[arg-type]
        lanes = seq.ready.get(topic)
        cell = None if lanes is None else lanes.get(partition)
        if cell is None or headers or on_delivery is not None or self._tracking:
            return self._produce(
                seq,
                topic,
                value,
                key,  # type: ignore[arg-type]
                partition,
                headers,
                on_delivery,
                event_id,
            )
        # Sequencer.stamp, inline, for a partition already checked and owing no skip or cert.
        n = cell[0]
        if n < 128:
            pf = seq.fixed[n]
        elif 0xFF < n < 0x10000:
            pf = seq.prefix16 + U16X(n)
        else:
            pf = seq.header(n)
        cell[0] = n + 1
        try:
            self._kafka_produce(
                topic, value, key, partition=partition, headers=[(PF_HEADER_KEY, pf)]
            )
        except BufferError:
            self._send_or_rewind(seq, topic, value, key, partition, pf)  # type: ignore[arg-type]
        except BaseException:
            seq.rewind(topic, partition)
            raise
        return partition

    def produce_many(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None = None,
        partition: int | None = None,
        *,
        event_ids: Sequence[str | None] | None = None,
    ) -> int:
        """Send ``values`` in order to ``topic``; returns how many were handed to Kafka.

        Exactly what ``produce(topic, values[i], keys[i], partition, event_id=event_ids[i])``
        for each ``i`` in order does (seqs, partitions, ``pfc``, skips, the ledger, errors), at
        a lower cost per record. A rollover that falls due in the middle happens before the
        record that triggers it, as in :meth:`produce`; ``on_roll`` is then called with
        :attr:`batch_done` set to that record's index, so the caller stores the successor's
        checkpoint with the upstream position of ``values[batch_done]``. If an error is raised,
        ``values[:batch_done]`` were handled (sent, or skipped as already in Kafka) and
        ``values[batch_done:]`` were not: nothing of them is in flight.

        Args:
            topic: an existing topic.
            values: the record values.
            keys: one key per value (same length), or None for unkeyed records.
            partition: one explicit partition for every record (overrides the keys).
            event_ids: one event id per value (same length) for the send ledger, or None (the
                value digests).

        Raises:
            BatchMismatch: ``keys`` or ``event_ids`` not as long as ``values`` (nothing sent).
            Otherwise what :meth:`produce` raises, for the record ``values[batch_done]``.
        """
        count = len(values)
        for name, column in (("keys", keys), ("event_ids", event_ids)):
            if column is not None and len(column) != count:
                raise BatchMismatch(
                    f"{name} has {len(column)} entries for {count} values; give one per value "
                    "(or None)"
                )
        skipped = self.skipped
        self.batch_done = 0
        if keys is not None or event_ids is not None or self._tracking:
            self._produce_each(topic, values, keys, partition, event_ids)
            return count - (self.skipped - skipped)
        if partition is None:
            self._many_sticky(topic, values)
        else:
            self._many_to(topic, values, partition)
        return count - (self.skipped - skipped)

    def _many_to(self, topic: str, values: Sequence[bytes | str | None], partition: int) -> None:
        """``produce_many`` to one partition: runs of records stamped inline in a tight loop."""
        produce = self.produce
        kafka_produce = self._kafka_produce
        now_ns = self._now_ns
        max_value = self._max_value
        count = len(values)
        i = 0
        try:
            while i < count:
                seq = self._live
                lanes = None if seq is None else seq.ready.get(topic)
                cell = None if lanes is None else lanes.get(partition)
                if seq is not None and cell is not None:
                    # Nothing below changes the sequencer or the lane: only produce() rolls
                    # over (at the deadline) or sends a record the general way.
                    deadline = self._rollover_ns
                    for i in range(i, count):  # noqa: B020 - the run resumes at i
                        value = values[i]
                        if (
                            value.__class__ is not bytes
                            or len(value) > max_value
                            or now_ns() >= deadline
                        ):
                            break
                        n = cell[0]  # Sequencer.stamp, inline (as in produce)
                        if n < 128:
                            pf = seq.fixed[n]
                        elif 0xFF < n < 0x10000:
                            pf = seq.prefix16 + U16X(n)
                        else:
                            pf = seq.header(n)
                        cell[0] = n + 1
                        try:
                            kafka_produce(
                                topic,
                                value,
                                None,
                                partition=partition,
                                headers=[(PF_HEADER_KEY, pf)],
                            )
                        except BufferError:
                            self._send_or_rewind(seq, topic, value, None, partition, pf)
                        except BaseException:
                            seq.rewind(topic, partition)
                            raise
                    else:
                        break
                # values[i] through produce(): a rollover due, the partition's first record
                # under this sequencer, a skip, or a value to convert or refuse.
                self.batch_done = i
                produce(topic, values[i], None, partition)
                i += 1
        except BaseException:
            self.batch_done = i
            raise
        self.batch_done = count

    def _many_sticky(self, topic: str, values: Sequence[bytes | str | None]) -> None:
        """``produce_many`` of unkeyed records: the sticky partition picked per record."""
        produce = self.produce
        kafka_produce = self._kafka_produce
        now_ns = self._now_ns
        max_value = self._max_value
        pick = self._partitioner.pick
        i = 0
        try:
            for i, value in enumerate(values):
                seq = self._live
                if (
                    seq is None
                    or now_ns() >= self._rollover_ns
                    or value.__class__ is not bytes
                    or len(value) > max_value
                ):
                    self.batch_done = i
                    produce(topic, value)
                    continue
                p = pick(topic, None, seq.pid)
                lanes = seq.ready.get(topic)
                cell = None if lanes is None else lanes.get(p)
                if cell is None:
                    produce(topic, value, None, p)
                    continue
                n = cell[0]  # Sequencer.stamp, inline (as in produce)
                if n < 128:
                    pf = seq.fixed[n]
                elif 0xFF < n < 0x10000:
                    pf = seq.prefix16 + U16X(n)
                else:
                    pf = seq.header(n)
                cell[0] = n + 1
                try:
                    kafka_produce(topic, value, None, partition=p, headers=[(PF_HEADER_KEY, pf)])
                except BufferError:
                    self._send_or_rewind(seq, topic, value, None, p, pf)
                except BaseException:
                    seq.rewind(topic, p)
                    raise
        except BaseException:
            self.batch_done = i
            raise
        self.batch_done = len(values)

    def _produce_each(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None,
        partition: int | None,
        event_ids: Sequence[str | None] | None,
    ) -> None:
        produce = self.produce
        for i, value in enumerate(values):
            self.batch_done = i
            produce(
                topic,
                value,
                None if keys is None else keys[i],
                partition,
                event_id=None if event_ids is None else event_ids[i],
            )
        self.batch_done = len(values)

    def _leased(self) -> Sequencer:
        """The sequencer to send with now: rolls over first when due; raises if none may send."""
        if self._clock() >= self._rollover_at:
            self._auto_roll()
        seq = self._live
        if seq is None:
            seq = self._sequencer()  # raises: not leased
        if self._clock() >= seq.expire_ms:
            # Never send under an ended lease (the rollover could not happen in time).
            raise LeaseExpired(
                f"the lease of pid {seq.pid} ended at {seq.expire_ms} before it could be rolled "
                "over; retry (resume from the last checkpoint) once a lease server answers"
            )
        return seq

    def _value(self, value: bytes | str | None) -> bytes | None:
        value_b = value.encode() if isinstance(value, str) else value
        if value_b is not None and len(value_b) > self._max_value:
            raise ValueTooLarge(
                f"value of {len(value_b)} bytes exceeds message_max_bytes={self._max_value}; "
                "split the record or raise the limit (producer and topic max.message.bytes)"
            )
        return value_b

    def _produce(
        self,
        seq: Sequencer,
        topic: str,
        value_b: bytes | None,
        key_b: bytes | None,
        partition: int,
        headers: Headers | None,
        on_delivery: DeliveryCallback | None,
        event_id: str | None,
    ) -> int:
        """``produce`` for the first record of a partition under a sequencer (checks, ``pfc``),
        skips, user headers and callbacks, and tracked records."""
        self._partitioner.check(topic, partition)
        if seq.skip and seq.take_skip(topic, partition):
            # Already in Kafka under the predecessor pid (recovery scan): not sent again.
            self.skipped += 1
            return partition
        if headers:
            for name, _ in headers:
                if name in _RESERVED:
                    raise ReservedHeader(
                        f"the header name {name!r} is reserved for the producer's own headers; "
                        "rename your header"
                    )
        pf = seq.stamp(topic, partition)
        wire_headers: list[tuple[str, Any]] = [(PF_HEADER_KEY, pf)]
        certified = False
        if seq.cert is not None and (topic, partition) not in seq.certified:
            wire_headers.append((CERT_HEADER_KEY, seq.cert))
            seq.certified.add((topic, partition))
            certified = True
        if headers:
            wire_headers.extend(headers)
        delivery = self._delivery
        callback: DeliveryCallback | None = None
        if self._tracking:
            callback = functools.partial(delivery.on_tracked, pf, event_id)
        if on_delivery is not None:
            if not self.config.success_reports:
                self._unstamp(seq, topic, partition, certified)
                raise ProducerConfigError(
                    "on_delivery needs a report per record: use success_reports=True"
                )
            callback = _chain(callback or delivery.on_delivery, on_delivery)
        try:
            if callback is None:
                self._kafka_produce(
                    topic, value_b, key_b, partition=partition, headers=wire_headers
                )
            else:
                self._kafka_produce(
                    topic, value_b, key_b, partition=partition, headers=wire_headers,
                    on_delivery=callback,
                )  # fmt: skip
        except BufferError:
            try:
                self._send(topic, value_b, key_b, partition, wire_headers, callback)
            except BaseException:
                self._unstamp(seq, topic, partition, certified)
                raise
        except BaseException:
            self._unstamp(seq, topic, partition, certified)
            raise
        seq.mark_ready(topic, partition)
        return partition

    def _send_or_rewind(
        self,
        seq: Sequencer,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        pf: bytes,
    ) -> None:
        try:
            self._send(topic, value, key, partition, [(PF_HEADER_KEY, pf)], None)
        except BaseException:
            seq.rewind(topic, partition)
            raise

    @staticmethod
    def _unstamp(seq: Sequencer, topic: str, partition: int, certified: bool) -> None:
        seq.rewind(topic, partition)
        if certified:
            seq.certified.discard((topic, partition))

    def _send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        headers: list[tuple[str, Any]],
        callback: DeliveryCallback | None,
    ) -> None:
        callback = callback or self._delivery.on_delivery
        while True:
            try:
                self._producer.produce(
                    topic, value, key, partition=partition, headers=headers, on_delivery=callback
                )
                return
            except BufferError:
                # librdkafka's queue is full: serve callbacks until it drains, then retry.
                self._producer.poll(0.1)

    def _write_fences(self, timeout_s: float, from_generation: int, topics: list[str]) -> None:
        seq = self._sequencer()
        topics = sorted(set(topics) | {topic for topic, _ in seq.partitions()})
        counts = {topic: self.partition_count(topic) for topic in topics}
        for topic, partition, header in seq.fences(from_generation, counts):
            headers: list[tuple[str, Any]] = [(PF_HEADER_KEY, header)]
            if seq.cert is not None and header == seq.fence_header(topic, partition):
                # Only the current generation has a cert; the walk's lower FENCEs cannot carry one.
                headers.append((CERT_HEADER_KEY, seq.cert))
            on_fence = functools.partial(self._delivery.on_other, header, True, None)
            self._send(topic, b"", None, partition, headers, on_fence)
        left = self.flush(timeout_s)
        if left:
            raise BrokerUnavailable(
                f"{left} FENCE records were not acknowledged within {timeout_s}s; "
                "check that Kafka runs, then resume again"
            )

    def resend_acknowledged(self, n: int) -> int:
        """Fault hook: re-send the last ``n`` acknowledged records of each partition.

        Each copy carries its ORIGINAL ``pf`` header and value, as a producer retry after a lost
        acknowledgement would; the broker rules must drop them as ``DUPLICATE``. Seq counters do
        not move. Returns the number of records re-sent.
        """
        sent = 0
        for (topic, partition), buffer in sorted(self._delivery.kept.items()):
            for key, value, header, event in list(buffer)[-n:] if n > 0 else []:
                on_resend = functools.partial(self._delivery.on_other, header, False, event)
                self._send(topic, value, key, partition, [(PF_HEADER_KEY, header)], on_resend)
                sent += 1
        self.resent += sent
        return sent

    # ---- acknowledgements -----------------------------------------------------------------

    @property
    def acked(self) -> int:
        """Data records acknowledged so far."""
        return self._delivery.acked

    @property
    def fences_acked(self) -> int:
        """FENCE records acknowledged so far."""
        return self._delivery.fences_acked

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        served: int = self._producer.poll(timeout)
        return served

    def flush(self, timeout: float | None = None) -> int:
        """Wait for every record in flight; returns how many are still in flight.

        The send ledger is pushed to the OS too, so a checkpoint saved after this call never
        covers an acknowledgement the ledger could still lose in a crash.

        Raises:
            DeliveryFailed: the first delivery error since the last flush (then cleared).
            LedgerWriteFailed / LedgerRefused: the ledger could not be written.
        """
        left: int = self._producer.flush(-1 if timeout is None else timeout)
        ledger = self._delivery.ledger
        if ledger is not None:
            try:
                ledger.flush()
            except LedgerError as exc:
                if self._delivery.error is None:
                    self._delivery.error = exc
        error = self._delivery.take_error()
        if error is not None:
            raise error
        return left

    def __len__(self) -> int:
        return len(self._producer)

    def checkpoint(self) -> ProducerCheckpoint:
        """The identity and next seqs to store atomically with the caller's upstream position.

        Raises:
            NotFlushed: records are still in flight; ``flush()`` first.
        """
        if len(self._producer) or self._delivery.error is not None:
            raise NotFlushed(
                "records are in flight (or a delivery error is pending): call flush() and "
                "take the checkpoint only when it returns 0 without raising"
            )
        return self._sequencer().checkpoint(self._clock())

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is in flight (errors are raised), close the ledger; idempotent."""
        if self._machine.state is LeaseState.CLOSED:
            return
        try:
            self.flush(timeout)
        finally:
            self._move(LeaseState.CLOSED)
            ledger = self._delivery.ledger
            if ledger is not None:
                if self._owns_ledger:
                    ledger.close()
                else:
                    ledger.flush()

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chain(own: DeliveryCallback, user: DeliveryCallback) -> DeliveryCallback:
    def both(err: Any, msg: Any) -> None:
        own(err, msg)
        user(err, msg)

    return both
