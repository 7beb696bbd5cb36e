"""Delivery tracking: the first delivery error, acknowledgement counts, the send ledger.

Delivery reports carry no headers, so a tracked record's callback is bound to its ``pf`` header
and event id when it is produced. Errors raised while recording an acknowledgement (a full disk
under the ledger) are kept like delivery errors and raised by the next ``flush()``, never lost
inside librdkafka's callback.

Reports are served by whichever threads call ``poll`` or ``flush`` (several at once when threads
share the producer), so every change of the tracker's state is made under its lock (the count of
untracked records under the GIL alone: :meth:`DeliveryTracker.counter`).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pidfence.ledger import Ledger, LedgerEntry, LedgerError, value_digest
from pidfence.producer.checkpoint import TopicPartition
from pidfence.producer.errors import DeliveryFailed, DeliveryTimedOut
from pidfence.wire import PidfenceError, decode_pf

DeliveryCallback = Callable[[Any, Any], None]

#: One acknowledged record kept for ``resend_acknowledged``: key, value, pf header, event id.
Kept = tuple[Any, Any, bytes, "str | None"]

#: librdkafka's errors of a record that did not reach Kafka in time (Kafka, a broker or the
#: network was down, a partition had no leader): a rerun that resumes continues once Kafka answers.
TRANSIENT_CODES = frozenset(
    {
        "_MSG_TIMED_OUT",
        "_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_RESOLVE",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "BROKER_NOT_AVAILABLE",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    }
)


class DeliveryTracker:
    """Counts acknowledgements, keeps the first error, writes the ledger, keeps resend copies.

    Args:
        ledger: the send ledger, or None.
        keep: acknowledged records kept per partition for resends (0: none).
        lease_ends: pid -> lease end, for the ledger's ``expire_ms`` (the session's record).
    """

    def __init__(
        self, ledger: Ledger | None, keep: int, lease_ends: Mapping[int, int] | None = None
    ) -> None:
        self.ledger = ledger
        self.keep = keep
        self.acked = 0
        self.fences_acked = 0
        self.error: PidfenceError | None = None
        #: The first record that failed delivery (kept: see :meth:`refusal`).
        self.failed: DeliveryFailed | None = None
        self.lease_ends: Mapping[int, int] = {} if lease_ends is None else lease_ends
        self.kept: dict[TopicPartition, deque[Kept]] = {}
        #: Offset after the last acknowledged FENCE per partition (a resume's scan ends there).
        self.fence_ends: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()

    @property
    def tracking(self) -> bool:
        """True when each record needs its own callback (ledger or resend buffer)."""
        return self.ledger is not None or self.keep > 0

    def take_error(self) -> PidfenceError | None:
        """The pending error (cleared)."""
        with self._lock:
            error, self.error = self.error, None
        return error

    def keep_error(self, error: PidfenceError) -> None:
        """Keep ``error`` for the next ``flush()`` unless an earlier one is pending; the first
        failed delivery is kept for good (:meth:`refusal`)."""
        with self._lock:
            if self.error is None:
                self.error = error
            if self.failed is None and isinstance(error, DeliveryFailed):
                self.failed = error

    def refusal(self) -> DeliveryFailed | None:
        """Why this producer may not checkpoint, bump or roll any more (None: it may).

        A record that failed delivery is not in Kafka: a checkpoint taken after it would cover
        it, and the caller would never send its event again (``flush()`` raises the error only
        once). Only a resume (a new producer) re-sends it.
        """
        first = self.failed
        if first is None:
            return None
        return type(first)(
            f"{first} (this producer refuses to checkpoint, bump or roll over since: a "
            "checkpoint would cover that record)",
            code=first.code,
        )

    def on_delivery(self, err: Any, msg: Any) -> None:
        """Callback of an untracked record (the GIL makes the count one step: see
        :meth:`counter`)."""
        if err is not None:
            self.keep_error(delivery_error(err, msg))
            return
        self.acked += 1

    def on_delivery_locked(self, err: Any, msg: Any) -> None:
        """:meth:`on_delivery` where the GIL is off."""
        if err is not None:
            self.keep_error(delivery_error(err, msg))
            return
        with self._lock:
            self.acked += 1

    def counter(self) -> DeliveryCallback:
        """The callback of untracked records.

        Under the GIL, ``self.acked += 1`` is one step no other thread can split: CPython
        switches threads only at calls, function entries and backward jumps, and the increment
        of an instance attribute holds none. A lock there would cost about what the producer's
        own lock costs per record (bench/results/produce_threads.md). Where the GIL is off
        (free-threaded builds), the callback takes the lock.
        """
        gil = getattr(sys, "_is_gil_enabled", lambda: True)()
        return self.on_delivery if gil else self.on_delivery_locked

    def on_tracked(self, header: bytes, event: str | None, err: Any, msg: Any) -> None:
        """Callback of a tracked data record (bound to its header and event id)."""
        if err is not None:
            self.keep_error(delivery_error(err, msg))
            return
        with self._lock:
            self.acked += 1
            if self.keep:
                tp = (msg.topic(), msg.partition())
                buffer = self.kept.get(tp)
                if buffer is None:
                    buffer = self.kept[tp] = deque(maxlen=self.keep)
                buffer.append((msg.key(), msg.value(), header, event))
        if self.ledger is not None:
            self.write(msg, header, False, event)

    def on_other(self, header: bytes, fence: bool, event: str | None, err: Any, msg: Any) -> None:
        """Callback of a FENCE record or a resent copy."""
        if err is not None:
            self.keep_error(delivery_error(err, msg))
            return
        if fence:
            tp = (msg.topic(), msg.partition())
            with self._lock:
                self.fences_acked += 1
                self.fence_ends[tp] = max(self.fence_ends.get(tp, 0), msg.offset() + 1)
        if self.ledger is not None:
            self.write(msg, header, fence, event)

    def write(self, msg: Any, header: bytes, fence: bool, event: str | None) -> None:
        """Append the ledger line of one acknowledged record."""
        if self.ledger is None:
            return
        pf = decode_pf(header)
        value = msg.value()
        digest = value_digest(value)
        try:
            self.ledger.write(
                LedgerEntry(
                    pid=pf.pid,
                    generation=pf.generation,
                    topic=msg.topic(),
                    partition=msg.partition(),
                    seq=pf.seq,
                    digest=digest,
                    offset=msg.offset(),
                    ts_ms=msg.timestamp()[1],
                    fence=fence,
                    expire_ms=self.lease_ends.get(pf.pid, 0),
                    event="" if fence else (event or digest),
                )
            )
        except LedgerError as exc:
            self.keep_error(exc)


def delivery_error(err: Any, msg: Any) -> DeliveryFailed:
    """The error of a record Kafka did not acknowledge (``err``: librdkafka's):
    :class:`~pidfence.producer.errors.DeliveryTimedOut` (retriable) when Kafka could not be
    reached in time or the client failed for good (a new one continues), else ``DeliveryFailed``."""
    code = str(err.name()) if hasattr(err, "name") else str(err)
    fatal = getattr(err, "fatal", None)
    transient = code in TRANSIENT_CODES or (callable(fatal) and bool(fatal()))
    return (DeliveryTimedOut if transient else DeliveryFailed)(
        f"Kafka did not acknowledge a record to {msg.topic()}[{msg.partition()}]: {err}; "
        "resume from the last checkpoint (records after it are re-sent and deduplicated)",
        code=code,
    )


class Skipped:
    """The delivery report of a record a resume did not send: the recovery scan found it in
    Kafka already, sent by the checkpoint's earlier holder (``skipped()`` is True).

    It quacks like the ``confluent_kafka.Message`` of a report: ``topic()``, ``partition()``,
    ``key()`` and ``value()`` are the record's; its offset is not known here, so ``offset()`` is
    None, ``timestamp()`` is ``(0, -1)`` (``TIMESTAMP_NOT_AVAILABLE``), ``headers()`` and
    ``error()`` are None.
    """

    __slots__ = ("_key", "_partition", "_topic", "_value")

    def __init__(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._partition, self._key, self._value = topic, partition, key, value

    def topic(self) -> str:
        """The record's topic."""
        return self._topic

    def partition(self) -> int:
        """The partition it went to (in the earlier holder's run, and in this one)."""
        return self._partition

    def key(self) -> bytes | None:
        """The record's key."""
        return self._key

    def value(self) -> bytes | None:
        """The record's value."""
        return self._value

    def offset(self) -> None:
        """Not known: the earlier holder's acknowledgement had it."""
        return None

    def timestamp(self) -> tuple[int, int]:
        """``(TIMESTAMP_NOT_AVAILABLE, -1)``."""
        return (0, -1)

    def headers(self) -> None:
        """None."""
        return None

    def error(self) -> None:
        """None: the record is in Kafka."""
        return None

    def skipped(self) -> bool:
        """True: this record was not sent again."""
        return True

    def __len__(self) -> int:
        return len(self._value or b"")
