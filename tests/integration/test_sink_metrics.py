"""A running ``pidfence sink --metrics-port``, scraped as Prometheus scrapes it (issue 39).

A producer writes through a lease server (itself serving metrics), some records are re-sent raw
and a raw producer leaves a hole in its seqs. The sink runs with a one-hour trigger: its first
batch reads everything at once and the next waits, so lag is exactly what arrives after it. Then
the driver is SIGKILLed, a second run is SIGKILLed right after its batch's log commit (before
Spark's commit log: the restart re-runs a committed batch), and a third run catches up: every
counter equals what was written, each record counted once, never from zero.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from pidfence.demo.procs import sink_argv
from pidfence.pid_allocator import LeaseClient
from pidfence.producer import IdempotentProducer, ProducerConfig
from pidfence.services.ports import free_port
from pidfence.spark_sink import read_log
from pidfence.testing import run_argv
from pidfence.wire import encode_pf
from tests.integration.test_sink_crash import RUN_LIMIT_S, SinkProc
from tests.unit.test_sink_alerts import missing_from

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: Prometheus' own Accept header: OpenMetrics first, the text format as the fallback.
ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
#: Events written through the lease server before and after the first batch, the records
#: re-sent raw, and the raw producer's seqs around its one-seq hole.
FIRST, LATER, RESENT = 120, 30, 7
HOLED = [*range(10), *range(11, 26)]
RAW_PID = 9_001


class Scrape:
    """One scrape: metric families by name, and the sample values by (name, labels)."""

    def __init__(self, url: str) -> None:
        request = urllib.request.Request(url, headers={"Accept": ACCEPT})  # noqa: S310
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - a test's own
            kind = reply.headers.get("Content-Type", "")
            text = reply.read().decode()
        parse = (
            openmetrics_families
            if kind.startswith("application/openmetrics-text")
            else text_string_to_metric_families
        )
        parsed = list(parse(text))
        self.families = {f.name for f in parsed}
        self.samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for f in parsed for s in f.samples
        }

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= set(ls))

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)


def resend_raw(bootstrap: str, topic: str, n: int) -> None:
    """Copy ``n`` of the topic's records (value and headers, ``pf`` included) to their
    partitions again, as a client re-sending outside the producer would."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "resend", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    copies: list[Any] = []
    try:
        while len(copies) < n:
            msg = consumer.poll(10)
            assert msg is not None and msg.error() is None, msg
            copies.append(msg)
    finally:
        consumer.close()
    raw = Producer({"bootstrap.servers": bootstrap})
    for msg in copies:
        raw.produce(topic, value=msg.value(), partition=msg.partition(), headers=msg.headers())
    assert raw.flush(30) == 0


def produce_with_hole(bootstrap: str, topic: str) -> None:
    """A raw idempotent producer's seqs :data:`HOLED` on partition 0: seq 10 never arrives."""
    raw = Producer({"bootstrap.servers": bootstrap})
    for seq in HOLED:
        raw.produce(
            topic, value=b"raw%d" % seq, partition=0, headers=[("pf", encode_pf(RAW_PID, 1, seq))]
        )
    assert raw.flush(30) == 0


def wait_for(proc: SinkProc, what: str, done: Any) -> Any:
    """Poll ``done()`` until it returns something true while ``proc`` runs."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while True:
        try:
            found = done()
        except OSError:  # the endpoint is not up yet
            found = None
        if found:
            return found
        assert proc.proc.poll() is None, f"{what}: the sink exited\n{proc.text()}"
        assert time.monotonic() < deadline, f"{what}: timed out\n{proc.text()}"
        time.sleep(0.5)


def test_a_running_sink_scraped_as_prometheus_does(
    kafka: Any, new_topic: Any, lease_process_factory: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    lease_metrics = free_port()
    lease = lease_process_factory(metrics_port=lease_metrics)
    client = LeaseClient(lease.address)
    producer = IdempotentProducer(ProducerConfig(kafka.bootstrap), client)
    try:
        for i in range(FIRST):
            producer.produce(topic, b"e%d" % i, partition=i % 2)
        producer.flush()
        resend_raw(kafka.bootstrap, topic, RESENT)
        produce_with_hole(kafka.bootstrap, topic)

        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        argv = sink_argv(kafka.bootstrap, topic, out, ckpt, ["--master", "local[2]"])
        argv = [a for a in argv if a != "--available-now"] + ["--trigger", "3600"]
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        first = SinkProc([*argv, "--metrics-port", str(port)], tmp_path / "first.log")
        try:
            s = wait_for(first, "batch 0", lambda: _after(url, batch=0))
            assert f"metrics: {url}" in first.text()
            written = FIRST + len(HOLED)
            assert s.total("pidfence_sink_records_appended_total") == written
            assert s.total("pidfence_sink_records_read_total") == written + RESENT
            assert s.total("pidfence_sink_records_rejected_total", verdict="DUPLICATE") == RESENT
            assert s.total("pidfence_sink_records_rejected_total") == RESENT
            assert s.total("pidfence_sink_gaps_opened_total", kind="lost") == 1
            assert s.total("pidfence_sink_gaps_opened_total") == 1
            # The lease server's pid on both partitions, the raw producer's on partition 0.
            assert s.total("pidfence_sink_live_producers", topic=topic, partition="0") == 2
            assert s.total("pidfence_sink_live_producers", topic=topic, partition="1") == 1
            assert s.total("pidfence_sink_state_bytes") > 0
            assert s.total("pidfence_sink_batches_total") == 1
            assert s.total("pidfence_sink_last_batch_age_seconds") >= 0
            # The next batch waits an hour: lag is exactly what arrives meanwhile.
            for i in range(FIRST, FIRST + LATER):
                producer.produce(topic, b"e%d" % i, partition=i % 2)
            producer.flush()
            s = Scrape(url)
            assert s.total("pidfence_sink_lag_records", topic=topic, partition="0") == LATER / 2
            assert s.total("pidfence_sink_lag_records", topic=topic, partition="1") == LATER / 2
            assert s.total("pidfence_sink_records_appended_total") == written
            # Every metric the alert rules and the dashboard ask for is served, by one or the
            # other component.
            lease_scrape = Scrape(f"http://127.0.0.1:{lease_metrics}/metrics")
            assert lease_scrape.total("pidfence_leases_total") >= 1
            assert missing_from(s.families | lease_scrape.families) == {}
            wait_for(first, "Spark's commit log", (ckpt / "commits" / "0").exists)
        finally:
            first.kill()
        assert first.proc.returncode == -signal.SIGKILL

        # Batch 1 commits to the log, then the driver dies before Spark's commit log.
        crashed = SinkProc(run_argv(argv, crash_at="after_manifest"), tmp_path / "crash.log")
        assert crashed.wait() == -signal.SIGKILL, crashed.text()
        assert not (ckpt / "commits" / "1").exists()

        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        last = SinkProc([*argv, "--metrics-port", str(port)], tmp_path / "last.log")
        try:
            # From its first scrape, before Spark even starts: the committed totals.
            s = wait_for(last, "the endpoint", lambda: Scrape(url))
            written = FIRST + LATER + len(HOLED)
            assert s.total("pidfence_sink_records_appended_total") == written
            # Spark re-runs batch 1, committed already: once caught up, nothing counted twice.
            wait_for(last, "the re-run of batch 1", (ckpt / "commits" / "1").exists)
            s = wait_for(last, "batch 1's progress", lambda: _after(url, 1, progress=True))
            assert s.total("pidfence_sink_records_appended_total") == written
            assert s.total("pidfence_sink_records_read_total") == written + RESENT
            assert s.total("pidfence_sink_records_rejected_total", verdict="DUPLICATE") == RESENT
            assert s.total("pidfence_sink_gaps_opened_total") == 1
            assert s.total("pidfence_sink_batches_total") == 2
            assert s.total("pidfence_sink_lag_records") == 0
            assert read_log(str(out)).num_rows == written
            last.proc.send_signal(signal.SIGTERM)
            assert last.wait() == 0, last.text()
        finally:
            last.kill()
    finally:
        producer.close()
        client.close()
    # Each batch's own figures are in its Delta commit, beside Spark's epochId.
    infos = [h for h in DeltaTable(str(out)).history() if "pidfence.appended" in h]
    assert sorted(int(h["operationParameters"]["epochId"]) for h in infos) == [0, 1]
    assert sum(h["pidfence.appended"] for h in infos) == written


def _after(url: str, batch: int, progress: bool = False) -> Scrape | None:
    """A scrape once batch ``batch`` is committed (and its Spark progress seen), else None."""
    s = Scrape(url)
    if not s.has("pidfence_sink_last_batch_id"):
        return None
    if s.total("pidfence_sink_last_batch_id") < batch:
        return None
    if progress and s.total("pidfence_sink_batch_duration_seconds_count") < 1:
        return None
    return s
