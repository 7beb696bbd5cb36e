"""The sink's Prometheus metrics, over the real writer (write() and commit(), no Spark).

Counters come from the totals each committed manifest carries: a batch whose commit died and
was re-run, or a committed batch re-run, counts once, and a fresh :class:`SinkMetrics` (a
restarted driver) starts from the committed totals. Kafka is a fake watermark source here; the
integration test ``test_sink_metrics.py`` scrapes a real sink.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pidfence.spark_sink import fold as fold_mod
from pidfence.spark_sink import output as output_mod
from pidfence.spark_sink import positions as positions_mod
from pidfence.spark_sink import read_log, read_rejects
from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.errors import SinkOptionError
from pidfence.spark_sink.lag import Watermarks, partition_lag
from pidfence.spark_sink.manifest import Totals
from pidfence.spark_sink.metrics import REJECTED, SinkMetrics
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.output import Output, open_output
from pidfence.spark_sink.progress import BatchProgress, progress_by_batch
from pidfence.spark_sink.state_files import decode_state, state_dir
from pidfence.spark_sink.storage import Store
from pidfence.spark_sink.writer import PidfenceStreamWriter, SinkCommitMessage
from tests.unit.test_delta_layout import Crash, commit_files_dying_at
from tests.unit.test_sink_process import Record, kafka_rows, make_stream, micro_batches

QUERY = "7e7e7e7e-metrics-query"
SETTINGS = {"capacity": "64", "lifetime": "10000000", "reorderWindow": "3", "compactEvery": "2"}
#: One scrape: (sample name, sorted labels) -> value.
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class FakeKafka:
    """Watermarks as a test sets them; None: Kafka does not answer."""

    def __init__(self) -> None:
        self.marks: Watermarks | None = {}

    def __call__(self) -> Watermarks | None:
        return None if self.marks is None else dict(self.marks)


@pytest.fixture
def writer(tmp_path: Path) -> PidfenceStreamWriter:
    options = SinkOptions.parse({"path": str(tmp_path / "out"), **SETTINGS})
    open_output(options.path, options.rejects_path, QUERY)
    return PidfenceStreamWriter(options)


@pytest.fixture
def kafka() -> FakeKafka:
    return FakeKafka()


@pytest.fixture
def metrics_of(tmp_path: Path, kafka: FakeKafka) -> Iterator[Any]:
    """Callable(clock=...) -> a SinkMetrics over ``tmp_path/out`` (closed at the end)."""
    made: list[SinkMetrics] = []

    def make(**kwargs: Any) -> SinkMetrics:
        m = SinkMetrics(
            str(tmp_path / "out"),
            "unused:9092",
            ["t"],
            str(tmp_path / "ckpt"),
            watermarks=kafka,
            **kwargs,
        )
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def write_task(
    monkeypatch: pytest.MonkeyPatch,
    writer: PidfenceStreamWriter,
    batch: int,
    parts: dict[int, list[Record]],
    attempt: int = 0,
) -> SinkCommitMessage:
    """``writer.write()`` of one task reading partitions ``parts`` of topic ``t``."""
    monkeypatch.setattr(writer_mod, "_task_context", lambda: (batch, attempt, QUERY))
    rows = pa.concat_tables([kafka_rows(recs, "t", p) for p, recs in sorted(parts.items())])
    return writer.write(iter(rows.to_batches(max_chunksize=17)))


def scrape(metrics: SinkMetrics) -> Scrape:
    """What Prometheus would store from one scrape of ``metrics`` (without the ``_created``
    times prometheus_client adds to its own histograms)."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def total(found: Scrape, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


def two_partitions(seed: int, n: int) -> list[dict[int, list[Record]]]:
    """``n / 40`` micro-batches: 40 records of partition 0 and 20 of partition 1 each, from two
    crafted streams."""
    zero = micro_batches(make_stream(seed, n), 40)
    one = micro_batches(make_stream(seed + 1, n // 2), 20)
    return [{0: a, 1: b} for a, b in zip(zero, one, strict=True)]


def test_counters_are_the_committed_totals_and_count_a_rerun_batch_once(
    tmp_path: Path,
    writer: PidfenceStreamWriter,
    monkeypatch: pytest.MonkeyPatch,
    metrics_of: Any,
) -> None:
    batches = two_partitions(3, 320)
    real = output_mod.commit_files
    for b, parts in enumerate(batches):
        message = write_task(monkeypatch, writer, b, parts)
        if b == 3:
            # The driver dies between the rejects and the log commit: the manifest is written,
            # the batch is not committed; Spark re-runs it with a new attempt.
            monkeypatch.setattr(output_mod, "commit_files", commit_files_dying_at("log"))
            with pytest.raises(Crash):
                writer.commit([message], b)
            monkeypatch.setattr(output_mod, "commit_files", real)
            message = write_task(monkeypatch, writer, b, parts, attempt=1)
        writer.commit([message], b)
        if b == 5:
            # A committed batch re-run (a crash after the log commit): nothing new.
            writer.commit([write_task(monkeypatch, writer, b, parts, attempt=2)], b)

    out = str(tmp_path / "out")
    manifests = list(Output.reading(out).manifests())
    assert [m.batch for m in manifests] == list(range(len(batches)))
    totals = manifests[-1].totals
    # The totals are what the batches committed, each once...
    records_in = sum(len(recs) for parts in batches for recs in parts.values())
    log, rejects = read_log(out), read_rejects(out)
    held = sum(p.held for p in manifests[-1].parts)
    assert totals.batches == len(batches)
    assert totals.records_in == records_in
    assert totals.appended == log.num_rows
    assert sum(n for v, n in totals.counts.items() if v in REJECTED) == rejects.num_rows
    assert totals.appended + rejects.num_rows + held == records_in
    by_verdict = rejects.group_by("verdict").aggregate([("verdict", "count")]).to_pylist()
    assert {r["verdict"]: r["verdict_count"] for r in by_verdict} == {
        v: n for v, n in totals.counts.items() if v in REJECTED and n
    }
    # ... and the scrape shows them.
    found = scrape(metrics_of())
    assert total(found, "pidfence_sink_records_appended_total") == log.num_rows
    assert total(found, "pidfence_sink_records_read_total") == records_in
    assert total(found, "pidfence_sink_batches_total") == len(batches)
    for verdict in REJECTED:
        assert total(found, "pidfence_sink_records_rejected_total", verdict=verdict) == (
            totals.counts.get(verdict, 0)
        )
    assert total(found, "pidfence_sink_records_rejected_total", verdict="DUPLICATE") > 0
    assert total(found, "pidfence_sink_last_batch_id") == len(batches) - 1


def test_a_restarted_driver_starts_from_the_committed_totals(
    tmp_path: Path,
    writer: PidfenceStreamWriter,
    monkeypatch: pytest.MonkeyPatch,
    metrics_of: Any,
) -> None:
    batches = two_partitions(11, 240)
    first = metrics_of(clock=lambda: 2e9)
    for b, parts in enumerate(batches[:4]):
        writer.commit([write_task(monkeypatch, writer, b, parts)], b)
        scrape(first)  # scraped while it runs, batch by batch
    before = scrape(first)
    restarted = metrics_of(clock=lambda: 2e9)
    assert scrape(restarted) == before  # not from zero: every series is where it was
    for b, parts in enumerate(batches[4:], start=4):
        writer.commit([write_task(monkeypatch, writer, b, parts)], b)
    totals = Output.reading(str(tmp_path / "out")).committed(len(batches) - 1)
    assert totals is not None
    after = scrape(restarted)
    assert total(after, "pidfence_sink_records_appended_total") == totals.totals.appended
    assert (
        total(after, "pidfence_sink_records_appended_total")
        == read_log(str(tmp_path / "out")).num_rows
    )


def test_a_restart_reads_the_index_not_every_manifest(
    tmp_path: Path,
    writer: PidfenceStreamWriter,
    monkeypatch: pytest.MonkeyPatch,
    metrics_of: Any,
) -> None:
    for module in (writer_mod, positions_mod, fold_mod):
        monkeypatch.setattr(module, "INDEX_EVERY", 4)
    batches = two_partitions(5, 440)
    for b, parts in enumerate(batches):
        writer.commit([write_task(monkeypatch, writer, b, parts)], b)
    assert (tmp_path / "out" / "_pidfence" / "_manifests" / "_index").is_dir()
    reads: list[int] = []
    committed = Output.committed

    def counted(self: Output, batch_id: int) -> Any:
        reads.append(batch_id)
        return committed(self, batch_id)

    monkeypatch.setattr(Output, "committed", counted)
    monkeypatch.setattr(positions_mod, "_KNOWN", {})  # a restart: a new process knows nothing
    found = scrape(metrics_of())
    last = len(batches) - 1
    assert total(found, "pidfence_sink_last_batch_id") == last
    # The newest index (batch 8) and the manifests after it: not the whole history.
    assert sorted(set(reads)) == list(range(last - last % 4 + 1, last + 1))


def test_partition_gauges_and_lag(
    tmp_path: Path,
    writer: PidfenceStreamWriter,
    monkeypatch: pytest.MonkeyPatch,
    metrics_of: Any,
    kafka: FakeKafka,
) -> None:
    batches = two_partitions(21, 120)  # the newest state files are deltas (compactEvery 2)
    for b, parts in enumerate(batches):
        writer.commit([write_task(monkeypatch, writer, b, parts)], b)
    out = str(tmp_path / "out")
    manifest = Output.reading(out).committed(len(batches) - 1)
    assert manifest is not None
    read = {p.partition: p.kafka_last + 1 for p in manifest.parts}
    # Partition 2 was never read: it starts at its low watermark (earliest).
    kafka.marks = {("t", 0): (0, read[0] + 7), ("t", 1): (0, read[1]), ("t", 2): (3, 10)}
    found = scrape(metrics_of())
    lag = {
        dict(ls)["partition"]: v for (n, ls), v in found.items() if n == "pidfence_sink_lag_records"
    }
    assert lag == {"0": 7, "1": 0, "2": 7}
    store = Store.at(out).child("_pidfence")
    for part in manifest.parts:
        labels = {"topic": "t", "partition": str(part.partition)}
        assert total(found, "pidfence_sink_live_producers", **labels) == part.producers > 0
        assert total(found, "pidfence_sink_records_held", **labels) == part.held
        # The state bytes are the chain a restart loads (a full snapshot and deltas), on disk.
        size, files = _chain(store, "t", part.partition, part.state)
        assert files > 1
        assert total(found, "pidfence_sink_state_bytes", **labels) == size


def _chain(store: Store, topic: str, partition: int, name: str) -> tuple[int, int]:
    """(bytes, files) of the partition's state chain ending at the file ``name``."""
    link: str | None = name
    size = files = 0
    while link is not None:
        data = store.read(f"{state_dir(store, topic, partition)}/{link}")
        size, files = size + len(data), files + 1
        sf = decode_state(data)
        link = sf.prev_name if sf.kind == "delta" else None
    return size, files


def test_lag_of_a_run_started_at_latest_and_kafka_down(
    tmp_path: Path, metrics_of: Any, kafka: FakeKafka
) -> None:
    kafka.marks = {("t", 0): (0, 40)}
    metrics = metrics_of(starting_offsets="latest")
    assert total(scrape(metrics), "pidfence_sink_lag_records") == 0
    kafka.marks = {("t", 0): (0, 45)}
    assert total(scrape(metrics), "pidfence_sink_lag_records") == 5
    # Kafka does not answer: the scrape still answers, without lag, and says why.
    kafka.marks = None
    found = scrape(metrics)
    assert not [k for k in found if k[0] == "pidfence_sink_lag_records"]
    assert total(found, "pidfence_sink_metrics_errors_total", source="kafka") == 1
    assert total(found, "pidfence_sink_records_appended_total") == 0
    assert "pidfence_sink_last_batch_id" not in {k[0] for k in found}  # nothing committed yet


def test_age_of_the_last_batch(
    writer: PidfenceStreamWriter, monkeypatch: pytest.MonkeyPatch, metrics_of: Any
) -> None:
    monkeypatch.setattr(writer_mod.time, "time", lambda: 1_000.0)
    writer.commit([write_task(monkeypatch, writer, 0, two_partitions(2, 80)[0])], 0)
    found = scrape(metrics_of(clock=lambda: 1_090.5))
    assert total(found, "pidfence_sink_last_batch_timestamp_seconds") == 1_000.0
    assert total(found, "pidfence_sink_last_batch_age_seconds") == 90.5


def test_spark_progress_feeds_the_batch_histograms(metrics_of: Any) -> None:
    class Query:
        recentProgress = [
            {"batchId": 0, "numInputRows": 50, "durationMs": {"triggerExecution": 1500}},
            {"batchId": 1, "numInputRows": 5000, "durationMs": {"triggerExecution": 4000}},
        ]

    metrics = metrics_of()
    metrics.watch(Query())
    # The first scrape shows the batches (it showed them one scrape late), and the same
    # progress scraped again and again is observed once.
    for _ in range(3):
        found = scrape(metrics)
        assert total(found, "pidfence_sink_batch_duration_seconds_count") == 2
    assert total(found, "pidfence_sink_batch_duration_seconds_sum") == 5.5
    assert total(found, "pidfence_sink_batch_records_bucket", le="100.0") == 1
    assert total(found, "pidfence_sink_batch_records_sum") == 5050


def test_lag_is_never_negative_when_kafka_answers_behind_the_sink() -> None:
    marks = {("t", 0): (0, 45), ("t", 1): (0, 60)}
    next_offsets = {("t", 0): 50, ("t", 1): 40}
    assert partition_lag(marks, next_offsets, {}) == {("t", 0): 0, ("t", 1): 20}


def test_a_batchs_lag_adds_up_its_sources() -> None:
    class Query:
        recentProgress = [
            {
                "batchId": 3,
                "numInputRows": 10,
                "sources": [
                    {"metrics": {"maxOffsetsBehindLatest": "4"}},
                    {"metrics": {"maxOffsetsBehindLatest": "6.0"}},
                    {"metrics": {}},
                ],
            }
        ]

    assert progress_by_batch(Query()) == {3: BatchProgress(10, None, 10)}


def test_served_over_http_on_loopback_and_a_taken_port_is_a_usage_error(
    metrics_of: Any,
) -> None:
    metrics = metrics_of()
    url = metrics.serve(0)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - our own endpoint
        text = reply.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"pidfence_sink_records_appended", "pidfence_sink_records_rejected"} <= names
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(SinkOptionError, match="pick another --metrics-port") as err:
        metrics_of().serve(port)
    assert not err.value.retriable


def test_totals_add_batches() -> None:
    assert Totals().plus((), 5) == Totals(batches=1, committed_ms=5)
