"""``IdempotentProducer``: confluent-kafka plus a leased pid, per-partition seqs and ``pf`` headers.

The public API and the one stamping loop. The session (:mod:`~pidfence.producer.session`)
decides; the driver (:mod:`~pidfence.producer.driver`) performs, with the lease server and
the sender (:mod:`~pidfence.producer.sender`, the Kafka I/O).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from threading import local
from typing import TypeVar, Unpack

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
from pidfence.producer.sender import ClientFactory, QueueFull, Sender, refused
from pidfence.producer.sequencer import U16X, Sequencer
from pidfence.producer.session import ProducerSession
from pidfence.producer.stamping import StampLoop
from pidfence.producer.state import LeaseState
from pidfence.wire import PF_HEADER_KEY

T = TypeVar("T")


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
        now_ns: Callable[[], int] = (
            time.time_ns if clock is wall_clock_ms else (lambda: clock() * 1_000_000)
        )
        self._now_ns = now_ns
        # produce's inline stamp takes key + value up to this size: none when every record is
        # tracked (one test for both on the per-record path).
        self._inline_max = -1 if sender.tracking else config.message_max_bytes
        self._lock = lock = ProducerLock()
        self._take, self._give = lock.take, lock.give
        self._local = local()  # per thread: its produce_many's progress (batch_done)
        self._stamper = StampLoop(
            session,
            lock,
            self._local,
            sender,
            driver.partitioner.pick,
            driver.one,
            now_ns,
            config.message_max_bytes,
        )
        self.resent = 0
        #: How :meth:`resume` continued: ``bumped``, ``rolled``, ``followed`` or ``fresh``.
        self.resumed_how = ""
        forks.register(self)
        if _lease_now:
            self._opening(driver.lease_new)

    def _opening(self, open_: Callable[[], T]) -> T:
        """``open_()`` (the lease, or the resume); if it raises, the Kafka client is closed at
        once: the producer is never returned, and its client's threads would otherwise live on
        until the cyclic garbage collector found it."""
        try:
            return open_()
        except BaseException:
            self._sender.discard()
            raise

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
            resume = functools.partial(
                self._driver.resume,
                checkpoint,
                stale_probe=stale_probe,
                topics=topics,
                partitions=partitions,
                fence_timeout_s=fence_timeout_s,
                scanner=scanner,
                scan_verifier=scan_verifier,
            )
            self.resumed_how = self._opening(resume)
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
        sticky = partition is None and key is None  # a partition set below is its sticky pick
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
                            self._one,
                            topic,
                            value,
                            key,
                            partition,
                            headers,
                            on_delivery,
                            event_id,
                            sticky,
                        )
                    if key is not None:
                        if type(key) is str:
                            key = key.encode()
                        if len(key) + len(value) > self._inline_max:
                            return self._lock.marked(
                                self._one, topic, value, key, partition, None, None, event_id
                            )
                    if partition is None:
                        partition = self._partitioner.pick(topic, key, seq.pid)  # type: ignore[arg-type]
                    try:
                        cell = seq.ready[topic][partition]
                    except KeyError:  # (not ready: the general path, outside the except block)
                        cell = None
                    if cell is None:
                        return self._lock.marked(
                            self._one, topic, value, key, partition, None, None, event_id, sticky
                        )
                    # StampLoop.run's body for one record: entering the loop costs +60%.
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
                    except confluent_kafka.KafkaException as exc:
                        cell[0] = n  # not handed over: n is the next record's seq
                        raise refused(exc, topic, partition) from exc
                    except BaseException:
                        cell[0] = n
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
        self._stamper.run(topic, values, keys, partition, event_ids)
        return count - (self.skipped - skipped)

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

    def checkpoint(self, *, confirm: bool = True) -> ProducerCheckpoint:
        """The identity and next seqs to store atomically with the caller's upstream position.

        Take it when ``flush()`` returned 0. It first asks the lease authority whether another
        instance resumed this producer's checkpoint and moved the pid on (``describe``): a
        replaced instance (a zombie) must not overwrite its replacement's stored position with
        one the sink ``FENCED``. ``confirm=False`` skips that question, only for a caller that
        proves ownership itself right after (a copy task bumps before it commits).

        Raises:
            NotFlushed: records are in flight, or a delivery error was not raised yet.
            DeliveryFailed: a record failed delivery earlier: resume from the last checkpoint.
            ProducerFenced: this instance was replaced: stop, store nothing (``FENCED``).
            LeaseServerDown: no lease server answered: store nothing now, try again later
                (not storing is safe: a resume re-sends, and the rules drop the duplicates).
        """
        with self._lock.held():
            return self._driver.checkpoint(confirm)

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
