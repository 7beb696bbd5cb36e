"""What the sink benches run on: the raw topic, one Kafka broker, a local Spark and their knobs.

``pidfence bench sink`` (and its s3 and standalone64 modes), ``sink_small`` and ``sink_aged`` fill
their raw topics with :func:`fill_topic`: 1k producers, 5% resends, pre-encoded ``pf`` headers and,
with a signer, a signed ``pfc`` certificate on each producer's first record in its partition.
What a query wrote is counted with :func:`written_rows` and held against what was sent: every
record for the sinks that keep all, the fresh ones (:func:`fresh_before`) for the deduplicating.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pidfence.benchkit import BadBenchSetting, load_bench
from pidfence.wire import encode_pf

HERE = Path(__file__).resolve().parent
PIDS = 1_000
GENERATION = 7
DUP_RATE = 0.05
VALUE = b"x" * 64
#: The certificates outlive the run by far: the bench measures verification, not expiry.
CERT_LIFETIME_MS = 7 * 86_400_000


def env_int(name: str, default: int) -> int:
    """The positive integer in environment variable ``name``, else ``default``.

    Raises:
        BadBenchSetting: set to something else.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise BadBenchSetting(f"{name}={raw!r} must be a positive integer") from None
    if value < 1:
        raise BadBenchSetting(f"{name}={raw!r} must be a positive integer")
    return value


def load_average() -> str:
    """The 1/5/15-minute load averages, for the notes (the machine is shared)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


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
        load_bench("_noop_writer", HERE).register(spark)
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


def kafka_df(spark: Any, bootstrap: str, topic: str, per_trigger: int) -> Any:
    """A stream of the raw topic from its start, ``per_trigger`` records a batch at most, with
    the headers."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .load()
    )


def _records(n: int, seed: int) -> Iterator[tuple[int, int, bool, bool]]:
    """The records :func:`fill_topic` sends, in order: (pid, seq, resent, certified)."""
    rng = random.Random(seed)
    pids = np.random.default_rng(seed).integers(1, PIDS + 1, size=n).tolist()
    next_seq = [0] * (PIDS + 1)
    for pid in pids:
        resent = bool(next_seq[pid]) and rng.random() < DUP_RATE
        if resent:
            seq = next_seq[pid] - 1 - rng.randrange(min(3, next_seq[pid]))
        else:
            seq = next_seq[pid]
            next_seq[pid] += 1
        yield pid, seq, resent, seq == 0 and next_seq[pid] == 1


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
    for pid, seq, again, first in _records(n, seed):
        resent += again
        key = b"%d:%d" % (pid, seq)
        headers: list[tuple[str, str | bytes | None]] = [("pf", encode_pf(pid, GENERATION, seq))]
        if sign is not None and first:
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


def fresh_before(n: int, partitions: int, seed: int = 1) -> list[list[int]]:
    """Per partition of a topic :func:`fill_topic` wrote (one producer, in order, from offset 0):
    ``counts[p][k]`` is how many of its first ``k`` records are fresh (not resent)."""
    counts = [[0] for _ in range(partitions)]
    for pid, _, resent, _ in _records(n, seed):
        made = counts[pid % partitions]
        made.append(made[-1] + (not resent))
    return counts


def written_rows(fmt: str, out: str) -> int:
    """Rows a query of ``format(fmt)`` wrote at ``out``, as a reader counts them: the Parquet
    files' or Spark's Delta table's rows, the pidfence sink's log table by its Delta log (which a
    month-old output of ``sink_aged`` keeps without every data file), or the per-batch counts of
    the no-op writer (which writes nothing else)."""
    if fmt == "parquet":
        import pyarrow.dataset as ds

        return int(ds.dataset(out, format="parquet").count_rows())
    if fmt == "pidfence_bench_noop":  # one ``BATCH.rows`` file per batch, its row count
        return sum(int(p.read_text()) for p in Path(out).glob("*.rows"))
    if fmt == "pidfence":  # the log table's files by their Delta add actions' record counts
        import pyarrow as pa
        from deltalake.exceptions import TableNotFoundError

        from pidfence.spark_sink.delta.table import open_table

        try:
            table = open_table(out, "log", create=False, reading=True)
        except TableNotFoundError:
            return 0  # no batch committed
        files = pa.table(table.get_add_actions())
        counts = files.column("num_records")
        if counts.null_count:
            raise RuntimeError(f"{out}: {counts.null_count} log files without a record count")
        return int(sum(counts.to_pylist()))
    if fmt == "delta":
        from deltalake import DeltaTable

        return int(DeltaTable(out).to_pyarrow_dataset().count_rows())
    raise ValueError(f"no row count for format {fmt!r}")


def wrong_rows(label: str, got: int, expected: int, what: str) -> str | None:
    """The failure of a contender that wrote ``got`` rows where ``expected`` were due (None: it
    wrote them all, no more)."""
    if got == expected:
        return None
    return f"{label} wrote {got:,} rows, expected {expected:,} ({what})"


def signer(key_dir: Path) -> tuple[Path, Callable[[str, int, int, int, int], bytes]]:
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
