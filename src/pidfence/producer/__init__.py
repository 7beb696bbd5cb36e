"""The idempotent producer: leased pid, per-partition seqs, ``pf`` headers, checkpoint/resume.

``IdempotentProducer`` wraps ``confluent_kafka.Producer`` (threads may share it;
``AsyncIdempotentProducer`` is the same for asyncio); ``ProducerSession`` is its I/O-free lease
session (every decision), ``Sequencer`` its seq counters; the deterministic simulation runs the
same producer over a simulated Kafka client and lease server. ``ProducerCheckpoint`` is
what a caller stores with its upstream position. See docs/producer.md.
"""

from pidfence.pid_allocator.clock import wall_clock_ms
from pidfence.producer.aio import AsyncIdempotentProducer
from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.driver import SaveCheckpoint
from pidfence.producer.errors import (
    BadCheckpoint,
    BatchMismatch,
    BrokerUnavailable,
    DeliveryFailed,
    DeliveryTimedOut,
    DrainFailed,
    InvalidTransition,
    KafkaClientFailed,
    KafkaRefused,
    LeaseExpired,
    LeaseServerDown,
    NotFlushed,
    ProducerConfigError,
    ProducerError,
    ProducerFenced,
    ProducerForked,
    ReservedHeader,
    StateFileRefused,
    StateStorageFailed,
    UnknownPartition,
    UnknownTopic,
    ValueTooLarge,
    ZooKeeperUnavailable,
)
from pidfence.producer.idempotent import IdempotentProducer
from pidfence.producer.lease import LeaseKeeper, Resumed
from pidfence.producer.murmur2 import key_partition, murmur2
from pidfence.producer.sequencer import Sequencer
from pidfence.producer.session import ProducerSession
from pidfence.producer.state import LeaseState, LeaseStateMachine

__all__ = [
    "AsyncIdempotentProducer",
    "BadCheckpoint",
    "BatchMismatch",
    "BrokerUnavailable",
    "DeliveryFailed",
    "DeliveryTimedOut",
    "DrainFailed",
    "IdempotentProducer",
    "InvalidTransition",
    "KafkaClientFailed",
    "KafkaRefused",
    "LeaseExpired",
    "LeaseKeeper",
    "LeaseServerDown",
    "LeaseState",
    "LeaseStateMachine",
    "NotFlushed",
    "ProducerCheckpoint",
    "ProducerConfig",
    "ProducerConfigError",
    "ProducerError",
    "ProducerFenced",
    "ProducerForked",
    "ProducerSession",
    "ReservedHeader",
    "Resumed",
    "SaveCheckpoint",
    "Sequencer",
    "StateFileRefused",
    "StateStorageFailed",
    "TopicPartition",
    "UnknownPartition",
    "UnknownTopic",
    "ValueTooLarge",
    "ZooKeeperUnavailable",
    "key_partition",
    "murmur2",
    "wall_clock_ms",
]
