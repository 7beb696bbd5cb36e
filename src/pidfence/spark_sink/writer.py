"""The streaming writer: ``write()`` on executors, ``commit()``/``abort()`` on the driver.

The commit protocol (docs/sink.md, "Recovery model"): a task writes its partition's log, rejects,
held records and decisions under attempt-unique names and the partition's state cache; the driver
publishes the batch (:meth:`~pidfence.spark_sink.output.Output.publish`: its manifest, then the
rejects and log tables' Delta commits) naming exactly the files of the attempts it commits. A
committed batch is immutable: a re-run of it writes nothing and returns what its manifest says
(and fails if its Kafka offsets differ).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pidfence.broker_plugin import Verifier
from pidfence.spark_sink import query_owner
from pidfence.spark_sink.authority import BatchAuthority
from pidfence.spark_sink.claims import new_tag
from pidfence.spark_sink.crash_points import crash_point
from pidfence.spark_sink.delta.commit import check_log
from pidfence.spark_sink.delta.errors import TableGone
from pidfence.spark_sink.errors import CommittedBatchMismatch, SinkError, SplitPartitionError
from pidfence.spark_sink.first_batch import check_first_batch
from pidfence.spark_sink.fold import fold
from pidfence.spark_sink.manifest import BatchManifest, PartCommit, Totals
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import NO_OWNER, Output, PartAttempt, open_output
from pidfence.spark_sink.partition_batch import process_partition
from pidfence.spark_sink.positions import INDEX_EVERY
from pidfence.spark_sink.schema import KAFKA_COLUMNS
from pidfence.spark_sink.spark_checkpoint import checkpoint_committed
from pidfence.spark_sink.state import load_state, save_state
from pidfence.wire.mac import RecordMacCheck


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """A task's commit message: its batch id, query, attempt tag and the partitions it wrote.

    ``committed`` is set when the batch was committed already (a re-run wrote nothing).
    """

    batch_id: int
    parts: list[PartCommit] = field(default_factory=list)
    query: str = NO_OWNER
    tag: str | None = None
    committed: bool = False


def _task_context() -> tuple[int, int, str]:
    """(batch id, attempt number, query id) of the running Spark task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise SinkError("write() ran outside a Spark task; the sink needs Spark's TaskContext")
    raw = ctx.getLocalProperty("streaming.sql.batchId")
    if raw is None:
        raise SinkError(
            "no streaming.sql.batchId in the task; use format('pidfence') only with writeStream"
        )
    query = ctx.getLocalProperty("sql.streaming.queryId") or NO_OWNER
    return int(raw), ctx.attemptNumber(), query


class PidfenceStreamWriter(DataSourceStreamArrowWriter):
    """Applies the broker rules per Kafka partition and publishes each batch once.

    Args:
        options: the sink's options. Their ``checkpoint`` (the query's checkpoint location),
            when known, tells whether the query committed batches already (then a missing table
            is a lost one), and, when the log table lacks the batch before a commit's own,
            whether Spark committed that batch.
        query_id: the streaming query's id when known at start (read from the checkpoint); the
            path is claimed for it before any task runs.
    """

    def __init__(self, options: SinkOptions, query_id: str | None = None) -> None:
        self.options = options
        self.query_id = query_id
        checkpoint = self.checkpoint = options.checkpoint
        # Refuses another writer's table before anything is written, and creates both tables,
        # so the first batch's tasks find them (unless the query committed batches before: then
        # a missing table is a lost one).
        output = open_output(
            options.path,
            options.rejects_path,
            query_id or NO_OWNER,
            checkpoint_committed(checkpoint),
        )
        if query_id is not None:
            # Spark builds a writer at start and again in the process that runs commit(), so
            # this only claims; leftovers of a dead attempt go when its batch commits.
            _own(output, query_id)

    def output(self, query: str = NO_OWNER) -> Output:
        """The sink's output, committing as ``query``."""
        return Output(self.options.path, self.options.rejects_path, query, epoch=self.options.epoch)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Process this task's rows (one Kafka partition, or several whole ones when the stream
        is coalesced): write each partition's files and state."""
        batch_id, attempt, query = _task_context()
        crash_point("task_start", attempt)
        message = SinkCommitMessage(batch_id, query=query)
        output = self.output(query)
        _own(output, query)
        parts = kafka_partitions(iterator)
        manifest = output.committed(batch_id)
        if manifest is not None:
            return _committed_message(manifest, parts, query)
        first = next(parts, None)
        if first is None:
            return message
        check = self.options.certificates()
        macs = self.options.record_macs()
        message.tag = new_tag(self.options.epoch)
        client = self.options.lease_client()
        try:
            for topic, partition, mine in itertools.chain([first], parts):
                verifier = None if check is None else check.for_partition(topic, partition)
                authority = None if client is None else BatchAuthority(client)
                attempt_part = PartAttempt(batch_id, message.tag, topic, partition)
                message.parts.append(
                    self._write_part(output, attempt_part, mine, verifier, macs, authority)
                )
        finally:
            if client is not None:
                client.close()
        crash_point("after_write")
        return message

    def _write_part(
        self,
        output: Output,
        part: PartAttempt,
        rows: pa.Table,
        verifier: Verifier | None,
        macs: RecordMacCheck | None,
        authority: BatchAuthority | None,
    ) -> PartCommit:
        topic, partition = part.topic, part.partition
        st = load_state(output, topic, partition, part.batch_id, self.options, verifier)
        log_start = st.next_log
        now_ms = int(time.time() * 1000)
        out = process_partition(
            rows, topic, partition, st, self.options.flush_held, macs, authority, now_ms
        )
        files = output.stage_part(part, {"log": out.log, "rejects": out.rejects, "held": out.held})
        state = save_state(output.own, topic, partition, part.batch_id, st, self.options, part.tag)
        offsets = rows.column("offset")
        return PartCommit(
            topic=topic,
            partition=partition,
            rows_in=out.rows_in,
            appended=out.log.num_rows,
            rejected=out.rejects.num_rows,
            log_start=log_start,
            log_end=st.next_log,
            kafka_first=int(pc.min(offsets).as_py()),
            kafka_last=int(pc.max(offsets).as_py()),
            counts=out.counts,
            state=state,
            tag=part.tag,
            files=files,
            held=out.held.num_rows,
            flushed=out.flushed,
            forged=out.forged,
            prev=st.last_batch,
            gaps=tuple(out.gaps),
            horizon_ms=out.horizon_ms,
            producers=len(st.table),
            state_bytes=st.state_bytes,
            answers=out.answers,
            rules=out.rules or {},
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the batch; a repeat changes nothing."""
        parts: dict[tuple[str, int], PartCommit] = {}
        ours: list[SinkCommitMessage] = []
        for message in messages:
            if message is None:
                continue
            if not isinstance(message, SinkCommitMessage):
                raise SinkError(f"batch {batchId}: unexpected commit message {message!r}")
            ours.append(message)
            for part in message.parts:
                key = (part.topic, part.partition)
                if key in parts:
                    raise SplitPartitionError(
                        f"batch {batchId}: {part.topic}[{part.partition}] was written by two "
                        "tasks; nothing was published. Do not set the Kafka source's "
                        "minPartitions or maxRecordsPerPartition with the pidfence sink."
                    )
                parts[key] = part
        query = next((m.query for m in ours), self.query_id or NO_OWNER)
        output = self.output(query)
        manifest = output.committed(batchId)
        holds = output.committed_version()
        lacking = (
            manifest is None
            and holds < batchId - 1
            and checkpoint_committed(self.checkpoint, batchId - 1)
        )
        if lacking:
            # Spark committed batches of this query that the log table lacks (every batch
            # commits to it; a RESTORE keeps the query's transaction). A table with no log is
            # named gone; else it was replaced, or a copy older than them put back.
            check_log(output.log, 0)
            raise TableGone.replaced(output.log.uri, query, holds, batchId - 1)
        if manifest is None and batchId == 0:
            check_first_batch(self.options, parts.values())
        crash_point("before_manifest")
        if manifest is None:
            ordered = tuple(parts[k] for k in sorted(parts))
            # The totals so far come from the previous committed batch: a re-run of a
            # committed batch never gets here, so nothing is counted twice.
            prev = output.last_committed_before(batchId)
            last = None if prev is None else output.committed(prev)
            before = Totals() if last is None else last.totals
            totals = before.plus(ordered, int(time.time() * 1000))
            manifest = BatchManifest(batchId, query, ordered, totals, self.options.epoch)
            manifest = output.publish(manifest)
        crash_point("after_manifest")
        if batchId and batchId % INDEX_EVERY == 0:
            output.write_index(batchId)
            fold(output, batchId, self.options.retain_batches)
        output.discard(batchId, manifest.named())

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove the files this batch's attempts wrote that no table or intent names.

        Only the output's owner query cleans up: a query refused as another's (its tasks raised
        :class:`~pidfence.spark_sink.errors.OutputOwnedError`) shares the owner's epoch and
        batch numbers, and would delete the owner's staged files. Cleanup is never needed for
        safety: what an abort leaves, the batch's commit or ``sink vacuum`` removes.
        """
        query = next(
            (m.query for m in messages if isinstance(m, SinkCommitMessage)),
            self.query_id or NO_OWNER,
        )
        output = self.output(query)
        if query_owner.owner_of(output.own) not in (None, query):
            return
        # A manifest written before the failure is the batch's intent: a re-run commits the
        # files it names, so they stay.
        intent = output.intent(batchId)
        output.discard(batchId, set() if intent is None else intent.named())


def _own(output: Output, query: str) -> None:
    """:func:`query_owner.take_ownership`, reading the owner record first: a task and every
    batch's writer take the path, and all but the first find it theirs (no temporary file, no
    fsync)."""
    if query_owner.owner_of(output.own) != query:
        query_owner.take_ownership(output.own, query)


def kafka_partitions(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[str, int, pa.Table]]:
    """``(topic, partition, rows)`` per Kafka partition of a task's rows, the Kafka source's
    columns only, in the order the task reads them.

    A task reads its partitions one after the other (one partition, or several whole ones when
    the stream is coalesced), so each partition's rows are consecutive: a partition is handed
    over when the next one starts, and the task holds one partition's rows at a time.

    Raises:
        SplitPartitionError: a partition's rows came back after another's (the stream was
            shuffled, e.g. repartitioned, rather than coalesced).
    """
    key: tuple[str, int] | None = None
    pending: list[pa.RecordBatch] = []
    seen: set[tuple[str, int]] = set()
    for arrived in batches:
        if not arrived.num_rows:
            continue
        batch = arrived.select([c for c in KAFKA_COLUMNS if c in arrived.schema.names])
        for run, piece in _runs(batch):
            if run == key:
                pending.append(piece)
                continue
            if key is not None:
                yield (*key, pa.Table.from_batches(pending))
            if run in seen:
                raise SplitPartitionError(
                    f"the rows of {run[0]}[{run[1]}] are not consecutive in this task; nothing "
                    "was published. Coalesce the Kafka stream (narrow) rather than repartition "
                    "it: the sink needs each partition whole and in order in one task."
                )
            seen.add(run)
            key, pending = run, [piece]
    if key is not None:
        yield (*key, pa.Table.from_batches(pending))


def _runs(batch: pa.RecordBatch) -> Iterator[tuple[tuple[str, int], pa.RecordBatch]]:
    """The batch cut where its (topic, partition) changes, each piece with its key."""
    topics = batch.column(batch.schema.get_field_index("topic"))
    partitions = batch.column(batch.schema.get_field_index("partition")).to_numpy(
        zero_copy_only=False
    )
    change = partitions[1:] != partitions[:-1]
    if pc.count_distinct(topics).as_py() > 1:
        change |= pc.not_equal(topics[1:], topics[:-1]).to_numpy(zero_copy_only=False)
    starts = [0, *(np.flatnonzero(change) + 1).tolist(), batch.num_rows]
    for start, end in itertools.pairwise(starts):
        key = (str(topics[start].as_py()), int(partitions[start]))
        yield key, batch.slice(start, end - start)


def _committed_message(
    manifest: BatchManifest, parts: Iterator[tuple[str, int, pa.Table]], query: str
) -> SinkCommitMessage:
    """A re-run of a committed batch: check its offsets, write nothing, return the manifest's.

    The re-run may hold fewer of the batch's records than it committed, never others: Kafka's
    retention (or compaction) may have deleted some since, and with ``failOnDataLoss=false``
    Spark re-runs the batch over what is left (writing nothing, as for any committed batch)."""
    batch_id = manifest.batch
    message = SinkCommitMessage(batch_id, query=query, committed=True)
    for topic, partition, rows in parts:
        offsets = rows.column("offset")
        part = manifest.part(topic, partition)
        seen = (int(pc.min(offsets).as_py()), int(pc.max(offsets).as_py()), rows.num_rows)
        want = None if part is None else (part.kafka_first, part.kafka_last, part.rows_in)
        within = part is not None and part.kafka_first <= seen[0] and seen[1] <= part.kafka_last
        if part is None or not within or seen[2] > part.rows_in:
            raise CommittedBatchMismatch(
                f"batch {batch_id} is committed, but Spark re-ran it for {topic}[{partition}] "
                f"with Kafka offsets {seen[0]}..{seen[1]} ({seen[2]} records) where its manifest "
                f"has {'nothing' if want is None else f'{want[0]}..{want[1]} ({want[2]} records)'}"
                "; the checkpoint does not belong to this output path. Nothing was written."
            )
        message.parts.append(part)
    return message
