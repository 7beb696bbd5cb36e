"""Driver-side helpers: Kafka source → ``format("pidfence")``, claim, run, and report each batch
(the lines and totals: :mod:`~pidfence.spark_sink.batch_report`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pidfence.spark_sink.batch_report import BatchLine, BatchWatcher, SinkRunSummary, summarise
from pidfence.spark_sink.claims import Claim, OutputClaim, claim_output
from pidfence.spark_sink.errors import SinkOptionError, store_failed
from pidfence.spark_sink.failure import failure_of
from pidfence.spark_sink.output import Output

if TYPE_CHECKING:  # prometheus_client and Kafka's client load when metrics are asked for
    from pidfence.spark_sink.metrics import SinkMetrics

#: Spark settings for a session that runs the sink: bigger Arrow batches to the Python writer
#: than Spark's default 10k rows, fewer round trips per task (see bench/sink.py).
SESSION_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "100000"}

#: Kafka source options that split one topic-partition across tasks (forbidden: DESIGN §7).
SPLITTING_OPTIONS = frozenset({"minpartitions", "maxrecordsperpartition"})

log = logging.getLogger(__name__)


def _cores(spark: Any) -> int:
    """Spark's default parallelism (0 when the session does not say: Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, NotImplementedError):  # Spark Connect has no SparkContext
        return 0


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
    allow_data_loss: bool = False,
    tasks: int | None = None,
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
        allow_data_loss: continue past Kafka offsets that are gone (retention during downtime;
            the source's ``failOnDataLoss=false``); the sink reports them as an ``offsets`` gap
            and adopts the producers it meets there. Default: the query fails.
        tasks: Spark tasks per batch. The Kafka source makes one per partition, and every task
            of a Python writer pays a round trip to a Python worker (at 64 partitions and small
            batches more than the sink's own work); the partitions are coalesced into this many
            tasks, each partition whole in one. None (default): Spark's default parallelism,
            the cores the application has; 0: one task per partition.

    Raises:
        SinkOptionError: a forbidden Kafka option, or a trigger with ``available_now``.
    """
    from pidfence.spark_sink.session import register

    bad = sorted(k for k in (kafka_options or {}) if k.lower() in SPLITTING_OPTIONS)
    if bad:
        raise SinkOptionError(
            f"Kafka source options {bad} split a partition across tasks, which breaks per-"
            "partition ordering; remove them (the sink maps one Kafka partition to one task)"
        )
    if available_now and trigger_seconds is not None:
        raise SinkOptionError(
            "available_now (--available-now) runs one pass; trigger_seconds (--trigger) paces a "
            "query that runs until stopped: give one of them"
        )
    register(spark)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "false" if allow_data_loss else "true")
    )
    for key, value in (kafka_options or {}).items():
        reader = reader.option(key, value)
    stream = reader.load()
    if tasks is None:
        tasks = _cores(spark)
    if tasks:
        # Narrow: a task reads its Kafka partitions one after the other, each one whole.
        stream = stream.coalesce(tasks)
    writer = (
        stream.writeStream.format("pidfence")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .option("startingOffsets", starting_offsets)
        .queryName(f"pidfence-sink-{topic}")
    )
    for key, value in (sink_options or {}).items():
        writer = writer.option(key, value)
    if available_now:
        return writer.trigger(availableNow=True)
    if trigger_seconds is not None:
        return writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer


def start_sink(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    *,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    metrics: SinkMetrics | None = None,
    **kwargs: Any,
) -> Any:
    """Check the output, claim it, open it, then start the query (see :func:`build_query`)
    and return it (a ``StreamingQuery``).

    While another sink instance holds the output, this call blocks as a standby until that
    instance stops or its claim lapses (:mod:`~pidfence.spark_sink.claims`), logging who holds
    it. The claim is renewed while the query runs and released when it stops; if a newer
    instance takes the output over, the query is stopped (its next commit would be refused
    anyway).

    Args:
        metrics_port: serve the sink's Prometheus metrics (``/metrics``) from this process on
            this port (0: a free one, logged), until the process ends.
        metrics_host: the address to serve them on: loopback unless told otherwise.
        metrics: metrics already served (``pidfence sink`` binds before Spark starts).
        kwargs: as :func:`build_query`'s (``sink_options`` among them).
    """
    started = _start(
        spark,
        bootstrap,
        topic,
        output,
        checkpoint,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        metrics=metrics,
        **kwargs,
    )
    return None if started is None else started.query  # None only when stopped on standby


def _start(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    *,
    on_standby: Callable[[Claim], None] = lambda claim: None,
    stop: threading.Event | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    metrics: SinkMetrics | None = None,
    **kwargs: Any,
) -> Started | None:
    """:func:`start_sink`, returning the claim too (None: ``stop`` was set while on standby)."""
    from pidfence.spark_sink.metrics import SinkMetrics
    from pidfence.spark_sink.options import SinkOptions
    from pidfence.spark_sink.output import NO_OWNER, open_output
    from pidfence.spark_sink.preflight import check_output
    from pidfence.spark_sink.spark_checkpoint import checkpoint_committed

    sink_options = dict(kwargs.pop("sink_options", None) or {})
    opts = SinkOptions.parse({"path": output, **sink_options})
    # Refuses what the query would refuse (another writer's table, another table format, a
    # lost table, another query's path) before Spark starts it.
    checked = check_output(opts, checkpoint)
    claim = claim_output(checked.own, opts.claim_lapse_ms / 1000, on_standby, stop)
    if claim is None:
        return None
    try:
        try:  # read once the claim is held: a standby's wait may have seen months of batches
            before = Output.reading(output).committed_version()
            open_output(opts.path, opts.rejects_path, NO_OWNER, checkpoint_committed(checkpoint))
        except OSError as exc:
            raise store_failed(output, "reading and opening it after the claim", exc) from exc
        if metrics is None and metrics_port is not None:
            topics = [t.strip() for t in topic.split(",") if t.strip()]
            starting = kwargs.get("starting_offsets", "earliest")
            metrics = SinkMetrics(output, bootstrap, topics, checkpoint, starting_offsets=starting)
            log.info("sink metrics on %s", metrics.serve(metrics_port, metrics_host))
        sink_options["epoch"] = str(claim.epoch)
        query = build_query(
            spark, bootstrap, topic, output, checkpoint, sink_options=sink_options, **kwargs
        ).start()
    except BaseException:
        _release(claim)  # a store that is down: the error above is the one to report
        raise
    claim.watch(query)
    if metrics is not None:
        metrics.watch(query)
    return Started(query, claim, before)


class Started(NamedTuple):
    """A query :func:`_start` started: the query, its claim on the output, and the newest batch
    committed before it (reports and summaries start after it)."""

    query: Any
    claim: OutputClaim
    before: int


def _release(claim: OutputClaim) -> None:
    """Give the output up; a store that does not answer leaves the claim to lapse instead, so
    the failure that ended the run (often that same store) is the one reported."""
    try:
        claim.release()
    except OSError as exc:
        log.warning("the claim on the output was not released (it lapses): %s", exc)


def run_sink(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    **kwargs: Any,
) -> SinkRunSummary:
    """Run the sink to completion (``available_now``, the default) and summarise what it
    committed; ``kwargs`` as :func:`start_sink`'s (the metrics arguments and
    :func:`build_query`'s)."""
    started = _start(spark, bootstrap, topic, output, checkpoint, **kwargs)
    if started is None:  # no stop event is given: it waits until it holds the output
        return SinkRunSummary()
    query, claim, before = started
    try:
        query.awaitTermination()
    except Exception as exc:
        raise failure_of(claim.fenced or exc) from exc
    finally:
        _release(claim)
    if claim.fenced is not None:
        raise claim.fenced
    try:
        return summarise(output, after=before, epoch=claim.epoch)
    except OSError as exc:
        raise store_failed(output, "summing up the committed batches", exc) from exc


def serve(
    spark: Any,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    *,
    on_batch: Callable[[BatchLine], None],
    stop: threading.Event,
    poll_seconds: float = 0.5,
    on_standby: Callable[[Claim], None] = lambda claim: None,
    **kwargs: Any,
) -> SinkRunSummary:
    """Run the sink until it finishes (``available_now``) or ``stop`` is set; report each batch.

    Args:
        spark: the SparkSession.
        bootstrap: Kafka bootstrap servers.
        topic: the topic to read.
        output: the sink's ``path``.
        checkpoint: Spark's checkpoint location.
        on_batch: called once per committed batch, in order.
        stop: set it (e.g. from a signal handler) to stop the query after the running batch.
        poll_seconds: how often to look for newly committed batches.
        on_standby: called with the owner's claim if another sink instance holds the output:
            this one waits as a standby until that claim lapses (or ``stop`` is set).
        **kwargs: passed to :func:`build_query`.

    Returns:
        What the batches committed by this run add up to.

    Raises:
        PidfenceError: the query failed: the sink's own error that ended it (its ``retriable``
            says whether running again continues), else :class:`SparkQueryFailed`.
    """
    started = _start(
        spark, bootstrap, topic, output, checkpoint, on_standby=on_standby, stop=stop, **kwargs
    )
    if started is None:
        return SinkRunSummary()  # stopped while on standby
    query, claim, before = started
    watcher = BatchWatcher(output, after=before, epoch=claim.epoch)
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(poll_seconds)
            try:
                lines = watcher.poll(query)
            except OSError as exc:  # reporting only: a store that blips must not stop the query
                log.warning("could not read the committed batches (retrying): %s", exc)
                continue
            for line in lines:
                on_batch(line)
    except Exception as exc:  # Spark's exception: raise the sink's cause found in it
        with contextlib.suppress(Exception):  # the store or the JVM may be what failed
            for line in watcher.poll(query, final=True):
                on_batch(line)
        raise failure_of(claim.fenced or exc) from exc
    finally:
        with contextlib.suppress(Exception):  # a JVM that died: the failure above is the news
            if query.isActive:
                query.stop()
        _release(claim)
    try:
        error = query.exception()
    except Exception as exc:  # noqa: BLE001 - the JVM died once the query had stopped
        error = exc
    try:
        for line in watcher.poll(query, final=True):
            on_batch(line)
    except OSError as exc:
        # A failed or fenced query is what to report then: the store may be what ended it.
        if claim.fenced is None and error is None:
            raise store_failed(output, "reading the last committed batches", exc) from exc
    if claim.fenced is not None:
        raise claim.fenced
    if error is not None:
        raise failure_of(error) from error
    try:
        return summarise(output, after=before, epoch=claim.epoch)
    except OSError as exc:
        raise store_failed(output, "summing up the committed batches", exc) from exc
