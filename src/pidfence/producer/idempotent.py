"""``IdempotentProducer``: confluent-kafka plus a leased pid, per-partition seqs and ``pf`` headers.

The producer picks each record's partition itself (so it knows which counter to advance), stamps
the ``pf`` header from its :class:`~pidfence.producer.sequencer.Sequencer`, and hands the record to
``confluent_kafka.Producer``. Delivery callbacks store the first error (raised by :meth:`flush`),
write the send ledger and keep the last acknowledged records for :meth:`resend_acknowledged`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import confluent_kafka

from pidfence.pid_allocator.errors import (
    LeaseServerUnreachable,
    LeaseServiceUnavailable,
    StaleGeneration,
    UnknownPid,
)
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.errors import (
    BrokerUnavailable,
    DeliveryFailed,
    LeaseExpired,
    LeaseServerDown,
    NotFlushed,
    ProducerConfigError,
    ProducerError,
    ProducerFenced,
    ReservedHeader,
    UnknownTopic,
    ValueTooLarge,
)
from pidfence.producer.murmur2 import key_partition
from pidfence.producer.sequencer import Sequencer
from pidfence.producer.state import LeaseState, LeaseStateMachine
from pidfence.verify.ledger import LedgerEntry, LedgerWriter, value_digest
from pidfence.wire import PF_HEADER_KEY, decode_pf

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[Any, Any], None]
Headers = Sequence[tuple[str, bytes | str | None]]


class LeaseClientLike(Protocol):
    """What the producer needs from :class:`pidfence.pid_allocator.LeaseClient`."""

    def lease(self, partitions: Sequence[tuple[str, int]] = ()) -> Any:
        """Lease a new pid (returns pid, generation, sequence, expire_ms)."""

    def bump(self, pid: int, generation: int) -> Any:
        """Bump ``pid`` from ``generation`` (returns pid, generation, expire_ms)."""


def wall_clock_ms() -> int:
    """Epoch milliseconds (the lease server's time base)."""
    return time.time_ns() // 1_000_000


class IdempotentProducer:
    """An idempotent Kafka producer whose records the ``pidfence`` broker rules deduplicate.

    Construct it to lease a fresh pid, or use :meth:`resume` to continue a checkpoint.

    Args:
        config: the producer settings.
        lease_client: a :class:`pidfence.pid_allocator.LeaseClient` (or a fake in tests).
        ledger: path or :class:`LedgerWriter` for the send ledger (None: no ledger).
        clock: epoch milliseconds, injectable so rollover tests run in ms.
        producer_factory: builds the Kafka client from a librdkafka dict (a fake in unit tests).

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
        _lease_now: bool = True,
    ) -> None:
        self.config = config
        self._lease_client = lease_client
        self._clock = clock
        conf = config.to_librdkafka()
        conf.setdefault("allow.auto.create.topics", False)
        conf.setdefault("logger", logging.getLogger("pidfence.producer.librdkafka"))
        # The default delivery callback: a record needs its own only when it is tracked or the
        # caller passed one (a per-record callback costs a Python object per record).
        conf["on_delivery"] = self._on_delivery
        self._producer = producer_factory(conf)
        self._kafka_produce = self._producer.produce
        self._owns_ledger = ledger is not None and not isinstance(ledger, LedgerWriter)
        self._ledger: LedgerWriter | None = (
            LedgerWriter(ledger) if isinstance(ledger, str | Path) else ledger
        )
        self._machine = LeaseStateMachine()
        # The sequencer while LEASED, else None: produce() checks one attribute, not the state.
        self._live: Sequencer | None = None
        self._partition_counts: dict[str, int] = {}
        self._sticky: dict[str, list[int]] = {}  # topic -> [partition, records left]
        self._acked_buffer: dict[TopicPartition, deque[tuple[Any, Any, bytes]]] = {}
        self._expire_by_pid: dict[int, int] = {}
        self._error: ProducerError | None = None
        self._seq: Sequencer | None = None
        self._rollover_at = 0
        self._rollover_ns = 0
        # With the default clock, produce() compares time.time_ns() directly (no Python call).
        self._wall_clock = clock is wall_clock_ms
        self.acked = 0
        self.fences_acked = 0
        self.resent = 0
        self.rollovers = 0
        self.resumed_from_expired = False
        self._max_value = config.message_max_bytes
        self._keep = config.resend_buffer
        self._track = self._ledger is not None or self._keep > 0
        if self._ledger is not None and not config.success_reports:
            raise ProducerConfigError(
                "the send ledger is written from success reports: use success_reports=True "
                "(the default) with a ledger"
            )
        if _lease_now:
            self._install(self._lease_new(), from_state=LeaseState.UNLEASED)

    # ---- lease handling -------------------------------------------------------------------

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
        fence_timeout_s: float = 60.0,
        stale_probe: int = 8,
    ) -> IdempotentProducer:
        """Continue ``checkpoint``: bump its generation, FENCE every partition, go on from its seqs.

        The FENCE records (empty value, seq = the partition's next seq) are flushed before this
        returns, so a zombie still holding the old generation is fenced on every partition at
        once. A checkpoint whose lease expired (or that the server no longer knows) continues
        under a fresh pid with seqs from 0; ``resumed_from_expired`` is then True.

        ``stale_probe``: a process killed between its bump and saving the next checkpoint leaves
        the server one generation ahead of the stored one; the bump is retried from the next
        ``stale_probe`` generations (the first that is the latest wins, fencing every older one).

        Raises:
            ProducerFenced: no probed generation is the latest (another owner keeps bumping).
            LeaseServerDown: no lease server answered.
            DeliveryFailed / BrokerUnavailable / UnknownTopic: the FENCE records could not be sent.
        """
        self = cls(
            config,
            lease_client,
            ledger=ledger,
            clock=clock,
            producer_factory=producer_factory,
            _lease_now=False,
        )
        lease = None
        if checkpoint.expire_ms > clock():
            lease = self._bump(checkpoint, stale_probe)
        if lease is None:
            log.warning(
                "checkpoint of pid %d expired at %d (or is unknown to the lease server): "
                "continuing under a new pid with seqs from 0; records re-sent after the "
                "checkpoint cannot be deduplicated against the old pid",
                checkpoint.pid,
                checkpoint.expire_ms,
            )
            self.resumed_from_expired = True
            self._install(self._lease_new(), from_state=LeaseState.UNLEASED)
            return self
        lifetime = checkpoint.lifetime_ms or config.default_lifetime_ms
        sequencer = Sequencer.resumed(checkpoint, lease.generation, lease.expire_ms)
        sequencer.lifetime_ms = lifetime
        self._install(sequencer, from_state=LeaseState.UNLEASED)
        self._write_fences(fence_timeout_s, from_generation=checkpoint.generation + 1)
        log.info(
            "resumed pid %d at generation %d on %d partitions",
            sequencer.pid,
            sequencer.generation,
            len(sequencer.partitions()),
        )
        return self

    def _bump(self, checkpoint: ProducerCheckpoint, stale_probe: int) -> Any:
        last: StaleGeneration | None = None
        for step in range(stale_probe + 1):
            generation = checkpoint.generation + step
            try:
                return self._lease_call(
                    functools.partial(self._lease_client.bump, checkpoint.pid, generation)
                )
            except UnknownPid:
                return None
            except StaleGeneration as exc:
                last = exc
        self._move(LeaseState.FENCED)
        raise ProducerFenced(
            f"pid {checkpoint.pid}: none of generations {checkpoint.generation}.."
            f"{checkpoint.generation + stale_probe} is the latest, so another producer owns this "
            f"checkpoint; stop this instance (or resume from the newer checkpoint)"
        ) from last

    def _lease_call(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (LeaseServerUnreachable, LeaseServiceUnavailable) as exc:
            raise LeaseServerDown(
                f"no lease server could lease or bump a pid ({exc}); start a lease server "
                "(`pidfence lease-server`) or fix --lease-server, then retry"
            ) from exc

    def _lease_new(self) -> Sequencer:
        lease = self._lease_call(lambda: self._lease_client.lease(()))
        lifetime = max(lease.expire_ms - self._clock(), 1)
        return Sequencer(lease.pid, lease.generation, lease.expire_ms, lifetime_ms=lifetime)

    def _install(self, sequencer: Sequencer, from_state: LeaseState) -> None:
        del from_state
        self._seq = sequencer
        self._expire_by_pid[sequencer.pid] = sequencer.expire_ms
        lifetime = sequencer.lifetime_ms or self.config.default_lifetime_ms
        margin = round(lifetime * (1 - self.config.rollover_fraction))
        self._set_rollover(sequencer.expire_ms - margin)
        self._move(LeaseState.LEASED)

    def _move(self, to: LeaseState) -> None:
        self._machine.move(to)
        self._live = self._seq if to is LeaseState.LEASED else None

    def _set_rollover(self, at_ms: int) -> None:
        self._rollover_at = at_ms
        self._rollover_ns = at_ms * 1_000_000

    @property
    def rollover_due(self) -> bool:
        """True once the clock passed the rollover point (the next ``produce`` rolls over).

        A caller that checkpoints can ``flush()``, :meth:`roll` and save a checkpoint first, so
        no record under the new pid is ever sent before a checkpoint names the new pid.
        """
        return self._clock() >= self._rollover_at

    def roll(self) -> None:
        """Lease the next pid now (seqs from 0); in-flight records under the old pid finish.

        Raises:
            LeaseExpired: the old lease ended and no new pid could be leased.
        """
        self._roll()

    def _roll(self) -> Sequencer:
        """Lease the next pid before this one expires; in-flight records finish normally."""
        current = self._sequencer()
        self._move(LeaseState.ROLLING)
        try:
            fresh = self._lease_new()
        except LeaseServerDown as exc:
            self._move(LeaseState.LEASED)
            now = self._clock()
            if now >= current.expire_ms:
                raise LeaseExpired(
                    f"the lease of pid {current.pid} ended at {current.expire_ms} and no new pid "
                    f"could be leased ({exc}); retry once a lease server answers"
                ) from exc
            # Try again a little later, still inside the old lease.
            self._set_rollover(now + max((current.expire_ms - now) // 4, 1))
            log.warning("rollover of pid %d failed (%s); retrying later", current.pid, exc)
            return current
        self._install(fresh, from_state=LeaseState.ROLLING)
        self.rollovers += 1
        log.info("rolled pid %d over to pid %d", current.pid, fresh.pid)
        return fresh

    def _sequencer(self) -> Sequencer:
        state = self._machine.state
        if state is not LeaseState.LEASED or self._seq is None:
            raise ProducerError(f"the producer is {state}: it cannot send")
        return self._seq

    # ---- sending --------------------------------------------------------------------------

    @property
    def state(self) -> LeaseState:
        """The lease state."""
        return self._machine.state

    @property
    def sequencer(self) -> Sequencer:
        """The current (or, once closed, the last) sequencer: pid, generation, counters.

        Raises:
            ProducerError: no pid was ever leased.
        """
        if self._seq is None:
            raise ProducerError(f"the producer is {self._machine.state}: it holds no pid")
        return self._seq

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` from cached metadata (fetched on first use).

        Raises:
            UnknownTopic: the topic does not exist.
            BrokerUnavailable: no broker answered within ``metadata_timeout_s``.
        """
        count = self._partition_counts.get(topic)
        if count is not None:
            return count
        try:
            meta = self._producer.list_topics(topic, timeout=self.config.metadata_timeout_s)
        except confluent_kafka.KafkaException as exc:
            raise BrokerUnavailable(
                f"no Kafka broker at {self.config.bootstrap_servers} answered a metadata request "
                f"({exc}); check --bootstrap and that Kafka runs, then retry"
            ) from exc
        info = meta.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise UnknownTopic(topic)
        self._partition_counts[topic] = count = len(info.partitions)
        return count

    def _pick(self, topic: str, key: bytes | None) -> int:
        count = self.partition_count(topic)
        if key is not None:
            return key_partition(key, count)
        sticky = self._sticky.get(topic)
        if sticky is None:
            # Start at pid % count so many producers of one topic do not all begin on partition 0.
            start = self._seq.pid % count if self._seq is not None else 0
            sticky = self._sticky[topic] = [start, self.config.sticky_records]
        elif sticky[1] <= 0:
            sticky[0] = (sticky[0] + 1) % count
            sticky[1] = self.config.sticky_records
        sticky[1] -= 1
        return sticky[0]

    def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> int:
        """Send one record; returns the partition it goes to.

        Args:
            topic: an existing topic.
            value: the record value.
            key: keyed records go to Kafka's default murmur2 partition.
            partition: an explicit partition (overrides the key).
            headers: extra headers; the name ``pf`` is reserved.
            on_delivery: ``callback(err, msg)`` called after the producer's own bookkeeping.

        Raises:
            ReservedHeader: a header named ``pf``.
            ValueTooLarge: value larger than ``message_max_bytes``.
            UnknownTopic / BrokerUnavailable: from the first metadata lookup of ``topic``.
            LeaseExpired: the lease ended and no new pid could be leased.
        """
        if (
            time.time_ns() >= self._rollover_ns
            if self._wall_clock
            else self._clock() >= self._rollover_at
        ):
            self._roll()
        seq = self._live
        if seq is None:
            seq = self._sequencer()  # raises: not leased
        value_b = value.encode() if isinstance(value, str) else value
        if value_b is not None and len(value_b) > self._max_value:
            raise ValueTooLarge(
                f"value of {len(value_b)} bytes exceeds message_max_bytes={self._max_value}; "
                "split the record or raise the limit (producer and topic max.message.bytes)"
            )
        key_b = key.encode() if isinstance(key, str) else key
        if partition is None:
            partition = self._pick(topic, key_b)
        else:
            count = self._partition_counts.get(topic)
            if count is None:
                count = self.partition_count(topic)
            if not 0 <= partition < count:
                raise ValueError(
                    f"partition {partition} does not exist in {topic!r} ({count} partitions)"
                )
        pf = seq.stamp(topic, partition)
        wire_headers: list[tuple[str, Any]] = [(PF_HEADER_KEY, pf)]
        if headers:
            for name, data in headers:
                if name == PF_HEADER_KEY:
                    seq.rewind(topic, partition)
                    raise ReservedHeader(
                        "the header name 'pf' is reserved for the producer's own header; "
                        "rename your header"
                    )
                wire_headers.append((name, data))
        callback: DeliveryCallback | None = None
        if self._track:
            # Delivery reports carry no headers, so a tracked record's callback is bound to its pf.
            callback = functools.partial(self._on_tracked, pf)
        if on_delivery is not None:
            if not self.config.success_reports:
                seq.rewind(topic, partition)
                raise ProducerConfigError(
                    "on_delivery needs a report per record: use success_reports=True"
                )
            callback = self._chain(callback or self._on_delivery, on_delivery)
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
            callback = callback or self._on_delivery
            self._send(topic, value_b, key_b, partition, wire_headers, callback, seq)
        except BaseException:
            seq.rewind(topic, partition)
            raise
        return partition

    def _send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        headers: list[tuple[str, Any]],
        callback: DeliveryCallback,
        seq: Sequencer | None,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, value, key, partition=partition, headers=headers, on_delivery=callback
                )
                return
            except BufferError:
                # librdkafka's queue is full: serve callbacks until it drains, then retry.
                self._producer.poll(0.1)
            except Exception:
                if seq is not None:
                    seq.rewind(topic, partition)
                raise

    @staticmethod
    def _chain(own: DeliveryCallback, user: DeliveryCallback) -> DeliveryCallback:
        def both(err: Any, msg: Any) -> None:
            own(err, msg)
            user(err, msg)

        return both

    def _fail(self, err: Any, msg: Any) -> None:
        if self._error is None:
            self._error = DeliveryFailed(
                f"Kafka did not acknowledge a record to {msg.topic()}[{msg.partition()}]: {err}; "
                "resume from the last checkpoint (records after it are re-sent and deduplicated)",
                code=str(err.name()) if hasattr(err, "name") else str(err),
            )

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._fail(err, msg)
            return
        self.acked += 1

    def _on_tracked(self, header: bytes, err: Any, msg: Any) -> None:
        if err is not None:
            self._fail(err, msg)
            return
        self.acked += 1
        if self._keep:
            tp = (msg.topic(), msg.partition())
            buffer = self._acked_buffer.get(tp)
            if buffer is None:
                buffer = self._acked_buffer[tp] = deque(maxlen=self._keep)
            buffer.append((msg.key(), msg.value(), header))
        if self._ledger is not None:
            self._write_ledger(msg, header, fence=False)

    def _on_other_delivery(self, header: bytes, fence: bool, err: Any, msg: Any) -> None:
        if err is not None:
            self._fail(err, msg)
            return
        if fence:
            self.fences_acked += 1
        if self._ledger is not None:
            self._write_ledger(msg, header, fence=fence)

    def _write_ledger(self, msg: Any, header: bytes, fence: bool) -> None:
        if self._ledger is None:
            return
        pf = decode_pf(header)
        self._ledger.write(
            LedgerEntry(
                pid=pf.pid,
                generation=pf.generation,
                topic=msg.topic(),
                partition=msg.partition(),
                seq=pf.seq,
                digest=value_digest(msg.value()),
                offset=msg.offset(),
                ts_ms=msg.timestamp()[1],
                fence=fence,
                expire_ms=self._expire_by_pid.get(pf.pid, 0),
            )
        )

    def _write_fences(self, timeout_s: float, from_generation: int) -> None:
        seq = self._sequencer()
        topics = sorted({topic for topic, _ in seq.partitions()})
        counts = {topic: self.partition_count(topic) for topic in topics}
        for topic, partition, header in seq.fences(from_generation, counts):
            on_fence = functools.partial(self._on_other_delivery, header, True)
            self._send(topic, b"", None, partition, [(PF_HEADER_KEY, header)], on_fence, None)
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
        for (topic, partition), buffer in sorted(self._acked_buffer.items()):
            for key, value, header in list(buffer)[-n:] if n > 0 else []:
                on_resend = functools.partial(self._on_other_delivery, header, False)
                self._send(topic, value, key, partition, [(PF_HEADER_KEY, header)], on_resend, None)
                sent += 1
        self.resent += sent
        return sent

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
        """
        left: int = self._producer.flush(-1 if timeout is None else timeout)
        if self._ledger is not None:
            self._ledger.flush()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return left

    def __len__(self) -> int:
        return len(self._producer)

    def checkpoint(self) -> ProducerCheckpoint:
        """The identity and next seqs to store atomically with the caller's upstream position.

        Raises:
            NotFlushed: records are still in flight; ``flush()`` first.
        """
        if len(self._producer) or self._error is not None:
            raise NotFlushed(
                "records are in flight (or a delivery error is pending): call flush() and "
                "take the checkpoint only when it returns 0 without raising"
            )
        return self._sequencer().checkpoint()

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is in flight (errors are raised), close the ledger; idempotent."""
        if self._machine.state is LeaseState.CLOSED:
            return
        try:
            self.flush(timeout)
        finally:
            self._move(LeaseState.CLOSED)
            if self._ledger is not None:
                if self._owns_ledger:
                    self._ledger.close()
                else:
                    self._ledger.flush()

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
