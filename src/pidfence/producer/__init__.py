"""The idempotent producer: leased pid, per-partition seqs, ``pf`` headers, checkpoint/resume.

``IdempotentProducer`` wraps ``confluent_kafka.Producer``; ``ProducerSession`` is its I/O-free
lease session (every decision), ``Sequencer`` its seq counters; the deterministic simulation
runs the same producer over a simulated Kafka client and lease server. ``ProducerCheckpoint`` is
what a caller stores with its upstream position. See docs/producer.md.
"""

from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
from pidfence.producer.driver import SaveCheckpoint
from pidfence.producer.errors import (
    BadCheckpoint,
    BatchMismatch,
    BrokerUnavailable,
    DeliveryFailed,
    DrainFailed,
    InvalidTransition,
    LeaseExpired,
    LeaseServerDown,
    NotFlushed,
    ProducerConfigError,
    ProducerError,
    ProducerFenced,
    ReservedHeader,
    StateFileRefused,
    StateStorageFailed,
    UnknownPartition,
    UnknownTopic,
    ValueTooLarge,
    ZooKeeperUnavailable,
)
from pidfence.producer.idempotent import IdempotentProducer, wall_clock_ms
from pidfence.producer.lease import LeaseKeeper, Resumed
from pidfence.producer.murmur2 import key_partition, murmur2
from pidfence.producer.sequencer import Sequencer
from pidfence.producer.session import ProducerSession
from pidfence.producer.state import LeaseState, LeaseStateMachine

__all__ = [
    "BadCheckpoint",
    "BatchMismatch",
    "BrokerUnavailable",
    "DeliveryFailed",
    "DrainFailed",
    "IdempotentProducer",
    "InvalidTransition",
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
