"""``pidfence bench sink``: records/s from one pre-filled raw Kafka topic into Spark sinks.

One raw topic (``--quick``: 2M records, full: 10M; 1k producers; 5% resends) is filled once with
pre-encoded ``pf`` headers, and a signed ``pfc`` certificate on the first record of each (pid,
generation) in its partition (what ``IdempotentProducer`` stamps with signing on). Then every
contender reads it from the start with the same trigger (available-now, the same
``maxOffsetsPerTrigger``) on one SparkSession, in interleaved rounds whose order is reversed every
other round (each measured query right after a warm-up query of its kind on a small topic; best
round and median shown):

(a) Spark's plain Parquet file sink, no deduplication;
(n) a no-op ``DataSourceStreamArrowWriter``: a Python data source whose writer only consumes the
    Arrow batches (the ceiling of any Python streaming writer: JVM -> Arrow -> Python worker);
(b) ``withWatermark`` + ``dropDuplicatesWithinWatermark`` on a message id (the record key,
    ``pid:seq``), into the Parquet sink;
(c) the pidfence sink (the broker rules, output log + rejects as Delta tables), certificates not
    checked;
(v) the pidfence sink with ``leasePublicKey``: every record that creates a producer entry is
    verified (once per pid, generation and partition);
(s) Spark's own Delta sink without deduplication (when the delta-spark jars are present).

Modes: ``local`` (``pidfence bench sink``: 4 partitions, ``local[2]``) and ``standalone64``
(``pidfence bench sink_standalone64``: 64 partitions, a Spark standalone cluster of one master and
two one-core workers started by the bench). ``PIDFENCE_BENCH_RECORDS`` overrides the record count,
``PIDFENCE_BENCH_ROUNDS`` the rounds, ``PIDFENCE_BENCH_CONTENDERS`` runs only the contenders named
besides (a) and (n) (keys ``dedup``, ``pidfence``, ``verify``, ``sparkdelta``),
``PIDFENCE_BENCH_ARROW_BATCH`` the Arrow batch size the Python writers receive
(``spark.sql.execution.arrow.maxRecordsPerBatch``, default 100,000), and
``PIDFENCE_BENCH_WARMUP=0`` skips the warm-up queries (the smoke test runs tiny sizes this way:
it checks what the measured runs wrote, not their speed).

State bytes are taken after the batch whose cumulative count is nearest to 1M and at the end:
for (b) the state store's ``memoryUsedBytes`` from the query progress, for the pidfence sinks the
bytes of the state files a task reads to restore every partition (newest full snapshot + deltas).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from rich.progress import Progress

from pidfence.benchkit import BenchReport
from pidfence.wire import encode_pf

RECORDS_ENV = "PIDFENCE_BENCH_RECORDS"
ROUNDS_ENV = "PIDFENCE_BENCH_ROUNDS"
WARMUP_ENV = "PIDFENCE_BENCH_WARMUP"
CONTENDERS_ENV = "PIDFENCE_BENCH_CONTENDERS"
ARROW_BATCH_ENV = "PIDFENCE_BENCH_ARROW_BATCH"
#: Every contender's key, in table order ((s) only where it can run).
CONTENDER_KEYS = ("plain", "noop", "dedup", "pidfence", "verify", "sparkdelta")
PIDS = 1_000
GENERATION = 7
DUP_RATE = 0.05
PER_TRIGGER = 500_000
WARMUP = 200_000
ARROW_BATCH = 100_000
#: Enough interleaved rounds that the best and the median tell the same story on a shared machine.
ROUNDS = 4
VALUE = b"x" * 64
#: The certificates outlive the run by far: the bench measures verification, not expiry.
CERT_LIFETIME_MS = 7 * 86_400_000


@dataclass(frozen=True)
class Mode:
    """Where the contenders run: partitions of the raw topic and the Spark master."""

    name: str
    partitions: int
    standalone_workers: int = 0
    #: dropDuplicatesWithinWatermark keeps ~280 bytes per message id on the heap (HDFS-backed
    #: state store, two versions retained): 10M records need a few GB where the state lives.
    driver_memory: str = "6g"
    worker_memory: str = "4g"
    executor_memory: str = "3500m"
    #: "s3": outputs and checkpoints on an S3 store (SeaweedFS) the bench starts.
    store: str | None = None

    @property
    def standalone(self) -> bool:
        """Whether the bench starts a Spark standalone cluster."""
        return self.standalone_workers > 0


LOCAL = Mode("local", partitions=4)
STANDALONE64 = Mode("standalone64", partitions=64, standalone_workers=2)
S3 = Mode("s3", partitions=4, store="s3")
MODES = {m.name: m for m in (LOCAL, STANDALONE64, S3)}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be a positive integer") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be a positive integer")
    return value


def _arrow_batch() -> int:
    """Rows per Arrow batch handed to the Python writers (``PIDFENCE_BENCH_ARROW_BATCH``)."""
    return _env_int(ARROW_BATCH_ENV, ARROW_BATCH)


def load_average() -> str:
    """The 1/5/15-minute load averages, for the notes (the machine is shared)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# --- small-batch benches (sink_small, sink_aged): their Kafka, Spark and batch times ---------


@contextmanager
def one_broker(prefix: str) -> Iterator[tuple[Any, Path]]:
    """A one-broker Kafka and a scratch folder named ``prefix...``; stopped and removed after."""
    from pidfence.services import KafkaCluster

    work = Path(tempfile.mkdtemp(prefix=prefix))
    kafka = KafkaCluster(1, heap="768m").start()
    try:
        yield kafka, work
    finally:
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def local_spark(app_name: str) -> Iterator[Any]:
    """A ``local[2]`` SparkSession with the pidfence sink and the no-op writer registered;
    stopped after."""
    from pidfence.services import spark_session, stop_session
    from pidfence.spark_sink import register

    spark = spark_session(master="local[2]", app_name=app_name)
    try:
        register(spark)
        _register_noop(spark)
        yield spark
    finally:
        stop_session(spark)


def batch_ms(query: Any) -> list[int]:
    """The ``triggerExecution`` time (ms) of each batch of ``query`` that read records."""
    progress = [json.loads(p.json) for p in query.recentProgress]
    return [int(p["durationMs"]["triggerExecution"]) for p in progress if p.get("numInputRows")]


def p90(values: list[int]) -> float:
    """The 90th percentile of ``values`` (the value itself if there is one)."""
    return float(statistics.quantiles(values, n=10)[-1]) if len(values) > 1 else float(values[0])


# --- the raw topic -------------------------------------------------------------------------


def fill_topic(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int,
    seed: int = 1,
    sign: Callable[[str, int, int, int, int], bytes] | None = None,
) -> dict[str, int]:
    """Produce ``n`` raw records; returns what was sent (fresh, resent, certified).

    Every pid writes to partition ``pid % partitions``; with ``sign``, its first record carries
    ``pfc`` = ``sign(topic, partition, pid, GENERATION, seq)``, a placed certificate, as
    ``IdempotentProducer`` stamps it with signing on.
    """
    from confluent_kafka import Producer

    rng = random.Random(seed)
    pids = np.random.default_rng(seed).integers(1, PIDS + 1, size=n).tolist()
    next_seq = [0] * (PIDS + 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "compression.type": "lz4",
            # In order per partition, as IdempotentProducer writes: without idempotence a retried
            # request (e.g. while a new topic's leaders settle) lands after later ones, and the
            # raw topic holds seq gaps and pids whose first record comes late.
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    resent = certified = 0
    produce = producer.produce
    for pid in pids:
        if next_seq[pid] and rng.random() < DUP_RATE:
            seq = next_seq[pid] - 1 - rng.randrange(min(3, next_seq[pid]))
            resent += 1
        else:
            seq = next_seq[pid]
            next_seq[pid] += 1
        key = b"%d:%d" % (pid, seq)
        headers: list[tuple[str, str | bytes | None]] = [("pf", encode_pf(pid, GENERATION, seq))]
        if sign is not None and seq == 0 and next_seq[pid] == 1:
            headers.append(("pfc", sign(topic, pid % partitions, pid, GENERATION, seq)))
            certified += 1
        while True:
            try:
                produce(topic, VALUE, key, partition=pid % partitions, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("the raw topic was not fully written")
    return {"fresh": n - resent, "resent": resent, "certified": certified}


def _signer(key_dir: Path) -> tuple[Path, Callable[[str, int, int, int, int], bytes]]:
    """A fresh lease signing key pair; returns the public key file and a placed-pfc maker
    (a version 2 certificate naming one producer key, and that key's statement)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from pidfence.wire.cert import encode_cert, generate_keypair, load_private_key
    from pidfence.wire.statement import encode_placed_pfc

    private_path, public_path = generate_keypair(key_dir)
    private_key = load_private_key(private_path)
    producer = Ed25519PrivateKey.generate()
    producer_key = producer.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    expire_ms = int(time.time() * 1000) + CERT_LIFETIME_MS

    def sign(topic: str, partition: int, pid: int, generation: int, seq: int) -> bytes:
        cert = encode_cert(private_key, pid, generation, expire_ms, producer_key=producer_key)
        return encode_placed_pfc(cert, producer, topic, partition, pid, generation, seq, 0)

    return public_path, sign


# --- the no-op Python writer (the ceiling) -------------------------------------------------


@dataclass
class NoopCommit(WriterCommitMessage):
    """Rows one task consumed."""

    rows: int


class NoopArrowWriter(DataSourceStreamArrowWriter):
    """Consumes every Arrow batch and writes nothing but a per-batch row count (for the check)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NoopCommit:
        """Count the rows of this task's Arrow batches."""
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return NoopCommit(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record the batch's row count (one small file per batch)."""
        rows = sum(m.rows for m in messages if isinstance(m, NoopCommit))
        Path(self.path).mkdir(parents=True, exist_ok=True)
        (Path(self.path) / f"{batchId}.rows").write_text(str(rows))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing was written."""
        del messages, batchId


class NoopArrowSink(DataSource):
    """``format("pidfence_bench_noop")``: the Python streaming writer that does nothing."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "pidfence_bench_noop"

    def streamWriter(self, schema: Any, overwrite: bool) -> NoopArrowWriter:
        """The no-op writer."""
        del schema, overwrite
        return NoopArrowWriter(str(self.options["path"]))


def _register_noop(spark: Any) -> None:
    # The runner imports this file under a name Python workers cannot import: ship the classes
    # by value instead of by reference.
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    if __name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    spark.dataSource.register(NoopArrowSink)


def _noop_rows(path: Path) -> int:
    return sum(int(p.read_text()) for p in path.glob("*.rows"))


# --- queries -------------------------------------------------------------------------------


def _kafka_df(spark: Any, bootstrap: str, topic: str, per_trigger: int) -> Any:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
    )


def _run(writer: Any) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    progress = [json.loads(p.json) for p in query.recentProgress]
    return elapsed, [p for p in progress if p.get("numInputRows")]


def _at_million(progress: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """(records read so far, progress) of the batch whose cumulative count is nearest to 1M."""
    total = 0
    best: tuple[int, int, dict[str, Any]] | None = None
    for p in progress:
        total += int(p["numInputRows"])
        if best is None or abs(total - 1_000_000) < best[0]:
            best = (abs(total - 1_000_000), total, p)
    assert best is not None
    return best[1], best[2]


def _chain_bytes(out: str, batch: int) -> tuple[int, int]:
    """(bytes, files) of every partition's state chain as of ``batch`` at output ``out``.

    Read from the committed manifests, as a restart finds the chains: each partition's newest part
    up to ``batch`` records the chain's bytes and names its state file; a delta's links are the
    states of the earlier batches that read the partition (``prev``), back to a full snapshot.
    """
    from pidfence.spark_sink.manifest import PartCommit
    from pidfence.spark_sink.output import Output

    parts: dict[tuple[int, str], PartCommit] = {}
    for manifest in Output.reading(out).manifests():
        if manifest.batch > batch:
            break
        for part in manifest.parts:
            parts[(manifest.batch, part.name)] = part
    newest: dict[str, tuple[int, PartCommit]] = {}
    for (bid, name), part in parts.items():
        newest[name] = (bid, part)
    size = files = 0
    for name, (_, part) in newest.items():
        size += part.state_bytes
        link: PartCommit | None = part
        while link is not None:
            files += 1
            prev = None if link.state.endswith(".full") else link.prev
            link = None if prev is None else parts.get((prev, name))
    return size, files


def _store_bytes(p: dict[str, Any]) -> int:
    return sum(int(op.get("memoryUsedBytes", 0)) for op in p.get("stateOperators", []))


def _store_rows(p: dict[str, Any]) -> int:
    return sum(int(op.get("numRowsTotal", 0)) for op in p.get("stateOperators", []))


@dataclass
class Outcome:
    """What one run of one contender left: rows out, state and (pidfence) verdict counts."""

    rows_out: int
    state_at_1m: int = 0
    state_at_end: int = 0
    sampled_at: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Contender:
    """One row of the table: how to build its query and how to read what it wrote."""

    key: str
    label: str
    build: Callable[[Any, str, str], Any]
    outcome: Callable[[str, list[dict[str, Any]]], Outcome]
    times: list[float] = field(default_factory=list)
    #: Per measured round, each query-progress phase (``durationMs``) summed over its batches.
    phases: list[dict[str, int]] = field(default_factory=list)
    last: Outcome | None = None
    #: An optional contender (work in progress elsewhere) that fails is reported, not fatal.
    optional: bool = False
    failed: str | None = None


def _parquet_rows(out: str, progress: list[dict[str, Any]]) -> Outcome:
    del progress
    return Outcome(ds.dataset(out, format="parquet").count_rows())


def _dedup_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    at, mid = _at_million(progress)
    return Outcome(
        ds.dataset(out, format="parquet").count_rows(),
        _store_bytes(mid),
        _store_bytes(progress[-1]),
        at,
        {
            "rows_in_state_at_1M": _store_rows(mid),
            "rows_in_state_at_end": _store_rows(progress[-1]),
        },
    )


def _pidfence_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    from pidfence.spark_sink.pipeline import summarise

    summary = summarise(out)
    at, mid = _at_million(progress)
    mid_bytes, mid_files = _chain_bytes(out, int(mid["batchId"]))
    end_bytes, end_files = _chain_bytes(out, int(progress[-1]["batchId"]))
    return Outcome(
        summary.appended,
        mid_bytes,
        end_bytes,
        at,
        {
            "dropped": dict(summary.dropped),
            "forged_reasons": dict(summary.forged),
            "state_files_at_1M": mid_files,
            "state_files_at_end": end_files,
            "batches": len(summary.batches),
        },
    )


def _noop_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    del progress
    return Outcome(_noop_rows(Path(out)))


def _delta_spark_jars() -> list[Path]:
    """delta-spark jars for the installed Spark (fetched on first use), or none when they cannot
    be had."""
    from pidfence.jars import JarsError, jars

    try:
        return jars("delta")
    except JarsError:
        return []


def contenders(bootstrap: str, topic: str, per_trigger: int, public_key: Path) -> list[Contender]:
    """The contenders of this run, in their first-round order."""
    source: Callable[[Any], Any] = lambda spark: _kafka_df(spark, bootstrap, topic, per_trigger)  # noqa: E731

    def writer(
        fmt: str, options: dict[str, str] | None = None, dedup: bool = False
    ) -> Callable[[Any, str, str], Any]:
        """A contender's query: the topic (deduplicated by key with ``dedup``) into ``fmt``."""

        def build(spark: Any, out: str, ckpt: str) -> Any:
            df = source(spark)
            if dedup:
                df = df.withWatermark("timestamp", "10 minutes").dropDuplicatesWithinWatermark(
                    ["key"]
                )
            stream = df.writeStream.format(fmt)
            for k, v in {"path": out, "checkpointLocation": ckpt, **(options or {})}.items():
                stream = stream.option(k, v)
            return stream

        return build

    rows = [
        Contender("plain", "(a) Parquet sink, no dedup", writer("parquet"), _parquet_rows),
        Contender(
            "noop", "(n) no-op Python Arrow writer", writer("pidfence_bench_noop"), _noop_outcome
        ),
        Contender(
            "dedup",
            "(b) dropDuplicatesWithinWatermark",
            writer("parquet", dedup=True),
            _dedup_outcome,
        ),
        Contender("pidfence", "(c) pidfence sink", writer("pidfence"), _pidfence_outcome),
        Contender(
            "verify",
            "(v) pidfence, leasePublicKey on",
            writer("pidfence", {"leasePublicKey": str(public_key)}),
            _pidfence_outcome,
        ),
    ]
    if _delta_spark_jars():

        def delta_rows(out: str, progress: list[dict[str, Any]]) -> Outcome:
            del progress
            from deltalake import DeltaTable

            return Outcome(int(DeltaTable(out).to_pyarrow_dataset().count_rows()))

        rows.append(
            Contender("sparkdelta", "(s) Spark Delta sink, no dedup", writer("delta"), delta_rows)
        )
    return rows


# --- the run -------------------------------------------------------------------------------


def _start_spark(mode: Mode, cluster: Any, bucket: str | None = None) -> Any:
    from pidfence.services import spark_session
    from pidfence.spark_sink.object_store import session_conf

    conf = {"spark.driver.memory": mode.driver_memory, **session_conf([bucket or ""])}
    jars = _delta_spark_jars()
    if jars:
        from pidfence.services.spark import connector_jars

        conf["spark.jars"] = ",".join([connector_jars(), *(str(j) for j in jars)])
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if cluster is None:
        return spark_session(master="local[2]", app_name="pidfence-bench-sink", conf=conf)
    conf.update(
        {
            "spark.executor.memory": mode.executor_memory,
            "spark.executor.cores": "1",
            "spark.cores.max": str(mode.standalone_workers),
            # The driver runs here; the executors find it on 127.0.0.1 like the workers.
            "spark.driver.memory": "1g",
        }
    )
    return spark_session(master=cluster.master_url, app_name="pidfence-bench-sink", conf=conf)


def _settle(spark: Any) -> None:
    """Start the next query from the same machine state: the previous query's files on disk,
    its state stores unloaded from the driver's JVM and its garbage collected.

    Without it the contender after (b) ran while the kernel wrote back ~2 GB of dropDuplicates
    state files (every fsync of the pidfence sink waited behind them) beside that state still
    loaded, and was measured slower for its place in the order. Executors of a standalone
    cluster keep their own heaps; this settles only the driver's.
    """
    os.sync()
    jvm = spark._jvm
    state_store = getattr(jvm.org.apache.spark.sql.execution.streaming.state, "StateStore$")
    getattr(state_store, "MODULE$").stop()
    jvm.java.lang.System.gc()


def _measure(c: Contender, spark: Any, out: str) -> None:
    _settle(spark)
    seconds, query_progress = _run(c.build(spark, out, f"{out}-ckpt"))
    outcome = c.outcome(out, query_progress)
    c.times.append(seconds)
    c.phases.append(_phase_sums(query_progress))
    c.last = outcome


def _phase_sums(progress: list[dict[str, Any]]) -> dict[str, int]:
    """Each ``durationMs`` phase (addBatch: the sink's tasks and commit; walCommit,
    commitOffsets: Spark's checkpoint) summed over a query's batches."""
    sums: dict[str, int] = {}
    for p in progress:
        for phase, ms in (p.get("durationMs") or {}).items():
            sums[phase] = sums.get(phase, 0) + int(ms)
    return sums


def _median_phases(rounds: list[dict[str, int]]) -> dict[str, float]:
    phases = sorted({k for r in rounds for k in r})
    return {k: float(statistics.median(r.get(k, 0) for r in rounds)) for k in phases}


def _warm(c: Contender, spark: Any, out: str) -> None:
    _run(c.build(spark, out, f"{out}-ckpt"))


def _attempt(c: Contender, step: Callable[..., None], *args: Any) -> None:
    """``step(*args)`` for ``c``; an optional contender's failure is recorded, ending its runs."""
    try:
        step(*args)
    except Exception as exc:
        if not c.optional:
            raise
        c.failed = " ".join(str(exc).split())[:400]


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in the local mode (starts and stops its own Kafka)."""
    return run_mode(LOCAL, quick, progress)


def _chosen(found: list[Contender]) -> list[Contender]:
    """The contenders ``PIDFENCE_BENCH_CONTENDERS`` names (comma-separated keys), else all; (a)
    and (n) always run, as every ratio is taken against them.

    Raises:
        ValueError: a key that is no contender's.
    """
    raw = os.environ.get(CONTENDERS_ENV, "").strip()
    if not raw:
        return found
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    known = {c.key for c in found}
    if unknown := [k for k in keys if k not in known]:
        there = ", ".join(sorted(known))
        raise ValueError(f"{CONTENDERS_ENV}: no contender {', '.join(unknown)} (there are {there})")
    return [c for c in found if c.key in {*keys, "plain", "noop"}]


def run_mode(mode: Mode, quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in ``mode`` (starts and stops its own Kafka and Spark cluster)."""
    from pidfence.services import KafkaCluster, SparkStandaloneCluster, create_topic
    from pidfence.spark_sink import register

    n = _env_int(RECORDS_ENV, 2_000_000 if quick else 10_000_000)
    rounds = _env_int(ROUNDS_ENV, ROUNDS)
    per_trigger = min(PER_TRIGGER, max(1_000, n // 4))
    # Warm-up queries only make the timings fair; a smoke run (WARMUP=0) checks outputs alone.
    warm_up = os.environ.get(WARMUP_ENV, "1").strip() != "0"
    warmup = min(WARMUP, max(1_000, n // 10)) if warm_up else 0
    load_start = load_average()
    task = progress.add_task("starting Kafka", total=2 + rounds)
    work = Path(tempfile.mkdtemp(prefix="pidfence-bench-sink-"))
    kafka = KafkaCluster(1, heap="768m").start()
    cluster: Any = None
    store, bucket = _start_store(mode, work)
    load_rounds: list[str] = []
    try:
        public_key, sign = _signer(work / "keys")
        topic = create_topic(kafka.bootstrap, "bench-raw", mode.partitions)
        progress.update(task, description=f"filling the raw topic with {n:,} records")
        t0 = time.perf_counter()
        sent = fill_topic(kafka.bootstrap, topic, n, mode.partitions, sign=sign)
        fill_s = time.perf_counter() - t0
        progress.advance(task)

        warm = topic  # (no warm-up query reads it)
        if warm_up:
            warm = create_topic(kafka.bootstrap, "bench-warmup", mode.partitions)
            fill_topic(kafka.bootstrap, warm, warmup, mode.partitions, seed=2, sign=sign)
        progress.advance(task)

        if mode.standalone:
            progress.update(task, description="starting the Spark standalone cluster")
            cluster = SparkStandaloneCluster(
                workers=mode.standalone_workers,
                run_dir=work / "spark",
                worker_memory=mode.worker_memory,
            ).start()
        progress.update(task, description="starting Spark, warming up")
        spark = _start_spark(mode, cluster, bucket)
        register(spark)
        _register_noop(spark)
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(_arrow_batch()))
        field_contenders = _chosen(contenders(kafka.bootstrap, topic, per_trigger, public_key))
        try:
            # The first queries in a JVM (and its Python workers) pay class loading, JIT and
            # imports; no contender should. Each kind of query runs once on the small topic.
            warmers = _chosen(contenders(kafka.bootstrap, warm, per_trigger, public_key))
            warm_of = {w.key: w for w in warmers}
            for w, c in zip(warmers, field_contenders, strict=True):
                if warm_up:
                    _attempt(c, _warm, w, spark, _place(work, bucket, c.key, "warm-"))
            for r in range(rounds):
                # Interleaved rounds, best time kept, order reversed every other round: this
                # machine is shared and noisy, and whichever query follows (b) runs ~7 s slower
                # for its first batches (measured even after a re-warm, sync and GC), so no
                # contender may follow the same one in every round.
                order = list(field_contenders if r % 2 == 0 else reversed(field_contenders))
                k = (r // 2) % len(order)
                order = order[k:] + order[:k]
                for c in order:
                    if c.failed is not None:
                        continue
                    progress.update(task, description=f"round {r + 1}: {c.label}")
                    # Warm again right before: Spark ends Python workers idle for a minute, so
                    # a Python sink measured after (b) or (s) would pay fresh workers.
                    if warm_up:
                        rewarm = _place(work, bucket, c.key, "rewarm-", r)
                        _attempt(c, _warm, warm_of[c.key], spark, rewarm)
                        shutil.rmtree(rewarm, ignore_errors=True)
                        shutil.rmtree(f"{rewarm}-ckpt", ignore_errors=True)
                    out = _place(work, bucket, c.key, "", r)
                    _attempt(c, _measure, c, spark, out)
                    shutil.rmtree(out, ignore_errors=True)
                    shutil.rmtree(f"{out}-ckpt", ignore_errors=True)
                load_rounds.append(load_average())
                progress.advance(task)
        finally:
            spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        if store is not None:
            store.stop()
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_end = load_average()
    return _report(mode, n, rounds, per_trigger, warmup, fill_s, sent, field_contenders,
                   (load_start, load_rounds, load_end))  # fmt: skip


def _start_store(mode: Mode, work: Path) -> tuple[Any, str | None]:
    """In the s3 mode: a SeaweedFS store in ``work``, its AWS environment set in this process
    (Spark's S3A, pyarrow and delta-rs read it there), and its bucket's URI."""
    if mode.store != "s3":
        return None, None
    from pidfence.services.seaweedfs import SeaweedFS

    store = SeaweedFS(work / "s3").start()
    os.environ.update(store.environment())
    return store, store.make_bucket("bench")


def _place(work: Path, bucket: str | None, key: str, prefix: str, r: int | str = "") -> str:
    """Where a query writes: the store's bucket in the s3 mode (the no-op writer, which only
    counts rows into local files, stays local; the store is thrown away at the end, so the
    local ``rmtree`` after each query is a no-op there), else the work folder."""
    name = f"{prefix}{key}{r}"
    return str(work / name) if bucket is None or key == "noop" else f"{bucket}/{name}"


def _report(
    mode: Mode,
    n: int,
    rounds: int,
    per_trigger: int,
    warmup: int,
    fill_s: float,
    sent: dict[str, int],
    entries: list[Contender],
    loads: tuple[str, list[str], str],
) -> BenchReport:
    failed = [c for c in entries if c.failed is not None]
    entries = [c for c in entries if c.failed is None]
    best = {c.key: min(c.times) for c in entries}
    median = {c.key: statistics.median(c.times) for c in entries}
    by_key = {c.key: c for c in entries}
    plain_s, noop_s = best["plain"], best["noop"]
    rows: list[dict[str, Any]] = []
    for c in entries:
        assert c.last is not None
        s = best[c.key]
        rows.append(
            {
                "contender": c.label,
                "records": n,
                "seconds": s,
                "records/s": n / s,
                "vs (a)": plain_s / s,
                "vs (n)": noop_s / s,
                "median s": median[c.key],
                "median vs (a)": median["plain"] / median[c.key],
                "rows out": c.last.rows_out,
                "state bytes @1M": c.last.state_at_1m,
                "state bytes @end": c.last.state_at_end,
            }
        )
    pf = by_key["pidfence"].last if "pidfence" in by_key else None
    vf = by_key["verify"].last if "verify" in by_key else None
    if pf is not None and vf is not None and vf.rows_out != pf.rows_out:
        # Verification must refuse nothing here: every producer's first record is signed.
        raise RuntimeError(
            f"verification on appended {vf.rows_out:,}, off {pf.rows_out:,}: {vf.extra}"
        )
    ratios = {"noop_writer_vs_plain": plain_s / noop_s}
    if "pidfence" in best:
        ratios["pidfence_vs_plain"] = plain_s / best["pidfence"]
        ratios["pidfence_share_of_noop_writer"] = noop_s / best["pidfence"]
        if "verify" in best:
            ratios["verify_on_vs_off"] = best["pidfence"] / best["verify"]
    if "dedup" in best:
        ratios["dedup_vs_plain"] = plain_s / best["dedup"]
    if "pidfence" in median:
        ratios["pidfence_vs_plain_median"] = median["plain"] / median["pidfence"]
    dedup = by_key["dedup"].last if "dedup" in by_key else None
    master = "local[2]" if not mode.standalone else (
        f"standalone: 1 master, {mode.standalone_workers} workers x 1 core, "
        f"executors {mode.executor_memory}"
    )  # fmt: skip
    load_start, load_rounds, load_end = loads
    skipped = [f"{c.label} failed, left out of the table: {c.failed}" for c in failed]
    failed_keys = {c.key for c in failed}
    chosen = os.environ.get(CONTENDERS_ENV, "").strip()
    if chosen and (left_out := [k for k in CONTENDER_KEYS if k not in {*by_key, *failed_keys}]):
        skipped.append(f"not run ({CONTENDERS_ENV}): {', '.join(left_out)}")
    if "sparkdelta" not in by_key and not _delta_spark_jars():
        skipped.append(
            "(s) skipped: no delta-spark jars for this Spark (`pidfence jars delta` says why), "
            "so Spark's own Delta sink cannot run"
        )
    notes = [
        f"load average (1/5/15 min) at start {load_start}, after each round "
        f"{' | '.join(load_rounds)}, at end {load_end} (2 cores shared with other jobs)",
        *(
            [
                f"ratios from this one run: pidfence/plain {ratios['pidfence_vs_plain']:.3f} "
                f"(target >= 0.8), pidfence's share of the no-op Python writer "
                f"{ratios['pidfence_share_of_noop_writer']:.3f}"
                + (
                    f", verification on/off {ratios['verify_on_vs_off']:.3f} (target >= 0.95)"
                    if "verify_on_vs_off" in ratios
                    else ""
                )
            ]
            if "pidfence_vs_plain" in ratios
            else []
        ),
        *(
            [
                f"pidfence (c) vs plain Parquet (a): best {ratios['pidfence_vs_plain']:.3f}, "
                f"median {ratios['pidfence_vs_plain_median']:.3f}; per-phase query-progress "
                "durations (median over rounds) in params.durations_ms"
            ]
            if "pidfence_vs_plain_median" in ratios
            else []
        ),
        f"raw topic filled in {fill_s:.1f}s ({n / fill_s:,.0f} records/s, confluent-kafka); "
        f"{sent['certified']:,} records carry a pfc certificate (first record of each producer "
        "in its partition)",
        "each query reads the topic from the start: same source, trigger and batch sizes; "
        f"{rounds} interleaved rounds, order reversed every other round, best time and median "
        "shown (per-round times in the JSON); before each measured query dirty pages are written "
        "back (sync), and the driver unloads the previous query's state stores and runs a full GC",
        (
            f"warm-up: each kind of query first runs once over a {warmup:,}-record topic (JVM and "
            "Python workers warm), and once more right before each of its measured queries "
            "(Spark ends Python workers idle for a minute)"
            if warmup
            else f"no warm-up query ({WARMUP_ENV}=0, a smoke run): the times mean nothing"
        ),
        f"spark.sql.execution.arrow.maxRecordsPerBatch={_arrow_batch():,} (the Arrow batches the "
        "Python writers receive; only Arrow paths use it)",
        "(n) is the ceiling of any Python streaming writer on this Spark: the JVM converts the "
        "Kafka rows to Arrow and ships them to a Python worker, which only counts them; "
        "'vs (n)' is each contender's share of it",
        "(b) state: state store memoryUsedBytes from the query progress; it keeps every "
        "message id for the 10-minute watermark delay, so it grows with the record count",
        "pidfence state: bytes of the state files a task reads to restore all partitions (full "
        "snapshot + deltas); it grows with producers and batches, not records",
        *(
            [
                f"(c) dropped {pf.extra['dropped']} of {n:,}; appended {pf.rows_out:,} (fresh "
                f"records sent: {sent['fresh']:,})"
                + (
                    f"; (v) dropped {vf.extra['dropped']}, forged reasons "
                    f"{vf.extra['forged_reasons'] or 'none'}"
                    if vf is not None
                    else ""
                )
            ]
            if pf is not None
            else []
        ),
        *skipped,
    ]
    return BenchReport(
        title=(
            f"sinks: {n:,} raw records, {PIDS:,} producers, {DUP_RATE:.0%} resends, "
            f"{mode.partitions} partitions, {master}"
        ),
        rows=rows,
        params={
            "mode": mode.name,
            "records": n,
            "pids": PIDS,
            "dup_rate": DUP_RATE,
            "partitions": mode.partitions,
            "max_offsets_per_trigger": per_trigger,
            "master": master,
            "driver_memory": mode.driver_memory if not mode.standalone else "1g",
            "fill_seconds": round(fill_s, 2),
            "rounds": rounds,
            "warmup_records": warmup,
            "seconds_per_round": {c.key: [round(t, 2) for t in c.times] for c in entries},
            "durations_ms": {c.key: _median_phases(c.phases) for c in entries},
            "arrow_max_records_per_batch": _arrow_batch(),
            "sent": sent,
            "ratios": {k: round(v, 4) for k, v in ratios.items()},
            "load_average": {"start": load_start, "rounds": load_rounds, "end": load_end},
            **(
                {"dedup": {**dedup.extra, "state_sampled_at_records": dedup.sampled_at}}
                if dedup is not None
                else {}
            ),
            **{
                c.key: {**c.last.extra, "state_sampled_at_records": c.last.sampled_at}
                for c in entries
                if c.last is not None and c.key in ("pidfence", "verify")
            },
        },
        notes=notes,
    )
