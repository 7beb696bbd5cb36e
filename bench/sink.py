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
it checks what the measured runs wrote, not their speed). Every setting is checked before
anything starts; a run with any of them is recorded in ``sink-quick.json``.

Every measured run's output is counted and must hold every record (a, n, s) or exactly the fresh
ones (b, c, v): otherwise the figures are still written and the run fails (exit 1), naming the
contender and both counts.

State bytes are taken after the batch whose cumulative count is nearest to 1M and at the end:
for (b) the state store's ``memoryUsedBytes`` from the query progress, for the pidfence sinks the
bytes of the state files a task reads to restore every partition (newest full snapshot + deltas).

This file runs the rounds and makes the table; the raw topic, its broker and a local Spark are in
``_sink_world.py``, each contender's query, outcome and measurement in ``_sink_contenders.py``,
and (n) in ``_noop_writer.py``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from pidfence.benchkit import BadBenchSetting, BenchReport, load_bench

HERE = Path(__file__).resolve().parent
contending = load_bench("_sink_contenders", HERE)
world = contending.world  # one copy of each helper module, loaded once
Contender = Any  # a _sink_contenders.Contender (loaded by path: no static type)

RECORDS_ENV = "PIDFENCE_BENCH_RECORDS"
ROUNDS_ENV = "PIDFENCE_BENCH_ROUNDS"
WARMUP_ENV = "PIDFENCE_BENCH_WARMUP"
CONTENDERS_ENV = "PIDFENCE_BENCH_CONTENDERS"
ARROW_BATCH_ENV = "PIDFENCE_BENCH_ARROW_BATCH"
#: Every contender's key, in table order ((s) only where it can run).
CONTENDER_KEYS = ("plain", "noop", "dedup", "pidfence", "verify", "sparkdelta")
PER_TRIGGER = 500_000
WARMUP = 200_000
ARROW_BATCH = 100_000
#: Enough interleaved rounds that the best and the median tell the same story on a shared machine.
ROUNDS = 4


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


def _start_spark(mode: Mode, cluster: Any, bucket: str | None = None) -> Any:
    from pidfence.services import spark_session
    from pidfence.spark_sink.object_store import session_conf

    conf = {"spark.driver.memory": mode.driver_memory, **session_conf([bucket or ""])}
    jars = contending.delta_spark_jars()
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


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in the local mode (starts and stops its own Kafka)."""
    return run_mode(LOCAL, quick, progress)


@dataclass(frozen=True)
class Settings:
    """What the environment sets for a run, checked before anything starts."""

    records: int
    rounds: int
    warm_up: bool
    arrow_batch: int
    #: The contenders' keys ``PIDFENCE_BENCH_CONTENDERS`` names, (a) and (n) added; None: all.
    keys: frozenset[str] | None


def settings(quick: bool) -> Settings:
    """This run's settings from the environment.

    Raises:
        BadBenchSetting: a value the bench cannot run with (a key that is no contender's, a
            count that is no positive integer, a warm-up other than 0 or 1).
    """
    warm = os.environ.get(WARMUP_ENV, "1").strip() or "1"
    if warm not in ("0", "1"):
        raise BadBenchSetting(f"{WARMUP_ENV}={warm!r} must be 0 (no warm-up) or 1")
    raw = os.environ.get(CONTENDERS_ENV, "").strip()
    keys = None
    if raw:
        named = {k.strip() for k in raw.split(",") if k.strip()}
        if unknown := sorted(named - set(CONTENDER_KEYS)):
            raise BadBenchSetting(
                f"{CONTENDERS_ENV}: no contender {', '.join(unknown)} "
                f"(there are {', '.join(CONTENDER_KEYS)})"
            )
        keys = frozenset({*named, "plain", "noop"})
    return Settings(
        records=world.env_int(RECORDS_ENV, 2_000_000 if quick else 10_000_000),
        rounds=world.env_int(ROUNDS_ENV, ROUNDS),
        warm_up=warm == "1",
        arrow_batch=world.env_int(ARROW_BATCH_ENV, ARROW_BATCH),
        keys=keys,
    )


def _chosen(found: list[Contender], keys: frozenset[str] | None) -> list[Contender]:
    """The contenders ``keys`` names, else all (in table order)."""
    return found if keys is None else [c for c in found if c.key in keys]


def run_mode(mode: Mode, quick: bool, progress: Progress) -> BenchReport:
    """Run the sink benchmark in ``mode`` (starts and stops its own Kafka and Spark cluster)."""
    from pidfence.services import KafkaCluster, SparkStandaloneCluster, create_topic
    from pidfence.spark_sink import register

    chosen = settings(quick)  # before anything starts: a bad setting wastes no fill
    n, rounds = chosen.records, chosen.rounds
    per_trigger = min(PER_TRIGGER, max(1_000, n // 4))
    # Warm-up queries only make the timings fair; a smoke run (WARMUP=0) checks outputs alone.
    warm_up = chosen.warm_up
    warmup = min(WARMUP, max(1_000, n // 10)) if warm_up else 0
    load_start = world.load_average()
    task = progress.add_task("starting Kafka", total=2 + rounds)
    work = Path(tempfile.mkdtemp(prefix="pidfence-bench-sink-"))
    kafka: Any = None
    cluster: Any = None
    store: Any = None
    load_rounds: list[str] = []
    try:
        kafka = KafkaCluster(1, heap="768m").start()
        store, bucket = _start_store(mode, work)
        public_key, sign = world.signer(work / "keys")
        topic = create_topic(kafka.bootstrap, "bench-raw", mode.partitions)
        progress.update(task, description=f"filling the raw topic with {n:,} records")
        t0 = time.perf_counter()
        sent = world.fill_topic(kafka.bootstrap, topic, n, mode.partitions, sign=sign)
        fill_s = time.perf_counter() - t0
        progress.advance(task)

        warm = topic  # (no warm-up query reads it)
        if warm_up:
            warm = create_topic(kafka.bootstrap, "bench-warmup", mode.partitions)
            world.fill_topic(kafka.bootstrap, warm, warmup, mode.partitions, seed=2, sign=sign)
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
        try:
            register(spark)
            contending.noop.register(spark)
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(chosen.arrow_batch))
            field_contenders = _chosen(
                contending.contenders(kafka.bootstrap, topic, per_trigger, public_key), chosen.keys
            )
            warm_of: dict[str, Contender] = {}
            if warm_up:
                # The first queries in a JVM (and its Python workers) pay class loading, JIT and
                # imports; no contender should. Each kind of query runs once on the small topic.
                warmers = contending.contenders(kafka.bootstrap, warm, per_trigger, public_key)
                warm_of = {w.key: w for w in _chosen(warmers, chosen.keys)}
                for w in warm_of.values():
                    contending.warm(w, spark, _place(work, bucket, w.key, "warm-"))
            for r in range(rounds):
                # Interleaved rounds, best time kept, order reversed every other round: this
                # machine is shared and noisy, and whichever query follows (b) runs ~7 s slower
                # for its first batches (measured even after a re-warm, sync and GC), so no
                # contender may follow the same one in every round.
                order = list(field_contenders if r % 2 == 0 else reversed(field_contenders))
                k = (r // 2) % len(order)
                order = order[k:] + order[:k]
                for c in order:
                    progress.update(task, description=f"round {r + 1}: {c.label}")
                    # Warm again right before: Spark ends Python workers idle for a minute, so
                    # a Python sink measured after (b) or (s) would pay fresh workers.
                    if warm_up:
                        rewarm = _place(work, bucket, c.key, "rewarm-", r)
                        contending.warm(warm_of[c.key], spark, rewarm)
                        shutil.rmtree(rewarm, ignore_errors=True)
                        shutil.rmtree(f"{rewarm}-ckpt", ignore_errors=True)
                    out = _place(work, bucket, c.key, "", r)
                    contending.measure(c, spark, out)
                    shutil.rmtree(out, ignore_errors=True)
                    shutil.rmtree(f"{out}-ckpt", ignore_errors=True)
                load_rounds.append(world.load_average())
                progress.advance(task)
        finally:
            spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        if store is not None:
            store.stop()
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_end = world.load_average()
    return _report(
        mode,
        chosen,
        per_trigger,
        warmup,
        fill_s,
        sent,
        field_contenders,
        (load_start, load_rounds, load_end),
    )


def _start_store(mode: Mode, work: Path) -> tuple[Any, str | None]:
    """In the s3 mode: a SeaweedFS store in ``work``, its AWS environment set in this process
    (Spark's S3A, pyarrow and delta-rs read it there), and its bucket's URI."""
    if mode.store != "s3":
        return None, None
    from pidfence.services.seaweedfs import SeaweedFS

    store = SeaweedFS(work / "s3").start()
    try:
        os.environ.update(store.environment())
        return store, store.make_bucket("bench")
    except BaseException:
        store.stop()
        raise


def _place(work: Path, bucket: str | None, key: str, prefix: str, r: int | str = "") -> str:
    """Where a query writes: the store's bucket in the s3 mode (the no-op writer, which only
    counts rows into local files, stays local; the store is thrown away at the end, so the
    local ``rmtree`` after each query is a no-op there), else the work folder."""
    name = f"{prefix}{key}{r}"
    return str(work / name) if bucket is None or key == "noop" else f"{bucket}/{name}"


def _report(
    mode: Mode,
    chosen: Settings,
    per_trigger: int,
    warmup: int,
    fill_s: float,
    sent: dict[str, int],
    entries: list[Contender],
    loads: tuple[str, list[str], str],
) -> BenchReport:
    n, rounds = chosen.records, chosen.rounds
    best = {c.key: min(c.times) for c in entries}
    median = {c.key: statistics.median(c.times) for c in entries}
    by_key = {c.key: c for c in entries}
    plain_s, noop_s = best["plain"], best["noop"]
    rows: list[dict[str, Any]] = []
    for c in entries:
        if c.last is None:
            raise RuntimeError(f"{c.label} has no measured run")
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
    # Verification must refuse nothing here either (every producer's first record is signed):
    # (v) must hold the fresh records like (c).
    wrong = contending.wrong_outputs(entries, n, sent)
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
    master = (
        "local[2]"
        if not mode.standalone
        else (
            f"standalone: 1 master, {mode.standalone_workers} workers x 1 core, "
            f"executors {mode.executor_memory}"
        )
    )
    load_start, load_rounds, load_end = loads
    skipped = []
    if chosen.keys is not None and (left_out := [k for k in CONTENDER_KEYS if k not in by_key]):
        skipped.append(f"not run ({CONTENDERS_ENV}): {', '.join(left_out)}")
    if "sparkdelta" not in by_key and not contending.delta_spark_jars():
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
        f"spark.sql.execution.arrow.maxRecordsPerBatch={chosen.arrow_batch:,} (the Arrow batches "
        "the Python writers receive; only Arrow paths use it)",
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
            f"sinks: {n:,} raw records, {world.PIDS:,} producers, {world.DUP_RATE:.0%} resends, "
            f"{mode.partitions} partitions, {master}"
        ),
        rows=rows,
        params={
            "mode": mode.name,
            "records": n,
            "pids": world.PIDS,
            "dup_rate": world.DUP_RATE,
            "partitions": mode.partitions,
            "max_offsets_per_trigger": per_trigger,
            "master": master,
            "driver_memory": mode.driver_memory if not mode.standalone else "1g",
            "fill_seconds": round(fill_s, 2),
            "rounds": rounds,
            "warmup_records": warmup,
            "seconds_per_round": {c.key: [round(t, 2) for t in c.times] for c in entries},
            "durations_ms": {c.key: contending.median_phases(c.phases) for c in entries},
            "arrow_max_records_per_batch": chosen.arrow_batch,
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
    ).check(wrong, "output rows: every measured run wrote every record, or the fresh ones")
