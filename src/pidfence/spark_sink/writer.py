"""The streaming writer: ``write()`` on executors, ``commit()``/``abort()`` on the driver.

The commit protocol (docs/sink.md, "Recovery model"): a task stages its partition's log, rejects
and held records under attempt-unique names and writes the partition's state cache; the driver
publishes one manifest per batch, create-if-absent, naming exactly the files of the attempts it
commits. A committed batch is immutable: a re-run of it writes nothing and returns what its
manifest says (and fails if its Kafka offsets differ). The storage steps go through a
:class:`~pidfence.spark_sink.layout.BatchLayout`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pidfence.broker_plugin import Verifier
from pidfence.spark_sink import owner
from pidfence.spark_sink.authority import BatchAuthority
from pidfence.spark_sink.delta.layout import DeltaLayout, open_layout
from pidfence.spark_sink.errors import (
    CommittedBatchMismatch,
    SinkError,
    SplitPartitionError,
)
from pidfence.spark_sink.faults import crash_point
from pidfence.spark_sink.layout import (
    INDEX_EVERY,
    MANIFEST_VERSION,
    QUERY_PREFIX,
    ParquetLayout,
    PartAttempt,
    new_tag,
)
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.process import by_partition, process_partition
from pidfence.spark_sink.schema import KAFKA_COLUMNS
from pidfence.spark_sink.state import load_state, save_state
from pidfence.spark_sink.storage import DATA, DECIDED, HELD, Store, manifest_ids, part_name
from pidfence.wire.mac import RecordMacCheck

#: Query id used when Spark gives none (only outside structured streaming, i.e. in unit tests).
NO_QUERY = "noquery0"


@dataclass(frozen=True)
class PartCommit:
    """What one task wrote for one (topic, partition) of a batch (one manifest part)."""

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
    tag: str = ""
    files: dict[str, str | None] = field(default_factory=dict)
    held: int = 0
    flushed: bool = False
    forged: dict[str, int] = field(default_factory=dict)
    prev: int | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)
    horizon_ms: int | None = None
    stats: dict[str, str] = field(default_factory=dict)
    #: The lease servers' answers of the batch (None: without them) and its rules' settings.
    answers: dict[str, list[Any]] | None = None
    rules: dict[str, Any] = field(default_factory=dict)

    def manifest_entry(self) -> dict[str, Any]:
        """This part as stored in the manifest (``gaps``, ``horizon_ms``, ``answers``,
        ``rules`` and ``stats`` only when set)."""
        extra: dict[str, Any] = {}
        if self.gaps:
            extra["gaps"] = self.gaps
        if self.horizon_ms is not None:
            extra["horizon_ms"] = self.horizon_ms
        if self.answers is not None:
            extra["answers"] = self.answers
        if self.rules:
            extra["rules"] = self.rules
        if self.stats:
            extra["stats"] = self.stats
        return {
            **extra,
            "topic": self.topic,
            "partition": self.partition,
            "rows_in": self.rows_in,
            "appended": self.appended,
            "rejected": self.rejected,
            "held": self.held,
            "log_start": self.log_start,
            "log_end": self.log_end,
            "kafka_first": self.kafka_first,
            "kafka_last": self.kafka_last,
            "counts": dict(sorted(self.counts.items())),
            "forged": dict(sorted(self.forged.items())),
            "flushed": self.flushed,
            "state": self.state_file,
            "tag": self.tag,
            "files": self.files,
            "prev": self.prev,
        }

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> PartCommit:
        """A manifest part back as a :class:`PartCommit`."""
        return cls(
            topic=str(entry["topic"]),
            partition=int(entry["partition"]),
            rows_in=int(entry["rows_in"]),
            appended=int(entry["appended"]),
            rejected=int(entry["rejected"]),
            log_start=int(entry["log_start"]),
            log_end=int(entry["log_end"]),
            kafka_first=int(entry["kafka_first"]),
            kafka_last=int(entry["kafka_last"]),
            counts=dict(entry["counts"]),
            state_file=str(entry.get("state", "")),
            tag=str(entry.get("tag", "")),
            files=dict(entry.get("files") or {}),
            held=int(entry.get("held", 0)),
            flushed=bool(entry.get("flushed", False)),
            forged=dict(entry.get("forged") or {}),
            prev=entry.get("prev"),
            gaps=list(entry.get("gaps") or []),
            horizon_ms=entry.get("horizon_ms"),
            stats=dict(entry.get("stats") or {}),
            answers=entry.get("answers"),
            rules=dict(entry.get("rules") or {}),
        )


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """A task's commit message: its batch id, query, attempt tag and the partitions it wrote.

    ``committed`` is set when the batch already had a manifest (a re-run wrote nothing).
    """

    batch_id: int
    parts: list[PartCommit] = field(default_factory=list)
    query: str = NO_QUERY
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
    query = ctx.getLocalProperty("sql.streaming.queryId") or NO_QUERY
    return int(raw), ctx.attemptNumber(), query


class PidfenceStreamWriter(DataSourceStreamArrowWriter):
    """Applies the broker rules per Kafka partition and publishes one manifest per batch.

    Args:
        options: the sink's options.
        query_id: the streaming query's id when known at start (read from the checkpoint); the
            path is claimed for it before any task runs.
        committed_before: the checkpoint says the query committed batches already.
    """

    def __init__(
        self, options: SinkOptions, query_id: str | None = None, committed_before: bool = False
    ) -> None:
        self.options = options
        self.query_id = query_id
        # Refuses another writer's table before anything is written, and creates both tables,
        # so the first batch's tasks find them (unless the query committed batches before: then
        # a missing table is a lost one).
        query = query_id or NO_QUERY
        open_layout(options.path, options.rejects_path, query, committed_before=committed_before)
        if query_id is not None:
            # Spark builds a writer at start and again in the process that runs commit(), so
            # this only claims; leftovers of a dead attempt go when its batch commits.
            _claim(self.layout(query_id).store, query_id)

    def layout(self, query: str = NO_QUERY) -> DeltaLayout:
        """The storage layout of this sink, committing as ``query``."""
        return DeltaLayout(self.options.path, self.options.rejects_path, query)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Process this task's rows (one Kafka partition) and stage data, rejects and state."""
        batch_id, attempt, query = _task_context()
        crash_point("task_start", attempt)
        batches = list(iterator)
        message = SinkCommitMessage(batch_id, query=query)
        layout = self.layout(query)
        _claim(layout.store, query)
        rows = _kafka_rows(batches)
        manifest = layout.committed(batch_id)
        if manifest is not None:
            return _committed_message(manifest, rows, batch_id, query)
        if rows is None or rows.num_rows == 0:
            return message
        check = self.options.certificates()
        macs = self.options.record_macs()
        message.tag = new_tag(query)
        client = self.options.lease_client()
        try:
            for topic, partition, mine in by_partition(rows):
                verifier = None if check is None else check.for_partition(topic, partition)
                authority = None if client is None else BatchAuthority(client)
                message.parts.append(
                    self._write_partition(
                        layout,
                        batch_id,
                        message.tag,
                        topic,
                        partition,
                        mine,
                        verifier,
                        macs,
                        authority,
                    )
                )
        finally:
            if client is not None:
                client.close()
        crash_point("after_write")
        return message

    def _write_partition(
        self,
        layout: DeltaLayout,
        batch_id: int,
        tag: str,
        topic: str,
        partition: int,
        rows: pa.Table,
        verifier: Verifier | None,
        macs: RecordMacCheck | None = None,
        authority: BatchAuthority | None = None,
    ) -> PartCommit:
        store = layout.store
        st = load_state(layout, store, topic, partition, batch_id, self.options, verifier)
        log_start = st.next_log
        out = process_partition(
            rows,
            topic,
            partition,
            st,
            self.options.flush_held,
            macs,
            authority,
            int(time.time() * 1000),
        )
        files = layout.stage_part(
            PartAttempt(batch_id, tag, topic, partition),
            {"log": out.log, "rejects": out.rejects, "held": out.held},
        )
        state_file = save_state(store, topic, partition, batch_id, st, self.options, tag)
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
            state_file=state_file,
            tag=tag,
            files=files.as_dict(),
            held=out.held.num_rows,
            flushed=out.flushed,
            forged=out.forged,
            prev=st.last_batch,
            gaps=[g.to_dict() for g in out.gaps],
            horizon_ms=out.horizon_ms,
            stats=files.stats,
            answers=out.answers,
            rules=out.rules or {},
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the batch's manifest (create-if-absent); a repeat changes nothing."""
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
        query = next((m.query for m in ours), self.query_id or NO_QUERY)
        layout = self.layout(query)
        manifest = layout.committed(batchId)
        crash_point("before_manifest")
        if manifest is None:
            manifest = {
                "version": MANIFEST_VERSION,
                "batch": batchId,
                "query": query,
                "parts": [parts[k].manifest_entry() for k in sorted(parts)],
            }
            if not layout.publish(batchId, manifest):
                manifest = layout.committed(batchId) or manifest
        crash_point("after_manifest")
        if batchId and batchId % INDEX_EVERY == 0:
            layout.write_index(batchId)
        keep = {f for p in manifest["parts"] for f in (p.get("files") or {}).values() if f}
        for prefix in {_prefix(m.query) for m in ours}:
            layout.discard(batchId, prefix, keep)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Remove the files this batch's attempts staged; nothing of it was ever visible."""
        query = next((m.query for m in messages if isinstance(m, SinkCommitMessage)), NO_QUERY)
        layout = self.layout(query)
        if layout.committed(batchId) is not None:
            return
        for message in messages:
            if isinstance(message, SinkCommitMessage) and message.tag:
                layout.discard(batchId, message.tag, keep=set())


def _claim(store: Store, query: str) -> None:
    """:func:`owner.claim`, reading the owner record first: a task and every batch's writer
    claim the path, and all but the first find it theirs (no temporary file, no fsync)."""
    if owner.owner_of(store) != query:
        owner.claim(store, query)


def _kafka_rows(batches: list[pa.RecordBatch]) -> pa.Table | None:
    """The task's rows, the Kafka source's columns only (None for no batches)."""
    if not batches:
        return None
    rows = pa.Table.from_batches(batches)
    return rows.select([c for c in KAFKA_COLUMNS if c in rows.column_names])


def _prefix(query_id: str) -> str:
    return new_tag(query_id)[:QUERY_PREFIX]


def _committed_message(
    manifest: dict[str, Any], rows: pa.Table | None, batch_id: int, query: str
) -> SinkCommitMessage:
    """A re-run of a committed batch: check its offsets, write nothing, return the manifest's."""
    by_key = {(p["topic"], int(p["partition"])): p for p in manifest["parts"]}
    message = SinkCommitMessage(batch_id, query=query, committed=True)
    if rows is None or rows.num_rows == 0:
        return message
    keys = rows.group_by(["topic", "partition"]).aggregate(
        [("offset", "min"), ("offset", "max"), ("offset", "count")]
    )
    for row in keys.to_pylist():
        key = (str(row["topic"]), int(row["partition"]))
        part = by_key.get(key)
        seen = (int(row["offset_min"]), int(row["offset_max"]), int(row["offset_count"]))
        want = (
            None
            if part is None
            else (int(part["kafka_first"]), int(part["kafka_last"]), int(part["rows_in"]))
        )
        if seen != want:
            raise CommittedBatchMismatch(
                f"batch {batch_id} is committed, but Spark re-ran it for {key[0]}[{key[1]}] with "
                f"Kafka offsets {seen[0]}..{seen[1]} ({seen[2]} records) where its manifest has "
                f"{'nothing' if want is None else f'{want[0]}..{want[1]} ({want[2]} records)'}; "
                "the checkpoint does not belong to this output path. Nothing was written."
            )
        message.parts.append(PartCommit.from_entry(part))  # type: ignore[arg-type]
    return message


def cleanup_uncommitted(
    store: Store,
    rejects: Store,
    query_id: str | None = None,
    committed_ids: list[int] | None = None,
) -> list[int]:
    """Delete the files of batches that are not committed; returns their batch ids.

    Only files that cannot belong to another query's in-flight batch are touched: with
    ``query_id``, that query's own files; without it, everything uncommitted only when no query
    owns the path (a path with an owner is cleaned by its owner at start and after each commit).

    Args:
        store: the layout's own root (``P``; ``P/_pidfence`` for the Delta layout).
        rejects: the rejects' own root (``R``; ``R/_pidfence`` for the Delta layout).
        query_id: clean only this query's files.
        committed_ids: the committed batches (default: every batch with a manifest, which is
            the manifest layout's rule; the Delta layout passes its transaction-id view).
    """
    current = owner.owner_of(store)
    if query_id is None and current is not None:
        return []
    prefix = _prefix(query_id) if query_id is not None else ""
    committed = set(manifest_ids(store) if committed_ids is None else committed_ids)
    layout = ParquetLayout.of(store, rejects)
    seen: set[int] = set()
    for root, folder in ((store, DATA), (store, HELD), (store, DECIDED), (rejects, "")):
        for name in root.listdir(root.join(folder) if folder else root.root):
            if name.isdigit() and int(name) not in committed:
                seen.add(int(name))
    for b in sorted(seen):
        layout.discard(b, prefix, keep=set())
    return sorted(seen)


def part_key(part: dict[str, Any]) -> str:
    """``TOPIC~PART`` of a manifest part."""
    return part_name(part["topic"], int(part["partition"]))
