"""The idempotent producer: leased pid, per-partition seqs, ``pf`` headers, checkpoint/resume.

``IdempotentProducer`` wraps ``confluent_kafka.Producer``; ``Sequencer`` is its I/O-free core
(driven directly by the deterministic simulation); ``ProducerCheckpoint`` is what a caller stores
with its upstream position. See docs/producer.md.
"""

from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.config import ProducerConfig
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
    UnknownTopic,
    ValueTooLarge,
)
from pidfence.producer.idempotent import IdempotentProducer, SaveCheckpoint, wall_clock_ms
from pidfence.producer.lease import LeaseKeeper, Resumed
from pidfence.producer.murmur2 import key_partition, murmur2
from pidfence.producer.sequencer import Sequencer
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
    "ReservedHeader",
    "Resumed",
    "SaveCheckpoint",
    "Sequencer",
    "StateFileRefused",
    "StateStorageFailed",
    "TopicPartition",
    "UnknownTopic",
    "ValueTooLarge",
    "key_partition",
    "murmur2",
    "wall_clock_ms",
]
