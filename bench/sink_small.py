"""``pidfence bench sink_small``: a batch's fixed cost, small batches over many partitions.

Issue 45, point 3: with micro-batches of 5,000 records a batch's fixed cost dominates, and it
grows with partitions (each partition's task loads state, writes files, and a Python worker
round trip). For 4 and 64 partitions, one raw topic of the shape ``pidfence bench sink`` fills
(``fill_topic``: 1k producers, 5% resends, ``pf`` headers) is read from the start by each
contender with the same trigger (available-now, ``maxOffsetsPerTrigger`` 5,000: batches of 5,000
records) on one ``local[2]`` SparkSession:

(a) Spark's plain Parquet file sink, no deduplication;
(n) the no-op Python Arrow writer of ``pidfence bench sink``: a Python data source whose tasks
    only consume their rows, the floor of any sink written in Python (DESIGN: no JVM writer);
(c) the pidfence sink (broker rules, Delta log and rejects tables, its bookkeeping) as
    ``pidfence sink`` and ``build_query`` run it: the Kafka partitions coalesced into one task
    per core (``--tasks``), each partition whole in one task;
(p) the pidfence sink with one task per Kafka partition (``--tasks 0``), as a query that puts
    ``format("pidfence")`` straight on the Kafka source runs it.

Each batch's time is the query progress's ``triggerExecution``; the first ``WARM`` batches of
every query are left out (Python workers starting, the first Delta commits). Rounds alternate
the order (a, n, c, p then p, c, n, a). Shown per contender: the median and the 90th percentile
batch time, and the ratios of the medians to (a) (goal: pidfence at most 1.2x of it) and to (n)
(what the sink adds to any Python writer). ``PIDFENCE_BENCH_BATCHES`` overrides the measured
batches per query.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench

BATCH = 5_000
PARTITIONS = (4, 64)
WARM = 5
BATCHES_ENV = "PIDFENCE_BENCH_BATCHES"
ROUNDS = 2
GOAL = 1.2


def _batch_ms(spark: Any, world: Any, build: Any, out: Path) -> list[int]:
    """Run one query over the topic; each batch's ``triggerExecution`` ms after the warm ones."""
    query = build(spark, str(out), f"{out}-ckpt").trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return list(world.batch_ms(query)[WARM:])


def _writer(world: Any, bootstrap: str, topic: str, fmt: str, tasks: int = 0) -> Any:
    def build(spark: Any, out: str, ckpt: str) -> Any:
        df = world.kafka_df(spark, bootstrap, topic, BATCH)
        if tasks:
            df = df.coalesce(tasks)  # what build_query does (pidfence.spark_sink.pipeline)
        return df.writeStream.format(fmt).option("path", out).option("checkpointLocation", ckpt)

    return build


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run both partition counts (starts and stops its own Kafka and Spark)."""
    from pidfence.services import create_topic

    world = load_bench("_sink_world", Path(__file__).resolve().parent)
    batches = world.env_int(BATCHES_ENV, 15 if quick else 30)
    records = BATCH * (WARM + batches)
    loads = [world.load_average()]
    task = progress.add_task("starting Kafka", total=1 + len(PARTITIONS) * ROUNDS)
    times: dict[tuple[int, str], list[int]] = {}
    with world.one_broker("pidfence-bench-sink-small-") as (kafka, work):
        topics = {}
        for n in PARTITIONS:
            progress.update(task, description=f"filling {n} partitions with {records:,} records")
            topics[n] = create_topic(kafka.bootstrap, f"small-{n}", n)
            world.fill_topic(kafka.bootstrap, topics[n], records, n, seed=n)
        progress.advance(task)
        with world.local_spark("pidfence-bench-sink-small") as spark:
            cores = int(spark.sparkContext.defaultParallelism)
            formats = (
                ("plain", "parquet", 0),
                ("noop", "pidfence_bench_noop", 0),
                ("pidfence", "pidfence", cores),
                ("pertask", "pidfence", 0),
            )
            for n in PARTITIONS:
                contenders = {
                    key: _writer(world, kafka.bootstrap, topics[n], fmt, tasks)
                    for key, fmt, tasks in formats
                }
                for r in range(ROUNDS):
                    for key in list(contenders) if r % 2 == 0 else reversed(contenders):
                        progress.update(task, description=f"{n} partitions, round {r + 1}: {key}")
                        out = work / f"{key}-{n}-{r}"
                        times.setdefault((n, key), []).extend(
                            _batch_ms(spark, world, contenders[key], out)
                        )
                        shutil.rmtree(out, ignore_errors=True)
                        shutil.rmtree(f"{out}-ckpt", ignore_errors=True)
                    loads.append(world.load_average())
                    progress.advance(task)
    return _report(world, times, batches, loads)


def _report(
    world: Any, times: dict[tuple[int, str], list[int]], batches: int, loads: list[str]
) -> BenchReport:
    rows = []
    ratios, over_noop = {}, {}
    labels = (
        ("plain", "(a) Parquet sink"),
        ("noop", "(n) no-op Python writer"),
        ("pidfence", "(c) pidfence sink, a task per core"),
        ("pertask", "(p) pidfence sink, a task per partition"),
    )
    for n in PARTITIONS:
        plain = statistics.median(times[(n, "plain")])
        noop = statistics.median(times[(n, "noop")])
        for key, label in labels:
            ms = times[(n, key)]
            rows.append(
                {
                    "partitions": n,
                    "contender": label,
                    "batches": len(ms),
                    "median ms": statistics.median(ms),
                    "p90 ms": world.p90(ms),
                    "ms per partition": statistics.median(ms) / n,
                    "vs (a)": statistics.median(ms) / plain,
                    "vs (n)": statistics.median(ms) / noop,
                }
            )
        ratios[n] = statistics.median(times[(n, "pidfence")]) / plain
        over_noop[n] = statistics.median(times[(n, "pidfence")]) / noop
    verdicts = ", ".join(
        f"{n} partitions {r:.2f}x ({'met' if r <= GOAL else 'not met'})" for n, r in ratios.items()
    )
    return BenchReport(
        title=f"small batches: {BATCH:,} records per batch, 4 and 64 partitions, local[2]",
        rows=rows,
        params={
            "records_per_batch": BATCH,
            "measured_batches_per_query": batches,
            "warm_batches_left_out": WARM,
            "rounds": ROUNDS,
            "per_batch_ms": {f"{n}/{k}": v for (n, k), v in times.items()},
            "ratio_of_medians": {str(n): round(r, 3) for n, r in ratios.items()},
            "ratio_to_noop": {str(n): round(r, 3) for n, r in over_noop.items()},
            "load_average": loads,
        },
        notes=[
            f"pidfence / plain Parquet, median batch time: {verdicts}; goal <= {GOAL}x",
            "pidfence / no-op Python writer: "
            + ", ".join(f"{n} partitions {r:.2f}x" for n, r in over_noop.items()),
            "same topic, trigger (availableNow, maxOffsetsPerTrigger 5,000) and SparkSession for "
            f"all; {ROUNDS} rounds in alternating order; the first {WARM} batches of each query "
            "left out",
            f"load average (1/5/15 min) at start, after each round: {' | '.join(loads)} "
            "(2 cores shared with other jobs)",
        ],
    )
