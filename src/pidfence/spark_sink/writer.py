"""The streaming writer: ``write()`` on executors, ``commit()``/``abort()`` on the driver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pidfence.spark_sink.errors import InjectedFault, SinkError, SplitPartitionError
from pidfence.spark_sink.faults import crash_point, fail_first_attempt
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.process import process_partition
from pidfence.spark_sink.state import load_state, save_state, state_dir, state_files
from pidfence.spark_sink.storage import (
    DATA,
    MANIFESTS,
    Store,
    batch_name,
    manifest_ids,
    parse_part_name,
    part_name,
)

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


@dataclass(frozen=True)
class PartCommit:
    """What one task wrote for one (topic, partition) of a batch."""

    topic: str
    partition: int
    rows_in: int
    appended: int
    rejected: int
    log_start: int
    log_end: int
    kafka_first: int
    kafka_last: int
    counts: dict[str, int]
    state_file: str

    def manifest_entry(self) -> dict[str, Any]:
        """This part as stored in the manifest."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "rows_in": self.rows_in,
            "appended": self.appended,
            "rejected": self.rejected,
            "log_start": self.log_start,
            "log_end": self.log_end,
            "kafka_first": self.kafka_first,
            "kafka_last": self.kafka_last,
            "counts": dict(sorted(self.counts.items())),
            "state": self.state_file,
        }


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """A task's commit message: its batch id and the partitions it wrote."""

    batch_id: int
    parts: list[PartCommit] = field(default_factory=list)


def _task_context() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise SinkError("write() ran outside a Spark task; the sink needs Spark's TaskContext")
    raw = ctx.getLocalProperty("streaming.sql.batchId")
    if raw is None:
        raise SinkError(
            "no streaming.sql.batchId in the task; use format('pidfence') only with writeStream"
        )
    return int(raw), ctx.attemptNumber()


class PidfenceStreamWriter(DataSourceStreamArrowWriter):
    """Applies the broker rules per Kafka partition and publishes one manifest per batch."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Process this task's rows (one Kafka partition) and write data, rejects and state."""
        batch_id, attempt = _task_context()
        if fail_first_attempt(attempt):
            raise InjectedFault(f"injected failure of batch {batch_id} attempt 0 (retry passes)")
        batches = list(iterator)
        message = SinkCommitMessage(batch_id)
        if not batches or sum(b.num_rows for b in batches) == 0:
            return message
        rows = pa.Table.from_batches(batches).select(list(KAFKA_COLUMNS))
        store = Store.at(self.options.path)
        rejects_store = Store.at(self.options.rejects_path)
        keys = rows.group_by(["topic", "partition"]).aggregate([]).to_pylist()
        for key in sorted(keys, key=lambda k: (k["topic"], k["partition"])):
            topic, partition = str(key["topic"]), int(key["partition"])
            import pyarrow.compute as pc

            mine = rows.filter(
                pc.and_(pc.equal(rows["topic"], topic), pc.equal(rows["partition"], partition))
            )
            message.parts.append(
                self._write_partition(store, rejects_store, batch_id, topic, partition, mine)
            )
        crash_point("after_write")
        return message

    def _write_partition(
        self,
        store: Store,
        rejects_store: Store,
        batch_id: int,
        topic: str,
        partition: int,
        rows: pa.Table,
    ) -> PartCommit:
        st = load_state(store, topic, partition, batch_id, self.options)
        log_start = st.next_log
        out = process_partition(rows, topic, partition, st, self.options.flush_held)
        name = part_name(topic, partition) + ".parquet"
        if out.log.num_rows:
            store.write_table(store.join(DATA, batch_name(batch_id), name), out.log)
        if out.rejects.num_rows:
            rejects_store.write_table(rejects_store.join(batch_name(batch_id), name), out.rejects)
        state_file = save_state(store, topic, partition, batch_id, st, self.options)
        offsets = rows.column("offset")
        import pyarrow.compute as pc

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
            state_file=state_file,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the batch's manifest (create-if-absent); a repeat changes nothing."""
        parts: dict[tuple[str, int], PartCommit] = {}
        for message in messages:
            if message is None:
                continue
            if not isinstance(message, SinkCommitMessage):
                raise SinkError(f"batch {batchId}: unexpected commit message {message!r}")
            for part in message.parts:
                key = (part.topic, part.partition)
                if key in parts:
                    raise SplitPartitionError(
                        f"batch {batchId}: {part.topic}[{part.partition}] was written by two "
                        "tasks; nothing was published. Do not set the Kafka source's "
                        "minPartitions or maxRecordsPerPartition with the pidfence sink."
                    )
                parts[key] = part
        manifest = {
            "version": 1,
            "batch": batchId,
            "parts": [parts[k].manifest_entry() for k in sorted(parts)],
        }
        store = Store.at(self.options.path)
        crash_point("before_manifest")
        body = json.dumps(manifest, sort_keys=True, indent=1).encode()
        store.create_if_absent(store.join(MANIFESTS, batch_name(batchId) + ".json"), body)
        crash_point("after_manifest")
        cleanup_uncommitted(store, Store.at(self.options.rejects_path))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove whatever the batch's tasks wrote; nothing of it was ever visible."""
        del messages
        store = Store.at(self.options.path)
        if batchId in manifest_ids(store):
            return
        _remove_batch(store, Store.at(self.options.rejects_path), batchId)


def _remove_batch(store: Store, rejects: Store, batch_id: int) -> None:
    store.delete_dir(store.join(DATA, batch_name(batch_id)))
    rejects.delete_dir(rejects.join(batch_name(batch_id)))
    for part in store.listdir(store.join("_state")):
        topic, partition = parse_part_name(part)
        name = state_files(store, topic, partition).get(batch_id)
        if name is not None:
            store.delete_file(f"{state_dir(store, topic, partition)}/{name}")


def cleanup_uncommitted(store: Store, rejects: Store) -> list[int]:
    """Delete the files of every batch that has no manifest; returns their batch ids.

    Safe after a commit and before a query starts: Spark runs one micro-batch at a time, and a
    batch that lost its files is simply re-run from the checkpoint. One query per output path.
    """
    committed = set(manifest_ids(store))
    seen: set[int] = set()
    for name in store.listdir(store.join(DATA)) + rejects.listdir(rejects.root):
        if name.isdigit():
            seen.add(int(name))
    for part in store.listdir(store.join("_state")):
        topic, partition = parse_part_name(part)
        seen.update(state_files(store, topic, partition))
    stale = sorted(seen - committed)
    for b in stale:
        _remove_batch(store, rejects, b)
    return stale
