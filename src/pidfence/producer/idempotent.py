"""``IdempotentProducer``: confluent-kafka plus a leased pid, per-partition seqs and ``pf`` headers.

The public API and the one stamping loop. The session (:mod:`~pidfence.producer.session`)
decides; the driver (:mod:`~pidfence.producer.driver`) performs, with the lease server and
the sender (:mod:`~pidfence.producer.sender`, the Kafka I/O).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from threading import local
from typing import Unpack

import confluent_kafka

from pidfence.ledger import Ledger
from pidfence.pid_allocator.clock import wall_clock_ms
from pidfence.producer import forks
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.delivery import DeliveryCallback
from pidfence.producer.driver import Headers, ProducerOptions, SaveCheckpoint, SessionDriver
from pidfence.producer.errors import BatchMismatch
from pidfence.producer.lease import LeaseClientLike, LeaseKeeper
from pidfence.producer.lock import Empty, ProducerLock
from pidfence.producer.recovery import CertVerifier, Scanner
from pidfence.producer.sender import ClientFactory, QueueFull, Sender
from pidfence.producer.sequencer import U16X, Sequencer
from pidfence.producer.session import ProducerSession
from pidfence.producer.state import LeaseState
from pidfence.wire import PF_HEADER_KEY

#: Records ``produce_many`` stamps per hold of the lock (other threads get their turns).
RUN = 256


class IdempotentProducer:
    """An idempotent Kafka producer whose records the ``pidfence`` broker rules deduplicate.

    Construct it to lease a fresh pid, or use :meth:`resume` to continue a checkpoint.

    Thread-safe: threads share one producer (as they share a ``confluent_kafka.Producer``). Each
    record's seq is taken, stamped and handed to librdkafka in one step under the producer's
    lock, so no two records share an identity and each partition's seqs reach librdkafka in log
    order; a rollover, :meth:`bump`, :meth:`checkpoint` and :meth:`close` take the same lock.
    It belongs to the process that created it: after ``fork()`` the child's copy refuses every
    call (``ProducerForked``). docs/producer.md, "Threads, asyncio and forks".

    Args:
        config: the producer settings.
        lease_client: a :class:`pidfence.pid_allocator.LeaseClient`.
        ledger: path or :class:`~pidfence.ledger.Ledger` for the send ledger (None: none).
        clock: epoch milliseconds (injectable: rollover tests, the simulation).
        producer_factory: builds the Kafka client from a librdkafka dict.
        on_roll: stores the successor's checkpoint after a rollover ``produce`` starts itself.

    Raises:
        ProducerConfigError: a setting that breaks exactly-once (e.g. ``acks=1``).
        LeaseServerDown: no lease server answered (or ``ZooKeeperUnavailable``).
    """

    def __init__(
        self,
        config: ProducerConfig,
        lease_client: LeaseClientLike,
        *,
        ledger: str | Path | Ledger | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        producer_factory: ClientFactory = confluent_kafka.Producer,
        on_roll: SaveCheckpoint | None = None,
        _lease_now: bool = True,
    ) -> None:
        self.config = config
        self._clock = clock
        self._session = session = ProducerSession(config)
        self._sender = sender = Sender(config, producer_factory, ledger, session.lease_ends)
        #: Stores the successor's checkpoint after each rollover ``produce`` starts itself.
        self.on_roll = on_roll
        keeper = LeaseKeeper(lease_client, clock)
        self._driver = driver = SessionDriver(
            config, session, keeper, sender, clock, lambda: self.on_roll
        )
        self._partitioner = driver.partitioner
        self._one = driver.one
        self._kafka_produce = sender.client.produce
        # ns on the clock's time base (the wall clock's own builtin when not injected).
        self._now_ns: Callable[[], int] = (
            time.time_ns if clock is wall_clock_ms else (lambda: clock() * 1_000_000)
        )
        self._tracking, self._max_value = sender.tracking, config.message_max_bytes
        # produce's inline stamp takes values up to this size: none when every record is
        # tracked (one test for both on the per-record path).
        self._inline_max = -1 if sender.tracking else config.message_max_bytes
        self._lock = lock = ProducerLock()
        self._take, self._give = lock.take, lock.give
        self._local = local()  # per thread: its produce_many's progress (batch_done)
        self.resent = 0
        #: How :meth:`resume` continued: ``bumped``, ``rolled``, ``followed`` or ``fresh``.
        self.resumed_how = ""
        forks.register(self)
        if _lease_now:
            driver.lease_new()

    @classmethod
    def resume(
        cls,
        checkpoint: ProducerCheckpoint,
        lease_client: LeaseClientLike,
        config: ProducerConfig,
        *,
        fence_timeout_s: float = 60.0,
        stale_probe: int = 8,
        scanner: Scanner | None = None,
        topics: Sequence[str] = (),
        partitions: Sequence[TopicPartition] | None = None,
        scan_verifier: CertVerifier | None = None,
        **options: Unpack[ProducerOptions],
    ) -> IdempotentProducer:
        """Continue ``checkpoint`` through its lineage (DESIGN §9), FENCE, scan, then go on.

        Bumps, rolls or follows the pid (``resumed_how``; docs/producer.md, "Resume through the
        lineage"), FENCEs every partition of the checkpoint's topics and of ``topics``, then the
        recovery scan (``scanner``: default over Kafka; ``scan_verifier``: default from
        ``config.lease_public_keys``) finds what the previous instance got into Kafka after it.
        ``partitions``: the only ones the lineage ever wrote (a copy task's one output
        partition): FENCE and scan those alone instead of every partition of the topics.
        ``stale_probe``: generations tried past the checkpoint's. ``options``: the constructor's
        (``ledger``, ``clock``, ``producer_factory``, ``on_roll``). Store a checkpoint next.

        Raises:
            ProducerFenced: another owner holds the lineage, or the checkpoint is stale.
            LeaseServerDown / DeliveryFailed / BrokerUnavailable / UnknownTopic: retry later.
        """
        self = cls(config, lease_client, **options, _lease_now=False)
        with self._lock.held():  # its FENCEs' reports may call back in, as after a roll
            self.resumed_how = self._driver.resume(
                checkpoint,
                stale_probe=stale_probe,
                topics=topics,
                partitions=partitions,
                fence_timeout_s=fence_timeout_s,
                scanner=scanner,
                scan_verifier=scan_verifier,
            )
        return self

    @property
    def resumed_from_expired(self) -> bool:
        """True when :meth:`resume` continued under another pid than the checkpoint's."""
        return self.resumed_how in ("rolled", "followed", "fresh")

    @property
    def batch_done(self) -> int:
        """Values of this thread's current (or last) :meth:`produce_many` handled so far."""
        return int(getattr(self._local, "done", 0))

    @property
    def state(self) -> LeaseState:
        """The lease state."""
        return self._session.state

    @property
    def rollover_due(self) -> bool:
        """True once the clock passed the rollover point (the next ``produce`` rolls over)."""
        return self._session.rollover_due(self._clock())

    @property
    def rollovers(self) -> int:
        """Rollovers so far."""
        return self._session.rollovers

    @property
    def skipped(self) -> int:
        """Records not sent because the recovery scan found them in Kafka already."""
        return self._session.skipped

    @property
    def sequencer(self) -> Sequencer:
        """The current (or last) sequencer: pid, generation, counters (``ProducerError``: none)."""
        return self._session.sequencer

    def roll(self, save: SaveCheckpoint | None = None) -> ProducerCheckpoint:
        """Roll over to the pid's successor now; returns the successor's checkpoint.

        Drain, ``roll`` through the lease server (compare-and-set on the generation), then
        ``save`` (default ``on_roll``) the successor's checkpoint with the upstream position.

        Raises:
            DrainFailed: the old pid's records were not all acknowledged; nothing was rolled.
            ProducerFenced: another owner bumped or rolled this pid: ``FENCED``, nothing more.
            LeaseServerDown / LeaseExpired: no answer; the old lease is kept while it lasts.
        """
        with self._lock.held():
            return self._driver.roll(save if save is not None else self.on_roll)

    def bump(self) -> ProducerCheckpoint:
        """Move to a new generation of the same pid, FENCEd where it wrote; returns the checkpoint.

        A compare-and-set on the current generation at the lease server: it succeeds only if
        nobody bumped or rolled the pid since this producer's lease, resume, roll or last bump,
        so no record sent since then can have been ``FENCED`` by another owner. A copy group
        member bumps before each commit (docs/producer.md, "Copier groups"). ``flush()`` first.

        Raises:
            NotFlushed: records are in flight.
            ProducerFenced: another owner moved the pid on: records sent since the last bump may
                be ``FENCED``; store nothing, resume from the last stored checkpoint.
            LeaseServerDown: no lease server answered (retriable; nothing changed).
            DeliveryFailed / BrokerUnavailable: a FENCE was not acknowledged (bumped).
        """
        with self._lock.held():  # no record handed over between the idle check and the bump
            return self._driver.bump()

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` (cached metadata; ``UnknownTopic``, ``BrokerUnavailable``)."""
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
            headers: extra headers; the names ``pf``, ``pfc`` and ``pfm`` are reserved.
            on_delivery: ``callback(err, msg)`` called after the producer's own bookkeeping.
            event_id: the upstream event it carries (ledger; default: the value digest).

        Raises:
            ReservedHeader / ValueTooLarge / UnknownTopic / BrokerUnavailable: as named;
            DrainFailed / ProducerFenced / LeaseExpired: from a rollover due now (:meth:`roll`).
        """
        # Locals: CPython 3.11 does not specialise calls of callables kept in attributes.
        session, now_ns, kafka_produce = self._session, self._now_ns, self._kafka_produce
        take, give = self._take, self._give
        while True:
            try:
                # One step under the lock: the seq is taken, stamped and handed to librdkafka
                # before another thread takes the next one, so log order is seq order.
                try:
                    take()
                    mine = True
                except Empty:
                    mine = self._lock.wait()
                try:
                    seq = session.live
                    if (
                        seq is None
                        or headers
                        or on_delivery is not None
                        or type(value) is not bytes
                        or len(value) > self._inline_max
                        or now_ns() >= session.deadline_ns
                    ):
                        return self._lock.marked(
                            self._one, topic, value, key, partition, headers, on_delivery, event_id
                        )
                    if key is not None and type(key) is str:
                        key = key.encode()
                    if partition is None:
                        partition = self._partitioner.pick(topic, key, seq.pid)  # type: ignore[arg-type]
                    try:
                        cell = seq.ready[topic][partition]
                    except KeyError:  # (not ready: the general path, outside the except block)
                        cell = None
                    if cell is None:
                        return self._lock.marked(
                            self._one, topic, value, key, partition, None, None, event_id
                        )
                    # _stamp_loop's body for one record: entering the loop costs +60%.
                    n = cell[0]
                    if n < 256:
                        pf = seq.fixed[n]
                    elif n < 0x10000:
                        pf = seq.prefix16 + U16X(n)
                    else:
                        pf = seq.header(n)
                    cell[0] = n + 1
                    wire = (
                        [(PF_HEADER_KEY, pf)]
                        if seq.mac_hasher is None
                        else seq.with_mac(topic, partition, n, pf, key, value)  # type: ignore[arg-type]
                    )
                    try:
                        kafka_produce(topic, value, key, partition=partition, headers=wire)
                    except BaseException:
                        cell[0] = n  # not handed over: n is the next record's seq
                        raise
                    return partition
                finally:
                    if mine:
                        give(None)
            except QueueFull as full:
                partition = full.partition
            except BufferError:
                pass
            # The queue is full: wait outside the lock (other threads go on), then try again.
            self._sender.wait_for_room()

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
        for each ``i`` in order does, at a lower cost per record (``keys``, ``event_ids``: None
        or one per value). ``on_roll`` sees the index of the record that found a rollover due
        in :attr:`batch_done`; after an error ``values[:batch_done]`` were handled (sent, or
        skipped as already in Kafka), ``values[batch_done:]`` were not.

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
        self._local.done = 0
        self._stamp_loop(topic, values, keys, partition, event_ids)
        return count - (self.skipped - skipped)

    def _stamp_loop(
        self,
        topic: str,
        values: Sequence[bytes | str | None],
        keys: Sequence[bytes | str | None] | None,
        partition: int | None,
        event_ids: Sequence[str | None] | None,
    ) -> None:
        """The stamping loop (:meth:`produce` is its one-record form): records to lanes the
        session made ready (nothing to skip, no extra header until ``deadline_ns``) are stamped
        inline, any other goes the driver's general path, then the loop goes on."""
        session, local = self._session, self._local
        kafka_produce, now_ns, max_value = self._kafka_produce, self._now_ns, self._max_value
        pick, inline = self._partitioner.pick, not self._tracking
        lock = self._lock
        take, give = lock.take, lock.give
        count = len(values)
        fixed_partition = -1 if partition is None else partition
        retry: int | None = None  # where values[i] goes after a full queue
        i = 0
        try:
            while i < count:
                try:
                    try:
                        take()
                        mine = True
                    except Empty:
                        mine = lock.wait()
                    try:
                        picked = partition if retry is None else retry
                        seq = session.live
                        lanes = None if seq is None or not inline else seq.ready.get(topic)
                        # The one partition's lane, or None: the records pick theirs.
                        own = None if lanes is None or partition is None else lanes.get(partition)
                        if (
                            seq is not None
                            and lanes is not None
                            and retry is None
                            and (partition is None or own)
                        ):
                            fixed, prefix16, header = seq.fixed, seq.prefix16, seq.header
                            pid, mac, deadline = seq.pid, seq.mac_hasher, session.deadline_ns
                            end = min(count, i + RUN)
                            for i in range(i, end):  # noqa: B020 - the run resumes at i
                                value = values[i]
                                key = None if keys is None else keys[i]
                                if (
                                    type(value) is not bytes
                                    or len(value) > max_value
                                    or (key is not None and type(key) is not bytes)
                                    or now_ns() >= deadline
                                ):
                                    break
                                if own is None:
                                    q = pick(topic, key, pid)
                                    cell = lanes.get(q)
                                    if cell is None:
                                        picked = q
                                        break
                                else:
                                    q, cell = fixed_partition, own
                                n = cell[0]
                                if n < 256:
                                    pf = fixed[n]
                                elif n < 0x10000:
                                    pf = prefix16 + U16X(n)
                                else:
                                    pf = header(n)
                                cell[0] = n + 1
                                wire = (
                                    [(PF_HEADER_KEY, pf)]
                                    if mac is None
                                    else seq.with_mac(topic, q, n, pf, key, value)
                                )
                                try:
                                    kafka_produce(topic, value, key, partition=q, headers=wire)
                                except BufferError:
                                    cell[0] = n
                                    raise QueueFull(q) from None
                                except BaseException:
                                    cell[0] = n
                                    raise
                            else:
                                i = end
                                continue
                        local.done = i
                        key = None if keys is None else keys[i]
                        event = None if event_ids is None else event_ids[i]
                        retry = None
                        lock.marked(self._one, topic, values[i], key, picked, None, None, event)
                        i += 1
                    finally:
                        if mine:
                            give(None)
                except QueueFull as full:
                    retry = full.partition
                    self._sender.wait_for_room()
        except BaseException:
            local.done = i
            raise
        local.done = count

    def resend_acknowledged(self, n: int) -> int:
        """Fault hook: re-send each partition's last ``n`` acknowledged records as they were."""
        self.resent += (sent := self._sender.resend_acknowledged(n))
        return sent

    @property
    def acked(self) -> int:
        """Data records acknowledged so far."""
        return self._sender.delivery.acked

    @property
    def fences_acked(self) -> int:
        """FENCE records acknowledged so far."""
        return self._sender.delivery.fences_acked

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        return self._sender.poll(timeout)

    def flush(self, timeout: float | None = None) -> int:
        """Wait for what is in flight, push the ledger to the OS; returns how many are left.

        Raises:
            DeliveryFailed / LedgerWriteFailed / LedgerRefused: the first error since the last.
        """
        return self._sender.flush(timeout)

    def __len__(self) -> int:
        return len(self._sender)  # records in flight

    def checkpoint(self) -> ProducerCheckpoint:
        """The identity and next seqs to store atomically with the caller's upstream position
        (``NotFlushed`` while records are in flight: ``flush()`` first)."""
        with self._lock.held():
            self._sender.require_idle()
            return self._session.checkpoint(self._clock())

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is in flight (errors are raised), close the ledger; idempotent. Other
        threads' ``produce`` waits for it, then raises ``ProducerError`` (``CLOSED``)."""
        with self._lock.held():
            if self._session.state is LeaseState.CLOSED:
                return
            try:
                self.flush(timeout)
            finally:
                self._session.close()
                self._sender.close_ledger()

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
