"""``CopyTask``: one input partition of a copier group, copied to the same output partition
under a pid of its own (a Kafka Streams task with its own producer, as KIP-447 fences them).

A task's checkpoint is the next input offset with its producer checkpoint, committed to the group
(:mod:`~pidfence.producer.copy_checkpoint`). The rules that keep the output exact when a
partition changes hands, or two members both think they hold it:

* **Open**: resume the committed checkpoint (bump its pid's generation through the lease server,
  FENCE the output partition, recovery scan) or lease a fresh pid, then commit before any data:
  a pid nobody committed could not be fenced by the next owner.
* **Checkpoint**: flush, then :meth:`~pidfence.producer.IdempotentProducer.bump` (a
  compare-and-set on the generation the records went out under, then a FENCE of the new one),
  then commit the checkpoint of that generation. The bump succeeds only if nobody bumped the pid
  since this task's last bump, resume or roll, so none of the records the commit covers can have
  been ``FENCED`` by another owner. If it fails, nothing is committed and the task is dropped;
  the records are copied again from the last commit. (The lease server is then one generation
  ahead of the commit; the next owner's resume probes past it and FENCEs from the committed one
  up.) The FENCE makes every generation land on the output partition even when all its records
  are re-copies the sink drops as ``DUPLICATE`` (which move nothing): without it, the next
  generation's data would be two ahead of the sink, ``INVALID_GENERATION``, and lost.
* **Roll over**: a roll is itself a compare-and-set; its successor is committed with the
  offset of the record about to be sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pidfence.producer.checkpoint import ProducerCheckpoint, TopicPartition
from pidfence.producer.copier import copy_record
from pidfence.producer.idempotent import IdempotentProducer
from pidfence.wire import PidfenceError

log = logging.getLogger(__name__)

#: Generations a resume tries past the committed one: each checkpoint bumps once past its
#: commit, and each commit the group refuses after a bump (a rebalance) adds one.
PROBE = 64
#: Commits ``(partition, next input offset, checkpoint)`` to the group.
Store = Callable[[int, int, ProducerCheckpoint], None]
#: ``f(checkpoint or None, (output topic, partition))``: a fresh or resumed task producer.
OpenTask = Callable[[ProducerCheckpoint | None, TopicPartition], IdempotentProducer]


@dataclass(eq=False)
class CopyTask:
    """Copies one input partition to the same partition of ``to_topic``.

    Args:
        partition: the input (and output) partition.
        to_topic: the output topic.
        producer: the task's producer, writing only ``(to_topic, partition)``.
        offset: the next input offset to copy.
        store: commits the task's checkpoint to the group.
    """

    partition: int
    to_topic: str
    producer: IdempotentProducer
    offset: int
    store: Store
    #: Records copied since the last bump.
    pending: int = field(default=0, init=False)
    _unstored: tuple[int, ProducerCheckpoint] | None = field(default=None, init=False)
    #: The last committed checkpoint: its generation is the one the output holds.
    _stored: ProducerCheckpoint | None = field(default=None, init=False)

    @classmethod
    def open(
        cls,
        partition: int,
        to_topic: str,
        committed: tuple[int, ProducerCheckpoint] | None,
        start: int,
        open_producer: OpenTask,
        store: Store,
        guard: Callable[[IdempotentProducer], None] | None = None,
    ) -> CopyTask:
        """Continue the group's ``committed`` (offset, checkpoint), or start at ``start`` under a
        fresh pid, and commit before any record is copied.

        ``guard(producer)``, if given, runs on the opened producer before that commit.

        Raises:
            ProducerFenced: another owner holds the committed lineage.
            Whatever ``open_producer``, ``guard`` and ``store`` raise (the producer is closed).
        """
        offset, checkpoint = committed if committed is not None else (start, None)
        producer = open_producer(checkpoint, (to_topic, partition))
        task = cls(partition, to_topic, producer, offset, store)
        try:
            if guard is not None:
                guard(producer)
            task._flush()  # librdkafka's own events count as in flight until served
            # The lease or the resume's bump just proved this task owns the pid.
            task._save(offset, producer.checkpoint(confirm=False))
        except BaseException:
            task.close()
            raise
        return task

    def copy(self, msg: Any) -> None:
        """Copy one input record (rolling the pid over first when due)."""
        producer = self.producer
        if producer.rollover_due:
            # roll() drains, rolls (a compare-and-set), then this commits the successor with
            # the offset of the record about to go out under it.
            producer.roll(lambda checkpoint: self._save(self.offset, checkpoint))
        copy_record(producer, msg, self.to_topic)
        self.offset = msg.offset() + 1
        self.pending += 1

    @property
    def unstored(self) -> bool:
        """True while a proven checkpoint waits for a commit the group refused."""
        return self._unstored is not None

    def checkpoint(self) -> None:
        """Flush, bump, commit; or commit again what a refused commit left (no new bump: the
        last one proved it). Nothing when everything copied is committed.

        Raises:
            ProducerFenced: another owner bumped the pid: nothing was committed.
            DeliveryFailed / LeaseServerDown: nothing was committed.
            What ``store`` raises: not committed; :attr:`unstored`, the next call tries again.
        """
        producer = self.producer
        if self.pending:
            self._flush()
            # Committed: the generation the records went out under, which the output holds.
            # The bump only proves nobody fenced them (a compare-and-set, so no lease server
            # question before it); the next owner's resume probes past it.
            checkpoint = producer.checkpoint(confirm=False)
            producer.bump()
            self.pending = 0
            self._unstored = (self.offset, checkpoint)
        if self._unstored is not None:
            self._save(*self._unstored)

    def caught_up(self, position: int) -> None:
        """The consumer's ``position``: past :attr:`offset` with nothing copied since the last
        checkpoint, the offsets between hold no data (transaction markers), so the next commit
        moves to it with the last committed checkpoint."""
        stored = self._stored
        if position > self.offset and not self.pending and not self.unstored and stored:
            self.offset = position
            self._unstored = (position, stored)

    def _flush(self) -> None:
        while self.producer.flush(60.0):
            pass

    def _save(self, offset: int, checkpoint: ProducerCheckpoint) -> None:
        self._unstored = (offset, checkpoint)
        self.store(self.partition, offset, checkpoint)
        self._unstored = None
        self._stored = checkpoint

    def close(self) -> None:
        """Close the producer (closed even when its flush fails); an error is only logged: the
        next owner copies again from the last commit."""
        try:
            self.producer.close()
        except PidfenceError as exc:
            log.warning("closing the producer of partition %d: %s", self.partition, exc)


def task_opener(config: Any, lease_client: Any, **options: Any) -> OpenTask:
    """An :data:`OpenTask` that leases a fresh pid without a checkpoint and otherwise resumes it,
    FENCing and scanning only the task's output partition. ``options``: the producer's
    (``ledger``: share one :class:`~pidfence.ledger.LedgerWriter` between tasks)."""

    def open_task(
        checkpoint: ProducerCheckpoint | None, output: TopicPartition
    ) -> IdempotentProducer:
        if checkpoint is None:
            return IdempotentProducer(config, lease_client, **options)
        return IdempotentProducer.resume(
            checkpoint, lease_client, config, partitions=[output], stale_probe=PROBE, **options
        )

    return open_task
