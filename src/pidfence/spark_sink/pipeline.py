"""Driver-side helpers: Kafka source → ``format("pidfence")``, run, summarise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.storage import Store, manifest_ids, read_manifest

#: Kafka source options that split one topic-partition across tasks (forbidden: DESIGN §7).
SPLITTING_OPTIONS = frozenset({"minpartitions", "maxrecordsperpartition"})


@dataclass
class SinkRunSummary:
    """What a run committed (from the manifests it published)."""

    batches: list[int] = field(default_factory=list)
    records_in: int = 0
    appended: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def add_manifest(self, manifest: Mapping[str, Any]) -> None:
        """Account one committed batch."""
        self.batches.append(int(manifest["batch"]))
        for part in manifest["parts"]:
            self.records_in += int(part["rows_in"])
            self.appended += int(part["appended"])
            for verdict, n in part["counts"].items():
                if verdict not in ("APPENDED", "NON_IDEMPOTENT"):
                    self.dropped[verdict] = self.dropped.get(verdict, 0) + int(n)


def summarise(output: str, after: int = -1) -> SinkRunSummary:
    """Summary of the batches committed with id > ``after``."""
    store = Store.at(output)
    summary = SinkRunSummary()
    for bid in manifest_ids(store):
        if bid > after:
            summary.add_manifest(read_manifest(store, bid))
    return summary


def build_query(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    *,
    available_now: bool = True,
    trigger_seconds: float | None = None,
    starting_offsets: str = "earliest",
    sink_options: Mapping[str, str] | None = None,
    kafka_options: Mapping[str, str] | None = None,
) -> Any:
    """A ready ``DataStreamWriter`` from a Kafka topic into the pidfence sink (not started).

    Args:
        spark: the SparkSession.
        bootstrap: Kafka bootstrap servers.
        topic: the topic (or comma-separated topics) to read.
        output: the sink's ``path``.
        checkpoint: Spark's checkpoint location (keep it with the output).
        available_now: process what is in the topic, then stop.
        trigger_seconds: micro-batch interval when not ``available_now``.
        starting_offsets: the Kafka source's ``startingOffsets`` for a new checkpoint.
        sink_options: extra sink options (``lifetime``, ``capacity``, ``reorderWindow`` …).
        kafka_options: extra Kafka source options (not ``minPartitions`` or
            ``maxRecordsPerPartition``: they split a partition across tasks).

    Raises:
        SinkOptionError: a forbidden Kafka option.
    """
    from pidfence.spark_sink import register

    bad = sorted(k for k in (kafka_options or {}) if k.lower() in SPLITTING_OPTIONS)
    if bad:
        raise SinkOptionError(
            f"Kafka source options {bad} split a partition across tasks, which breaks per-"
            "partition ordering; remove them (the sink maps one Kafka partition to one task)"
        )
    register(spark)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
    )
    for key, value in (kafka_options or {}).items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.format("pidfence")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .queryName(f"pidfence-sink-{topic}")
    )
    for key, value in (sink_options or {}).items():
        writer = writer.option(key, value)
    if available_now:
        return writer.trigger(availableNow=True)
    if trigger_seconds is not None:
        return writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer


def start_sink(spark: Any, bootstrap: str, topic: str, output: str, checkpoint: str,
               **kwargs: Any) -> Any:  # fmt: skip
    """Clean files of uncommitted batches, then start the query (see :func:`build_query`)."""
    from pidfence.spark_sink.options import SinkOptions
    from pidfence.spark_sink.writer import cleanup_uncommitted

    opts = SinkOptions.parse({"path": output, **(kwargs.get("sink_options") or {})})
    cleanup_uncommitted(Store.at(opts.path), Store.at(opts.rejects_path))
    return build_query(spark, bootstrap, topic, output, checkpoint, **kwargs).start()


def run_sink(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    available_now: bool = True,
    **kwargs: Any,
) -> SinkRunSummary:
    """Run the sink to completion (``available_now``) and summarise what it committed."""
    before = max(manifest_ids(Store.at(output)), default=-1)
    query = start_sink(
        spark, bootstrap, topic, output, checkpoint, available_now=available_now, **kwargs
    )
    query.awaitTermination()
    return summarise(output, after=before)
