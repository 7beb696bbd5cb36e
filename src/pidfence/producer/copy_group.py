"""``CopyGroup``: one member of a copier group (``pidfence copy --group G``).

Members join the Kafka consumer group ``G`` with cooperative-sticky assignment and copy only the
input partitions assigned to them; each partition is a :class:`~pidfence.producer.copy_task.
CopyTask` with a pid of its own, whose checkpoint the group's commits carry, so any member on any
machine continues it. The consumer's rebalance callbacks move the tasks:

* **assigned**: open the task from the group's commit (resume: bump, FENCE, scan; or a fresh
  pid, committed before any data), then start consuming at the committed offset;
* **revoked** (cooperative: the member still belongs to the group): checkpoint (flush, bump,
  commit), close, let go;
* **lost** (the member was dropped from the group, e.g. paused past its session timeout): close
  without a commit; another member has resumed those tasks and fenced this one's records.

A task whose bump fails (another owner fenced it) or whose records Kafka did not acknowledge is
dropped without a commit and, while the partition is still assigned here, opened again from the
group's commit ``RETRY_S`` later; the other tasks go on. So is a task whose group commit could not
be read in time (a member woken from a pause, rejoining while the coordinator rebalances). A
commit the group refuses (a rebalance under way) is made at the next checkpoint.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from pidfence.producer.checkpoint import ProducerCheckpoint
from pidfence.producer.copier import CopyResult, CopySpec, check_partitions
from pidfence.producer.copy_checkpoint import MetadataCodec
from pidfence.producer.copy_task import CopyTask, OpenTask
from pidfence.producer.errors import (
    BrokerUnavailable,
    DeliveryFailed,
    DrainFailed,
    KafkaClientFailed,
    LeaseExpired,
    LeaseServerDown,
    ProducerError,
    ProducerFenced,
)
from pidfence.producer.input_start import check_jump, raise_for, start_offset
from pidfence.producer.partitioner import partition_count

log = logging.getLogger(__name__)

#: Seconds before a dropped task of a partition still assigned here is opened again.
RETRY_S = 3.0
#: Records taken from the consumer per call.
BATCH = 500
#: Seconds without a record after which the member commits what its tasks copied since their
#: last checkpoint (and a commit the group refused): the committed offsets stay current.
IDLE_COMMIT_S = 1.0
#: Seconds a ``consume()`` may overrun its timeout before the member counts that time as a
#: stall (the process was paused, or rebalance callbacks ran long), not as idleness.
STALL_S = 5.0


class CommitFailed(ProducerError):
    """The group refused a commit (a rebalance is under way, or this member left the group);
    the task is opened again from the group's last commit."""

    retriable = True


class PartitionsNotCopied(ProducerError):
    """Partitions assigned to this member could not be opened for ``idle_exit_s`` while it
    was idle."""

    retriable = True


#: What drops one task (opened again later from the group's commit); the others go on.
_TASK_ERRORS = (
    ProducerFenced,
    DeliveryFailed,
    DrainFailed,
    LeaseServerDown,
    LeaseExpired,
    CommitFailed,
    KafkaClientFailed,  # a new producer (a new client) continues from the commit
)


def _transient(exc: confluent_kafka.KafkaException) -> bool:
    """A Kafka error a later try can get past (a busy coordinator timing out a read); the
    partition is opened again later, and a member that never gets past it says so at idle."""
    error = exc.args[0] if exc.args else None
    if not isinstance(error, confluent_kafka.KafkaError):
        return False
    return bool(error.retriable()) or error.code() == confluent_kafka.KafkaError._TIMED_OUT


class CopyGroup:
    """One member of the copier group ``spec.group``.

    Args:
        spec: what to copy (``spec.group`` set).
        open_producer: opens a task's producer (:func:`~pidfence.producer.copy_task.task_opener`).
        codec: the committed checkpoints' format (and the group key, if any).
        consumer_factory: builds the consumer from a librdkafka dict.
        clock: monotonic seconds (idle detection, retries).
    """

    def __init__(
        self,
        spec: CopySpec,
        open_producer: OpenTask,
        codec: MetadataCodec,
        consumer_factory: Callable[[dict[str, Any]], Any] = confluent_kafka.Consumer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self._open_producer = open_producer
        self._codec = codec
        self._consumer_factory = consumer_factory
        self._clock = clock
        self._consumer: Any = None
        #: Open tasks by partition: exactly the partitions this consumer fetches.
        self.tasks: dict[int, CopyTask] = {}
        #: Assigned partitions without a task: when to try opening each again, and since when
        #: and why not yet.
        self._retry: dict[int, float] = {}
        self._why: dict[int, tuple[float, Exception]] = {}
        self._copied: dict[int, int] = {}
        self._offsets: dict[int, int] = {}
        self._resumed = False
        self._assigned = False
        self._active = clock()
        self._commits = 0
        self._stop_next = False
        self._stopping = False
        #: Closing the consumer: an assignment delivered now is given up at once.
        self._leaving = False
        self._partitions = 0
        self._done_check = 0.0

    # ---- the loop ----------------------------------------------------------------------

    def run(self, on_progress: Callable[[int], None] | None = None) -> CopyResult:
        """Copy the partitions the group assigns here until ``max_records`` are copied, SIGTERM,
        or idle for ``idle_exit_s`` once the group has committed every input partition to its
        end (counted from the first assignment); returns what this member did. Every partition
        is handed over with a commit as the member leaves the group (one a rebalance assigns
        while it leaves is not opened: its last owner's commit stands).

        Raises:
            BadCheckpoint: a committed checkpoint this member cannot use (another consumer
                committed in the group, another output topic, another group key).
            PartitionMismatch / UnknownTopic / BrokerUnavailable: as named.
            PartitionsNotCopied: idle, and partitions assigned here could not be opened.
        """
        spec = self.spec
        main = threading.current_thread() is threading.main_thread()
        # SIGTERM (a service manager stopping the member): leave the loop, so closing the
        # consumer hands every partition over with a commit instead of a session timeout.
        previous = signal.signal(signal.SIGTERM, self._stop) if main else None
        consumer = self._consumer = self._consumer_factory(spec.consumer_config())
        try:
            n_in = self._partitions = partition_count(
                consumer.list_topics, spec.bootstrap, spec.from_topic
            )
            check_partitions(
                spec, n_in, partition_count(consumer.list_topics, spec.bootstrap, spec.to_topic)
            )
            consumer.subscribe(
                [spec.from_topic],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            self._loop(consumer, on_progress)
        finally:
            self._leaving = True
            try:
                consumer.close()  # revokes every partition: each task commits and closes
            except confluent_kafka.KafkaException as exc:
                log.warning("closing the consumer: %s", exc)
            for task in list(self.tasks.values()):
                self._release(task, commit=False)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        done = sum(self._copied.values())
        if on_progress is not None:
            on_progress(done)
        return CopyResult(done, dict(self._offsets), self._resumed, dict(self._copied))

    def _stop(self, *_: object) -> None:
        self._stopping = True

    def _loop(self, consumer: Any, on_progress: Callable[[int], None] | None) -> None:
        spec = self.spec
        done = 0
        while (not spec.max_records or done < spec.max_records) and not self._stopping:
            self._reopen_due(consumer)
            turn = self._clock()
            batch = consumer.consume(BATCH, spec.poll_s)
            for msg in batch:
                error = msg.error()
                if error is not None:
                    partitions = functools.partial(
                        partition_count, consumer.list_topics, spec.bootstrap
                    )
                    raise_for(error, spec.from_topic, msg.partition(), partitions)
                    continue
                if self._copy(consumer, msg):
                    done += 1
                    if done == spec.max_records:
                        break
            for task in self.tasks.values():
                task.producer.poll(0)
            if batch:
                self._active = self._clock()
                if on_progress is not None:
                    on_progress(done)
            elif self._clock() - turn > spec.poll_s + STALL_S:
                # A pause is no time in which the member tried and failed: idleness restarts,
                # so a partition failing before it is tried again (or taken away) first.
                self._active = self._clock()
            elif self._quiet(consumer):
                break

    def _quiet(self, consumer: Any) -> bool:
        """No record came: commit the tails of quiet tasks; True when the member may end."""
        spec, now = self.spec, self._clock()
        if now - self._active >= IDLE_COMMIT_S:
            for task in list(self.tasks.values()):
                tp = confluent_kafka.TopicPartition(spec.from_topic, task.partition)
                task.caught_up(consumer.position([tp])[0].offset)
                self._retry_commit(consumer, task)
        if not spec.idle_exit_s or not self._assigned or now - self._active < spec.idle_exit_s:
            return False
        if self._why:
            # Only a partition that stayed unopened for idle_exit_s ends the member: one just
            # dropped (a member woken from a pause finds its task fenced) is usually being taken
            # away by the group, whose callback comes with a later consume().
            stuck = {p: e for p, (since, e) in self._why.items() if now - since >= spec.idle_exit_s}
            if stuck:
                partition, error = next(iter(stuck.items()))
                raise PartitionsNotCopied(
                    f"partitions {sorted(stuck)} of {spec.from_topic} are assigned here but "
                    f"could not be opened (partition {partition}: {error}); retry"
                )
            return False
        if now < self._done_check:
            return False
        self._done_check = now + 1.0
        return self._group_done(consumer)

    def _group_done(self, consumer: Any) -> bool:
        """True once the group has committed every input partition up to its end: a member
        that went quiet while others (or nobody, during a rebalance) still hold work waits."""
        topic, partitions = self.spec.from_topic, range(self._partitions)
        parts = [confluent_kafka.TopicPartition(topic, p) for p in partitions]
        # ListOffsets with timestamp -2 / -1: every partition's start and end in one request.
        at = [[confluent_kafka.TopicPartition(topic, p, ts) for p in partitions] for ts in (-2, -1)]
        try:
            done, starts, ends = (
                {tp.partition: tp.offset for tp in answer}
                for answer in (
                    consumer.committed(parts, timeout=10.0),
                    *(consumer.offsets_for_times(query, timeout=10.0) for query in at),
                )
            )
            if any(max(done[p], starts[p]) < ends[p] for p in partitions):
                return False
        except confluent_kafka.KafkaException as exc:
            log.warning("reading the group's progress: %s", exc)
            return False
        return True

    def _copy(self, consumer: Any, msg: Any) -> bool:
        """Copy one record if its partition's task is open here; True when it was copied."""
        partition = msg.partition()
        task = self.tasks.get(partition)
        if task is None or msg.offset() < task.offset:
            return False
        if self._stop_next:
            self._stop_next = False
            log.warning(
                "fault hook: stopping this process (SIGSTOP) before copying partition %d",
                partition,
            )
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            task.copy(msg)
        except _TASK_ERRORS as exc:
            self._drop(consumer, task, exc)
            return False
        self._copied[partition] = self._copied.get(partition, 0) + 1
        if task.pending >= self.spec.checkpoint_every:
            self._retry_commit(consumer, task)
        return True

    def _retry_commit(self, consumer: Any, task: CopyTask) -> None:
        """Checkpoint ``task``; a refused commit waits for the next try (an idle poll or the
        next checkpoint), any other task error drops the task."""
        try:
            task.checkpoint()
        except CommitFailed as exc:
            log.warning("partition %d: %s; committing again soon", task.partition, exc)
        except _TASK_ERRORS as exc:
            self._drop(consumer, task, exc)

    # ---- tasks ---------------------------------------------------------------------------

    def _open(self, consumer: Any, partition: int) -> bool:
        """Open ``partition``'s task from the group's commit and start consuming it; on a task
        error, schedule another try and return False."""
        spec = self.spec
        tp = confluent_kafka.TopicPartition(spec.from_topic, partition)
        try:
            committed = consumer.committed([tp], timeout=10.0)[0]
            if committed.error is not None:
                raise confluent_kafka.KafkaException(committed.error)
            state: tuple[int, ProducerCheckpoint] | None = None
            log_ends = consumer.get_watermark_offsets(tp, timeout=10.0)
            start = log_ends[0]
            guard = None
            if committed.offset >= 0:
                stored = committed.offset
                start = start_offset(
                    spec.from_topic, partition, stored, log_ends, spec.allow_data_loss
                )
                state = (start, self._codec.decode(partition, committed.metadata))
                guard = functools.partial(
                    check_jump,
                    to_topic=spec.to_topic,
                    partition=partition,
                    stored=stored,
                    start=start,
                )
            task = CopyTask.open(
                partition, spec.to_topic, state, start, self._open_producer, self._store, guard
            )
        except confluent_kafka.KafkaException as exc:
            error = BrokerUnavailable(
                f"reading the group's commit of {spec.from_topic}[{partition}] failed ({exc})"
            )
            if not _transient(exc):
                raise error from exc
            return self._open_later(partition, error)
        except _TASK_ERRORS as exc:
            return self._open_later(partition, exc)
        self._resumed |= state is not None
        self.tasks[partition] = task
        self._retry.pop(partition, None)
        self._why.pop(partition, None)
        consumer.incremental_assign(
            [confluent_kafka.TopicPartition(spec.from_topic, partition, task.offset)]
        )
        log.info("copying %s[%d] from offset %d", spec.from_topic, partition, task.offset)
        return True

    def _open_later(self, partition: int, error: Exception) -> bool:
        """Schedule another try at opening ``partition``; False (not opened)."""
        log.warning("partition %d not opened (%s); trying again soon", partition, error)
        self._not_yet(partition, error)
        return False

    def _not_yet(self, partition: int, error: Exception) -> None:
        """Try opening ``partition`` again ``RETRY_S`` from now; keep when it began failing."""
        now = self._clock()
        self._retry[partition] = now + RETRY_S
        self._why[partition] = (self._why.get(partition, (now, error))[0], error)

    def _reopen_due(self, consumer: Any) -> None:
        now = self._clock()
        for partition in [p for p, at in self._retry.items() if at <= now]:
            self._open(consumer, partition)

    def _drop(self, consumer: Any, task: CopyTask, error: Exception) -> None:
        """Drop a task that lost its right to commit; open it again later if still assigned."""
        log.warning(
            "partition %d dropped without a commit (%s); the group's last commit stands",
            task.partition,
            error,
        )
        self._release(task, commit=False)
        consumer.incremental_unassign(
            [confluent_kafka.TopicPartition(self.spec.from_topic, task.partition)]
        )
        self._not_yet(task.partition, error)

    def _release(self, task: CopyTask, *, commit: bool) -> None:
        self.tasks.pop(task.partition, None)
        try:
            if commit:
                task.checkpoint()
        except (*_TASK_ERRORS, BrokerUnavailable) as exc:
            log.warning(
                "partition %d handed over without a last commit (%s): its next owner "
                "copies again from the one before",
                task.partition,
                exc,
            )
        finally:
            self._offsets[task.partition] = task.offset
            task.close()

    def _store(self, partition: int, offset: int, checkpoint: ProducerCheckpoint) -> None:
        spec = self.spec
        metadata = self._codec.encode(partition, checkpoint)
        tp = confluent_kafka.TopicPartition(spec.from_topic, partition, offset, metadata=metadata)
        try:
            error = self._consumer.commit(offsets=[tp], asynchronous=False)[0].error
        except confluent_kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else exc
        if error is not None:
            raise CommitFailed(
                f"group {spec.group!r} refused the commit of {spec.from_topic}[{partition}] "
                f"({error})"
            )
        self._commits += 1
        if self._commits == spec.stop_after_commit:
            self._stop_next = True

    # ---- rebalance callbacks (run inside consume()) -----------------------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = True
        self._active = self._clock()
        if self._leaving:  # a rebalance met close(): its last owners' commits stand
            consumer.incremental_assign([])
            log.info("assigned %s while leaving: not opened", [tp.partition for tp in partitions])
            return
        opened = [tp.partition for tp in partitions if self._open(consumer, tp.partition)]
        if not opened:
            consumer.incremental_assign([])  # nothing to fetch yet (else all would be)
        log.info("assigned %s; copying %s", [tp.partition for tp in partitions], opened)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._let_go(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        log.warning("lost %s: this member left the group", [tp.partition for tp in partitions])
        self._let_go(consumer, partitions, commit=False)

    def _let_go(self, consumer: Any, partitions: list[Any], *, commit: bool) -> None:
        self._active = self._clock()
        held = [tp for tp in partitions if tp.partition in self.tasks]
        try:
            for tp in partitions:
                self._retry.pop(tp.partition, None)
                self._why.pop(tp.partition, None)
                task = self.tasks.get(tp.partition)
                if task is not None:
                    self._release(task, commit=commit)
        finally:
            # Even if a release failed: a revocation left unanswered stalls the group, and the
            # consumer's close() with it.
            consumer.incremental_unassign(held)
