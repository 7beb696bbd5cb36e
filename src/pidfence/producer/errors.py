"""Errors the producer raises on purpose; each says what to do about it."""

from __future__ import annotations

from pidfence.wire import PidfenceError


class ProducerError(PidfenceError):
    """Root of the producer's errors."""


class ProducerConfigError(ProducerError, ValueError):
    """A producer setting that cannot give idempotent, exactly-once writes; fix the setting."""


class ReservedHeader(ProducerError, ValueError):
    """The caller passed a header named ``pf``, ``pfc`` or ``pfm``: the producer owns them.
    Rename the header."""


class BatchMismatch(ProducerError, ValueError):
    """``produce_many`` got ``keys`` or ``event_ids`` of another length than ``values``."""


class UnknownTopic(ProducerError):
    """The topic does not exist (or has no partitions). Create it first, then produce again."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic!r} does not exist on the cluster: create it "
            "(`kafka-topics --create` or `pidfence.services.create_topic`) and produce again"
        )
        self.topic = topic


class UnknownPartition(ProducerError, ValueError):
    """``produce(partition=N)`` named a partition the topic does not have."""


class BrokerUnavailable(ProducerError):
    """No Kafka broker answered a metadata request; check --bootstrap and that Kafka runs."""

    retriable = True


class LeaseServerDown(ProducerError):
    """No lease server could serve the request: none answered after the client's retries.

    Start one or fix ``--lease-server``. Its subclass :class:`ZooKeeperUnavailable` says that a
    lease server answered but cannot reach its ZooKeeper.
    """

    retriable = True


class ZooKeeperUnavailable(LeaseServerDown):
    """A lease server answered ``UNAVAILABLE``: it runs, but cannot reach its ZooKeeper.

    Check the ZooKeeper ensemble the lease server uses (``pidfence lease-server --zk``), then
    retry; starting another lease server does not help.
    """


class LeaseExpired(ProducerError):
    """The pid's lease ended and no new one could be leased; retry once a lease server answers."""

    retriable = True


class ProducerFenced(ProducerError):
    """Another producer resumed the same checkpoint (its bump or roll won), so this instance was
    replaced: it must stop and store nothing more."""


class ValueTooLarge(ProducerError, ValueError):
    """A record larger than ``message.max.bytes``; split it or raise the limit on both sides."""


class DeliveryFailed(ProducerError):
    """Kafka did not acknowledge a record after librdkafka's own retries (``code``: librdkafka's
    error name, e.g. ``MSG_SIZE_TOO_LARGE``).

    Resume from the last checkpoint: the records after it are re-sent and deduplicated by seq.
    Once a record failed, the producer refuses ``checkpoint``, ``bump`` and ``roll`` (the failed
    record is not in Kafka, so no checkpoint may cover it).
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class DeliveryTimedOut(DeliveryFailed):
    """Kafka could not be reached in time: librdkafka's message timeout, a broker or the network
    down, a partition without a leader. A rerun that resumes from the last checkpoint continues
    once Kafka answers."""

    retriable = True


class KafkaRefused(ProducerError):
    """librdkafka refused a call for a reason a rerun meets again (``code``: its error name)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class KafkaClientFailed(KafkaRefused):
    """librdkafka's client failed for good (a fatal error, ``code``): this producer cannot go
    on. A new producer resumed from the last checkpoint has a new client and continues."""

    retriable = True


class InvalidTransition(ProducerError):
    """A lease state change the state machine does not allow (a bug in the caller)."""


class BadCheckpoint(ProducerError, ValueError):
    """A checkpoint (or state file) that does not parse; restore a good copy or start afresh."""


class NotFlushed(ProducerError):
    """``checkpoint()`` while records are in flight: call ``flush()`` first, then checkpoint."""


class DrainFailed(ProducerError):
    """Records under the old pid were still unacknowledged when a rollover had to happen.

    Nothing was sent under a new pid. Resume from the last checkpoint (the records after it are
    re-sent under the checkpoint's lineage and deduplicated).
    """

    retriable = True


class StateStorageFailed(ProducerError):
    """A state file could not be read or written for a transient reason (disk full, I/O error).

    Nothing was replaced: the previous state file is intact. Free space, then retry.
    """

    retriable = True


class StateFileRefused(ProducerError):
    """The state file path cannot be used (a folder, no permission): give another ``--state``."""


class ProducerForked(ProducerError):
    """A producer used in a process forked from the one that created it.

    Two processes must never send under one lease: create the producer after the fork, in the
    process that uses it (gunicorn: in ``post_fork`` or per worker; ``multiprocessing``: inside
    the target function).
    """
