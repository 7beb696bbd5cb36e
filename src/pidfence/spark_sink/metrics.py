"""Prometheus metrics of a running sink, served by its driver (``pidfence sink --metrics-port``).

Every figure is read when Prometheus scrapes, from what the sink committed:

* The counters are the newest committed manifest's :class:`~.manifest.Totals`, which each batch
  carries for itself and every batch before it. A batch re-run after a crash commits nothing new,
  and a restarted sink starts from the committed totals: nothing is counted twice, nor from zero.
* The per-partition gauges (live producers, state bytes, held records) are each partition's
  newest committed part: the positions index once (:meth:`~.output.Output.positions`), then one
  manifest per new batch.
* Lag is Kafka's high watermark, asked at the scrape (:mod:`.lag`), minus the next offset the
  sink reads.
* The batch histograms come from Spark's own progress of the watched query (:mod:`.progress`);
  like any histogram they count what this process saw.

Only the driver can serve them: Spark runs the sink's ``write()`` and ``commit()`` in Python
workers that come and go.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from deltalake.exceptions import DeltaError
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.lag import KafkaWatermarks, Watermarks, partition_lag
from pidfence.spark_sink.manifest import PartCommit, Totals
from pidfence.spark_sink.output import Output
from pidfence.spark_sink.positions import INDEX_EVERY
from pidfence.spark_sink.progress import progress_by_batch
from pidfence.spark_sink.spark_checkpoint import start_offsets
from pidfence.wire import PidfenceError, Verdict

#: Every verdict that keeps a record out of the log: the label values of the rejected counter.
REJECTED: Final = tuple(v.name for v in Verdict if v.final and not v.appended)
#: Gap kinds always exported (a kind met later is added); ``filled`` has its own counter.
GAP_KINDS: Final = ("head", "lost", "offsets")
FILLED: Final = "filled"
SECONDS_BUCKETS: Final = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
RECORDS_BUCKETS: Final = (10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7)
#: Where a scrape could not read: the label values of the errors counter.
SOURCES: Final = ("kafka", "output", "spark")
#: What reading the committed output may raise (a damaged ``_pidfence/``, a store outage).
_OUTPUT_ERRORS: Final = (PidfenceError, DeltaError, OSError, ValueError)

log = logging.getLogger(__name__)


class SinkMetrics(Collector):
    """The metrics of the sink writing ``output``, on their own registry.

    Args:
        output: the sink's ``path``.
        bootstrap: Kafka bootstrap servers (for the watermarks).
        topics: the topics the sink reads.
        checkpoint: the query's checkpoint, and ``starting_offsets`` its ``startingOffsets``:
            where a partition no committed batch read yet starts (for its lag; as
            :func:`~.spark_checkpoint.start_offsets` says).
        starts: those start offsets when already known (``pidfence sink`` asks Kafka anyway).
        watermarks: asks Kafka for the watermarks (tests give a fake).
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        output: str,
        bootstrap: str,
        topics: Sequence[str],
        checkpoint: str,
        *,
        starting_offsets: str = "earliest",
        starts: Mapping[tuple[str, int], int] | None = None,
        watermarks: Callable[[], Watermarks | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.output = output.rstrip("/")
        self._watermarks = watermarks or KafkaWatermarks(bootstrap, topics)
        self._checkpoint, self._starting = checkpoint, starting_offsets
        self._starts = None if starts is None else dict(starts)
        self._clock = clock
        self._lock = threading.Lock()
        self._last = -1
        self._totals = Totals()
        self._parts: dict[tuple[str, int], PartCommit] = {}
        self._query: Any = None
        self._progress_last = -1
        self._errors = dict.fromkeys(SOURCES, 0)
        self._server: Any = None
        # The histograms are collected by this collector, after the scrape's refresh (registered
        # apart, they were collected before it: a scrape showed the batches of the one before).
        self.batch_seconds = Histogram(
            "pidfence_sink_batch_duration_seconds",
            "Wall time of each micro-batch (Spark's triggerExecution)",
            buckets=SECONDS_BUCKETS,
            registry=None,
        )
        self.batch_records = Histogram(
            "pidfence_sink_batch_records",
            "Kafka records read by each micro-batch",
            buckets=RECORDS_BUCKETS,
            registry=None,
        )
        self.registry = CollectorRegistry()
        self.registry.register(self)

    # ------------------------------------------------------------------------- lifecycle

    def serve(self, port: int, host: str = "127.0.0.1") -> str:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) in a daemon thread.

        Returns:
            The endpoint's URL.

        Raises:
            SinkOptionError: the address cannot be bound.
        """
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise SinkOptionError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                "pick another --metrics-port"
            ) from None
        return f"http://{host}:{self._server.server_port}/metrics"

    def watch(self, query: Any) -> None:
        """Take batch durations and sizes from this streaming query's progress."""
        with self._lock:
            self._query, self._progress_last = query, -1

    def close(self) -> None:
        """Stop serving and close the Kafka client (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        close = getattr(self._watermarks, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------------- reading

    def _refresh_output(self) -> None:
        """Catch up with the batches committed since the last scrape."""
        output = Output.reading(self.output)
        version = output.committed_version()
        if version <= self._last:
            return
        if self._last < 0 or version - self._last > INDEX_EVERY:
            positions = output.positions(version)
            self._parts = {(p.part.topic, p.part.partition): p.part for p in positions.values()}
            batches = [version]
        else:
            batches = list(range(self._last + 1, version + 1))
        for batch in batches:
            manifest = output.committed(batch)
            if manifest is None:
                return
            self._parts.update({(p.topic, p.partition): p for p in manifest.parts})
            self._totals, self._last = manifest.totals, batch

    def _refresh_progress(self) -> None:
        if self._query is None:
            return
        for batch, seen in sorted(progress_by_batch(self._query).items()):
            if batch > self._progress_last:
                self._progress_last = batch
                self.batch_records.observe(seen.rows)
                if seen.seconds is not None:
                    self.batch_seconds.observe(seen.seconds)

    def _lag(self) -> dict[tuple[str, int], int] | None:
        marks = self._watermarks()
        if marks is None:
            self._errors["kafka"] += 1
            return None
        if self._starts is None:
            self._starts = start_offsets(self._checkpoint, marks, self._starting)
        nexts = {tp: part.kafka_last + 1 for tp, part in self._parts.items()}
        return partition_lag(marks, nexts, self._starts)

    def _attempt(
        self, source: str, step: Callable[[], None], errors: tuple[type[Exception], ...]
    ) -> None:
        """Run one reading step; a failure is counted and logged, and the scrape goes on."""
        try:
            step()
        except errors as exc:
            self._errors[source] += 1
            log.warning("metrics: cannot read the %s: %s", source, exc)

    # ------------------------------------------------------------------------- exposing

    def collect(self) -> Iterator[Metric]:
        """The figures as of now (called by the registry on each scrape)."""
        from py4j.protocol import Py4JError

        with self._lock:
            self._attempt("output", self._refresh_output, _OUTPUT_ERRORS)
            # The query's JVM may be gone (the sink stopped): the committed figures still count.
            self._attempt("spark", self._refresh_progress, (Py4JError,))
            lag = self._lag()
            yield from self._counters()
            yield from self._gauges(lag)
            yield from self.batch_seconds.collect()
            yield from self.batch_records.collect()

    def describe(self) -> Iterator[Metric]:
        """Nothing: collected on every scrape, names checked then."""
        return iter(())

    def _counters(self) -> Iterator[Metric]:
        t = self._totals
        yield _counter("pidfence_sink_batches", "Batches committed", t.batches)
        yield _counter(
            "pidfence_sink_records_read", "Kafka records the committed batches read", t.records_in
        )
        yield _counter(
            "pidfence_sink_records_appended", "Records appended to the output log", t.appended
        )
        rejected = CounterMetricFamily(
            "pidfence_sink_records_rejected",
            "Records kept out of the log (in the rejects table), by verdict",
            labels=["verdict"],
        )
        for verdict in REJECTED:
            rejected.add_metric([verdict], float(t.counts.get(verdict, 0)))
        yield rejected
        opened = CounterMetricFamily(
            "pidfence_sink_gaps_opened",
            "Gaps reported: Kafka offsets never read (offsets), a producer's seqs skipped "
            "(lost) or before the sink's view (head)",
            labels=["kind"],
        )
        for kind in sorted({*GAP_KINDS, *t.gaps} - {FILLED}):
            opened.add_metric([kind], float(t.gaps.get(kind, 0)))
        yield opened
        yield _counter(
            "pidfence_sink_gaps_filled",
            "Records that filled a skipped seq late",
            t.gaps.get(FILLED, 0),
        )
        errors = CounterMetricFamily(
            "pidfence_sink_metrics_errors",
            "Scrapes that could not read a source (kafka: lag unknown; output; spark)",
            labels=["source"],
        )
        for source, n in self._errors.items():
            errors.add_metric([source], float(n))
        yield errors

    def _gauges(self, lag: Mapping[tuple[str, int], int] | None) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        families = {
            "producers": GaugeMetricFamily(
                "pidfence_sink_live_producers",
                "Live producer entries of the partition, as of its newest committed batch",
                labels=labels,
            ),
            "state_bytes": GaugeMetricFamily(
                "pidfence_sink_state_bytes",
                "Bytes of the partition's state chain (full snapshot and deltas) a restart loads",
                labels=labels,
            ),
            "held": GaugeMetricFamily(
                "pidfence_sink_records_held",
                "Records of the partition held for reordering, waiting behind a missing seq",
                labels=labels,
            ),
        }
        for (topic, partition), part in sorted(self._parts.items()):
            for name, family in families.items():
                family.add_metric([topic, str(partition)], float(getattr(part, name)))
        yield from families.values()
        behind = GaugeMetricFamily(
            "pidfence_sink_lag_records",
            "Offsets between Kafka's high watermark and the next offset the sink reads",
            labels=labels,
        )
        for (topic, partition), n in sorted((lag or {}).items()):
            behind.add_metric([topic, str(partition)], float(n))
        yield behind
        if self._last < 0:
            return
        at = self._totals.committed_ms / 1000
        yield GaugeMetricFamily(
            "pidfence_sink_last_batch_id", "Id of the newest committed batch", value=self._last
        )
        yield GaugeMetricFamily(
            "pidfence_sink_last_batch_timestamp_seconds",
            "When the newest batch was committed (Unix time)",
            value=at,
        )
        yield GaugeMetricFamily(
            "pidfence_sink_last_batch_age_seconds",
            "Seconds since the newest batch was committed",
            value=max(0.0, self._clock() - at),
        )


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=float(value))


__all__ = ["REJECTED", "SinkMetrics"]
