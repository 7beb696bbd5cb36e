"""``Sender``: the producer's Kafka I/O, the confluent-kafka client and its delivery reports.

It decides nothing about pids, seqs or headers (:mod:`~pidfence.producer.session` does): it
hands records to the client with the right delivery callback, waits out a full queue, flushes
(raising the first delivery error, never losing one inside librdkafka's callback), writes the
FENCE records a resume planned and re-sends acknowledged copies for the fault hook.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import confluent_kafka

from pidfence.ledger import Ledger, LedgerError, LedgerWriter
from pidfence.producer.blocking import may_block
from pidfence.producer.client_log import librdkafka_logger
from pidfence.producer.config import ProducerConfig
from pidfence.producer.delivery import DeliveryCallback, DeliveryTracker, Skipped
from pidfence.producer.errors import (
    BrokerUnavailable,
    KafkaClientFailed,
    KafkaRefused,
    NotFlushed,
    ProducerConfigError,
    ProducerError,
    UnknownPartition,
    UnknownTopic,
    ValueTooLarge,
)
from pidfence.producer.headers import Fence
from pidfence.wire import PF_HEADER_KEY

log = logging.getLogger(__name__)

#: How confluent-kafka's ``flush()`` and ``poll()`` fail, on Python < 3.12, when SIGINT's
#: default handler interrupts a delivery callback: that handler sets KeyboardInterrupt without an
#: instance, and the client keeps only the instance, so the interrupt is lost.
_LOST_INTERRUPT = "returned NULL without setting an exception"

#: Builds the Kafka client from a librdkafka dict (``confluent_kafka.Producer``, or a stand-in
#: with its interface: the simulation's, a unit test's).
ClientFactory = Callable[[dict[str, Any]], Any]


def client_failed(exc: confluent_kafka.KafkaException, what: str) -> KafkaRefused:
    """The producer's error for librdkafka's exception ``exc`` raised while ``what``: retriable
    (:class:`KafkaClientFailed`) when the client failed for good, a new one continues."""
    err = exc.args[0] if exc.args else None
    code = str(err.name()) if isinstance(err, confluent_kafka.KafkaError) else str(exc)
    fatal = isinstance(err, confluent_kafka.KafkaError) and (err.fatal() or code == "_FATAL")
    if fatal:
        return KafkaClientFailed(
            f"Kafka's client failed for good while {what} ({err}): this producer cannot go on; "
            "resume from the last checkpoint (a new producer has a new client)",
            code,
        )
    return KafkaRefused(f"Kafka's client refused {what} ({exc})", code)


def refused(exc: confluent_kafka.KafkaException, topic: str, partition: int) -> ProducerError:
    """The producer's error for librdkafka refusing a record to ``topic[partition]``."""
    err = exc.args[0] if exc.args else None
    code = str(err.name()) if isinstance(err, confluent_kafka.KafkaError) else ""
    if code == "MSG_SIZE_TOO_LARGE":
        return ValueTooLarge(
            f"the record to {topic}[{partition}] is larger than Kafka's client takes ({err}): "
            "keep key + value + headers within message_max_bytes; split the record or raise the "
            "limit (producer and topic max.message.bytes)"
        )
    if code == "_UNKNOWN_TOPIC":
        return UnknownTopic(topic)
    if code == "_UNKNOWN_PARTITION":
        return UnknownPartition(f"partition {partition} of {topic!r} does not exist ({err})")
    return client_failed(exc, f"a record to {topic}[{partition}]")


class QueueFull(BufferError):
    """librdkafka's queue was full: the record was not handed over and its seq was given back.

    ``partition`` is where it was going: the retry sends it there (an unkeyed record is not
    picked twice, so a replay after a resume puts every record where the first run did).
    """

    def __init__(self, partition: int) -> None:
        super().__init__(f"librdkafka's queue is full (partition {partition})")
        self.partition = partition


class Sender:
    """The confluent-kafka client of one producer, with delivery tracking.

    Every ``confluent_kafka.KafkaException`` of the client becomes one of the producer's errors
    (:func:`refused`, :func:`client_failed`), so callers meet only ``PidfenceError``.

    Args:
        config: the producer settings (librdkafka settings, success reports, resend buffer).
        factory: builds the client from a librdkafka dict.
        ledger: the send ledger (a path is opened, and closed by :meth:`close_ledger`), or None.
        lease_ends: pid -> lease end (kept by the session), for the ledger's ``expire_ms``.

    Raises:
        ProducerConfigError: a ledger without success reports.
    """

    def __init__(
        self,
        config: ProducerConfig,
        factory: ClientFactory,
        ledger: str | Path | Ledger | None,
        lease_ends: Mapping[int, int],
    ) -> None:
        if ledger is not None and not config.success_reports:
            raise ProducerConfigError(
                "the send ledger is written from success reports: use success_reports=True "
                "(the default) with a ledger"
            )
        self._owns_ledger = isinstance(ledger, str | Path)
        writer = LedgerWriter(ledger) if isinstance(ledger, str | Path) else ledger
        self.delivery = DeliveryTracker(writer, config.resend_buffer, lease_ends)
        self._success_reports = config.success_reports
        conf = config.to_librdkafka()
        conf.setdefault("allow.auto.create.topics", False)
        conf.setdefault("logger", librdkafka_logger())
        self._counted = conf["on_delivery"] = self.delivery.counter()
        self.client = factory(conf)
        #: True when each record needs its own callback (ledger or resend buffer).
        self.tracking = self.delivery.tracking
        #: Reports of records a resume skipped, served by the next ``poll`` or ``flush``.
        self._skipped: deque[tuple[DeliveryCallback, Skipped]] = deque()

    def callback(
        self, pf: bytes, event_id: str | None, on_delivery: DeliveryCallback | None
    ) -> DeliveryCallback | None:
        """The delivery callback of a data record (None: the client's default).

        Raises:
            ProducerConfigError: ``on_delivery`` without success reports.
        """
        delivery = self.delivery
        callback: DeliveryCallback | None = None
        if self.tracking:
            callback = functools.partial(delivery.on_tracked, pf, event_id)
        if on_delivery is not None:
            self._reports_on()
            callback = _chain(callback or self._counted, on_delivery)
        return callback

    def _reports_on(self) -> None:
        if not self._success_reports:
            raise ProducerConfigError(
                "on_delivery needs a report per record: use success_reports=True"
            )

    def report_skipped(self, on_delivery: DeliveryCallback, record: Skipped) -> None:
        """Report ``record``, which a resume skipped (already in Kafka), to ``on_delivery`` as
        delivered, from the next ``poll`` or ``flush`` (as librdkafka serves its reports).

        Raises:
            ProducerConfigError: ``on_delivery`` without success reports.
        """
        self._reports_on()
        self._skipped.append((on_delivery, record))

    def _serve_skipped(self) -> int:
        served = 0
        while self._skipped:
            try:
                on_delivery, record = self._skipped.popleft()
            except IndexError:  # another thread served the last one
                break
            on_delivery(None, record)
            served += 1
        return served

    def hand_over(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int,
        headers: list[tuple[str, Any]],
        callback: DeliveryCallback | None = None,
        wait: bool = False,
    ) -> None:
        """Hand one record to the client (``BufferError``: its queue is full, nothing queued).

        ``wait``: wait out a full queue instead (FENCE records and resends: no seq is taken for
        them, so nothing is held while it waits)."""
        extra = {} if callback is None else {"on_delivery": callback}
        while True:
            try:
                self.client.produce(
                    topic, value, key, partition=partition, headers=headers, **extra
                )
                return
            except BufferError:
                if not wait:
                    raise
                self.wait_for_room()
            except confluent_kafka.KafkaException as exc:
                raise refused(exc, topic, partition) from exc

    def wait_for_room(self) -> None:
        """librdkafka's queue is full: serve delivery reports until some leave it (0.1 s at
        most; ``WouldBlock`` on a thread that must not wait)."""
        may_block()
        self.poll(0.1)

    def send_fences(self, fences: Iterable[Fence], timeout_s: float) -> None:
        """Write the FENCE records (empty values) and wait until Kafka acknowledged them all.

        Raises:
            BrokerUnavailable: some were not acknowledged within ``timeout_s``.
            DeliveryFailed: Kafka refused one.
        """
        for fence in fences:
            headers: list[tuple[str, Any]] = [(PF_HEADER_KEY, fence.header), *fence.extras]
            on_fence = functools.partial(self.delivery.on_other, fence.header, True, None)
            self.hand_over(fence.topic, b"", None, fence.partition, headers, on_fence, wait=True)
        left = self.flush(timeout_s)
        if left:
            raise BrokerUnavailable(
                f"{left} FENCE records were not acknowledged within {timeout_s}s; "
                "check that Kafka runs, then resume again"
            )

    def resend_acknowledged(self, n: int) -> int:
        """Re-send the last ``n`` acknowledged records of each partition with their original
        ``pf`` headers and values (a retry after a lost acknowledgement); returns how many."""
        sent = 0
        for (topic, partition), buffer in sorted(self.delivery.kept.items()):
            for key, value, header, event in list(buffer)[-n:] if n > 0 else []:
                on_resend = functools.partial(self.delivery.on_other, header, False, event)
                self.hand_over(
                    topic, value, key, partition, [(PF_HEADER_KEY, header)], on_resend, wait=True
                )
                sent += 1
        return sent

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        served = self._serve_skipped() if self._skipped else 0
        try:
            polled: int = self.client.poll(timeout)
        except confluent_kafka.KafkaException as exc:
            raise client_failed(exc, "serving delivery reports") from exc
        except SystemError as exc:
            raise _interrupt_lost_in(exc) from exc
        return served + polled

    def flush(self, timeout: float | None = None) -> int:
        """Wait for every record in flight, push the ledger to the OS; returns how many are
        still in flight.

        Raises:
            DeliveryFailed: the first delivery error since the last flush (then cleared).
            LedgerWriteFailed / LedgerRefused: the ledger could not be written.
        """
        if self._skipped:
            self._serve_skipped()
        try:
            left: int = self.client.flush(-1 if timeout is None else timeout)
        except confluent_kafka.KafkaException as exc:
            raise client_failed(exc, "flushing") from exc
        except SystemError as exc:
            raise _interrupt_lost_in(exc) from exc
        delivery = self.delivery
        if delivery.ledger is not None:
            try:
                delivery.ledger.flush()
            except LedgerError as exc:
                delivery.keep_error(exc)
        error = delivery.take_error()
        if error is not None:
            raise error
        return left

    def require_idle(self) -> None:
        """Raise ``NotFlushed`` unless nothing is in flight and no delivery error is pending,
        and the first failed delivery (:meth:`require_unfailed`) once one failed."""
        if len(self.client) or self.delivery.error is not None:
            raise NotFlushed(
                "records are in flight (or a delivery error is pending): call flush() and "
                "take the checkpoint only when it returns 0 without raising"
            )
        self.require_unfailed()

    def require_unfailed(self) -> None:
        """Raise ``DeliveryFailed`` once a record failed delivery: no checkpoint, bump or roll
        may cover it (:meth:`DeliveryTracker.refusal`)."""
        refusal = self.delivery.refusal()
        if refusal is not None:
            raise refusal

    def __len__(self) -> int:
        return len(self.client)

    def discard(self) -> None:
        """Close the client and the ledger of a producer that never opened (its lease or resume
        failed): nothing of it is in Kafka's hands worth waiting for. Errors are only logged."""
        client = self.client
        try:
            for name in ("purge", "close"):  # confluent-kafka >= 2.13 has close()
                call = getattr(client, name, None)
                if call is not None:
                    call()
        except Exception as exc:  # noqa: BLE001 - the caller raises the error that matters
            log.debug("closing the Kafka client of an unopened producer: %s", exc)
        try:
            self.close_ledger()
        except Exception as exc:  # noqa: BLE001 - as above
            log.debug("closing the ledger of an unopened producer: %s", exc)

    def close_ledger(self) -> None:
        """Close the ledger when this sender opened it, else only flush it."""
        ledger = self.delivery.ledger
        if ledger is not None:
            if self._owns_ledger:
                ledger.close()
            else:
                ledger.flush()


def _chain(own: DeliveryCallback, user: DeliveryCallback) -> DeliveryCallback:
    def both(err: Any, msg: Any) -> None:
        own(err, msg)
        user(err, msg)

    return both


def _interrupt_lost_in(exc: SystemError) -> BaseException:
    """The KeyboardInterrupt that ``exc`` lost (see :data:`_LOST_INTERRUPT`), else ``exc``."""
    lost = sys.version_info < (3, 12) and _LOST_INTERRUPT in str(exc)
    return KeyboardInterrupt() if lost else exc
