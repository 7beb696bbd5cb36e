"""The copier behind ``pidfence copy``: topic A to topic B, exactly once after dedup.

Input partition ``i`` goes to output partition ``i`` (the counts must match), so the records of
one output partition are exactly one input partition's records in offset order: after a restart
the copier re-reads from the stored offsets and gives every re-sent record the seq it had before,
and the broker rules drop the ones that already landed as ``DUPLICATE``.

:class:`Copier` is one process with one state file: every ``checkpoint_every`` records (and at
exit) it flushes, then stores the next input offset per partition TOGETHER WITH the producer
checkpoint in the file (tmp + fsync + rename); no Kafka offset commits. A copier group
(``--group``, :mod:`~pidfence.producer.copy_group`) keeps them in the group's commits instead.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.client_log import librdkafka_logger
from pidfence.producer.errors import (
    BadCheckpoint,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)
from pidfence.producer.headers import RESERVED_HEADERS
from pidfence.producer.idempotent import IdempotentProducer
from pidfence.producer.input_start import (
    OFFSET_RESET,
    InputRecordsDeleted,
    check_jump,
    raise_for,
    start_offset,
)
from pidfence.producer.opening import OpenProducer, PeriodicCheckpoints
from pidfence.producer.partitioner import partition_count
from pidfence.producer.statefile import load_state, save_state

log = logging.getLogger(__name__)

STATE_VERSION = 1


class PartitionMismatch(ProducerError):
    """Input and output partition counts differ; create the output with as many partitions.

    Merging partitions would make a record's seq depend on how partitions interleave, which
    differs after a restart, so dedup could drop the wrong record.
    """


@dataclass(frozen=True)
class CopySpec:
    """What one copier does.

    Attributes:
        bootstrap: Kafka bootstrap servers (for the consumer).
        from_topic: input topic.
        to_topic: output topic (same partition count), not ``from_topic``
            (:class:`~pidfence.producer.errors.ProducerConfigError`).
        group: the copier group (``--group``, :class:`~pidfence.producer.copy_group.CopyGroup`):
            the consumer ``group.id`` whose commits hold the checkpoints. A single
            :class:`Copier` keeps them in its state file and uses a group id of its own.
        max_records: stop after copying this many records in this run (0: no limit).
        idle_exit_s: stop once no record arrived for this long (0: never); a group member
            counts from its first assignment and also waits until the group has committed every
            input partition to its end.
        checkpoint_every: flush and save the state (a group: commit a partition) every N records.
        poll_s: consumer poll timeout.
        session_timeout_s: a group member's session timeout: how long a silent member keeps its
            partitions before the group hands them to others.
        stop_after_commit: fault hook for chaos tests: after its N-th commit a group member
            stops itself (SIGSTOP) right before copying its next record. 0: never.
        consumer_extra: more librdkafka settings for the consumer (e.g. ``security.protocol``
            and SASL for a secured cluster); they override the copier's own.
    """

    bootstrap: str
    from_topic: str
    to_topic: str
    group: str = ""
    max_records: int = 0
    idle_exit_s: float = 10.0
    checkpoint_every: int = 200
    #: More librdkafka settings for the consumer.
    consumer_extra: dict[str, Any] = field(default_factory=dict)
    poll_s: float = 0.2
    session_timeout_s: float = 10.0
    stop_after_commit: int = 0
    #: Continue after input records Kafka deleted before they were copied (else refused).
    allow_data_loss: bool = False

    def __post_init__(self) -> None:
        # One bootstrap serves both sides, so the same name is the same topic: the copy would
        # read its own output back, never idle out, and a sink would append every round.
        if self.from_topic == self.to_topic:
            raise ProducerConfigError(
                f"from_topic and to_topic are both {self.from_topic!r}: a copy into its own "
                "input never ends; copy to another topic"
            )

    def consumer_config(self) -> dict[str, Any]:
        """The consumer's librdkafka settings: offsets only where the copier stores them."""
        group = {
            "group.id": self.group,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": round(self.session_timeout_s * 1000),
        }
        return {
            "bootstrap.servers": self.bootstrap,
            **(group if self.group else {"group.id": f"pidfence-copy-{self.to_topic}"}),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": OFFSET_RESET,
            "logger": librdkafka_logger(),
            **self.consumer_extra,
        }


@dataclass
class CopyResult:
    """What one run did (a group member: ``copied`` is this run's, per partition in
    ``per_partition``)."""

    copied: int
    offsets: dict[int, int]
    resumed: bool
    per_partition: dict[int, int] = field(default_factory=dict)


def check_partitions(spec: CopySpec, n_in: int, n_out: int) -> None:
    """Refuse topics whose partition counts differ (:class:`PartitionMismatch`)."""
    if n_out != n_in:
        raise PartitionMismatch(
            f"{spec.from_topic} has {n_in} partitions and {spec.to_topic} has {n_out}; "
            f"create {spec.to_topic} with {n_in} partitions"
        )


def copy_record(producer: IdempotentProducer, msg: Any, to_topic: str) -> None:
    """Send one input record to the same partition of ``to_topic``; its event id is its
    upstream position ``topic:partition:offset``."""
    headers = [(k, v) for k, v in (msg.headers() or []) if k not in RESERVED_HEADERS]
    producer.produce(
        to_topic,
        msg.value(),
        key=msg.key(),
        partition=msg.partition(),
        headers=headers or None,
        event_id=f"{msg.topic()}:{msg.partition()}:{msg.offset()}",
    )


class Copier:
    """Consumes ``from_topic`` with manual offsets and re-produces every record to ``to_topic``.

    Args:
        spec: what to copy.
        open_producer: ``f(checkpoint or None)`` -> a producer (resumed from the checkpoint).
        state_path: the state file holding offsets + producer checkpoint.
        consumer_factory: builds the consumer from a librdkafka dict.
        clock: monotonic seconds (idle detection).
    """

    def __init__(
        self,
        spec: CopySpec,
        open_producer: OpenProducer,
        state_path: str | Path,
        consumer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Consumer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self._open = open_producer
        self.state_path = Path(state_path)
        self._consumer_factory = consumer_factory
        self._clock = clock
        self._checkpoints = PeriodicCheckpoints(f"state file {self.state_path}")

    def _load(self) -> tuple[dict[int, int], ProducerCheckpoint | None, int]:
        data = load_state(self.state_path)
        if data is None:
            return {}, None, 0
        try:
            if data.get("v") != STATE_VERSION or (data.get("from"), data.get("to")) != (
                self.spec.from_topic,
                self.spec.to_topic,
            ):
                raise BadCheckpoint(
                    f"state file {self.state_path} copies {data.get('from')!r} -> "
                    f"{data.get('to')!r}, not this copy; use another --state"
                )
            offsets = {int(p): int(o) for p, o in data["offsets"].items()}
            copied = int(data.get("copied", 0))
            checkpoint = ProducerCheckpoint.from_dict(data["checkpoint"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, BadCheckpoint):
                raise
            raise BadCheckpoint(f"state file {self.state_path} is incomplete ({exc!r})") from exc
        return offsets, checkpoint, copied

    def _log_of(self, consumer: Any, partition: int) -> tuple[int, int]:
        """The input partition's (start, end) offsets."""
        tp = confluent_kafka.TopicPartition(self.spec.from_topic, partition)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10.0)
        except confluent_kafka.KafkaException as exc:
            raise BrokerUnavailable(
                f"reading where {self.spec.from_topic}[{partition}] starts failed ({exc})"
            ) from exc
        return int(low), int(high)

    def _save(
        self,
        producer: IdempotentProducer,
        offsets: dict[int, int],
        copied: int,
        last: bool = False,
    ) -> None:
        """Flush, then store the offsets with a checkpoint that confirms this instance still
        owns its pid (``ProducerFenced`` otherwise: it was replaced, it stops). While no lease
        server answers, a save before the ``last`` one is skipped."""
        while producer.flush(60.0):
            pass
        checkpoint = self._checkpoints.take(producer, last)
        if checkpoint is not None:
            self._store(checkpoint, offsets, copied)

    def _store(self, checkpoint: ProducerCheckpoint, offsets: dict[int, int], copied: int) -> None:
        save_state(
            self.state_path,
            {
                "v": STATE_VERSION,
                "from": self.spec.from_topic,
                "to": self.spec.to_topic,
                "offsets": {str(p): o for p, o in sorted(offsets.items())},
                "copied": copied,
                "checkpoint": checkpoint.to_dict(),
            },
        )

    def run(self, on_progress: Callable[[int], None] | None = None) -> CopyResult:
        """Copy until idle for ``idle_exit_s`` or ``max_records`` copied; returns what happened."""
        spec = self.spec
        offsets, checkpoint, copied_before = self._load()
        consumer = self._consumer_factory(spec.consumer_config())
        try:
            n_in = partition_count(consumer.list_topics, spec.bootstrap, spec.from_topic)
            producer = self._open(checkpoint)
            try:
                result = self._copy(consumer, producer, n_in, offsets, copied_before, on_progress)
                result.resumed = checkpoint is not None
                return result
            finally:
                producer.close()
        finally:
            consumer.close()

    def _copy(
        self,
        consumer: Any,
        producer: IdempotentProducer,
        n_in: int,
        offsets: dict[int, int],
        copied: int,
        on_progress: Callable[[int], None] | None,
    ) -> CopyResult:
        spec = self.spec
        check_partitions(spec, n_in, producer.partition_count(spec.to_topic))
        for p in range(n_in):
            log_ends = self._log_of(consumer, p)
            stored = offsets.setdefault(p, log_ends[0])  # stored: a resume checks it too
            start = start_offset(spec.from_topic, p, stored, log_ends, spec.allow_data_loss)
            check_jump(producer, spec.to_topic, p, stored, start)
            offsets[p] = start
        # Save right after a resume: it bumped the generation.
        self._save(producer, offsets, copied)
        consumer.assign(
            [
                confluent_kafka.TopicPartition(
                    spec.from_topic, p, offsets.get(p, confluent_kafka.OFFSET_BEGINNING)
                )
                for p in range(n_in)
            ]
        )
        this_run = 0
        last_record = self._clock()
        while not spec.max_records or this_run < spec.max_records:
            msg = consumer.poll(spec.poll_s)
            if producer.rollover_due:
                # roll() drains, rolls through the lease server and stores the offsets with the
                # successor's checkpoint: its seqs start here (docs/producer.md, "Lease
                # rollover"). Also while idle: a quiet input keeps its lease (and its stored
                # offsets) current instead of meeting a pid the lease servers forgot.
                producer.roll(functools.partial(self._store, offsets=offsets, copied=copied))
            if msg is None:
                producer.poll(0)
                if spec.idle_exit_s and self._clock() - last_record >= spec.idle_exit_s:
                    break
                continue
            if msg.error() is not None:
                try:
                    partitions = functools.partial(
                        partition_count, consumer.list_topics, spec.bootstrap
                    )
                    raise_for(msg.error(), spec.from_topic, msg.partition(), partitions)
                except InputRecordsDeleted:
                    # Saved, nothing is owed past the checkpoint: --allow-data-loss can go on.
                    self._save(producer, offsets, copied, last=True)
                    raise
                continue
            last_record = self._clock()
            copy_record(producer, msg, spec.to_topic)
            offsets[msg.partition()] = msg.offset() + 1
            this_run += 1
            copied += 1
            if copied % spec.checkpoint_every == 0:
                self._save(producer, offsets, copied)
                if on_progress is not None:
                    on_progress(copied)
        self._save(producer, offsets, copied, last=True)
        if on_progress is not None:
            on_progress(copied)
        return CopyResult(copied, dict(offsets), resumed=False)
