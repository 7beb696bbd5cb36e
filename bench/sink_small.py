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
every query are left out (Python workers starting, the first Delta commits), and so is the short
batch of the topic's last records (Spark rounds each partition's share of a batch down, so a tail
remains): ``PIDFENCE_BENCH_BATCHES`` measured batches per query, all full. Rounds alternate the
order (a, n, c, p then p, c, n, a). Shown per contender: the median and the 90th percentile batch
time, and the ratios of the medians to (a) (goal: pidfence at most 1.2x of it) and to (n) (what
the sink adds to any Python writer). Each query's output is counted: every record for (a) and
(n), the fresh ones for (c) and (p); a miss fails the run (exit 1) after the figures are written.
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


def _batch_ms(spark: Any, world: Any, build: Any, out: Path, batches: int) -> list[int]:
    """Run one query over the topic; the ``triggerExecution`` ms of the ``batches`` batches after
    the warm ones (the short tail batch left out)."""
    query = build(spark, str(out), f"{out}-ckpt").trigger(availableNow=True).start()
    query.awaitTermination()  # raises the query's failure
    return measured(world.batch_ms(query), batches)


def measured(ms: list[int], batches: int) -> list[int]:
    """The ``batches`` batch times after the first ``WARM`` of a query's ``ms``.

    Raises:
        RuntimeError: the query ran fewer batches than that.
    """
    if len(ms) < WARM + batches:
        raise RuntimeError(f"the query ran {len(ms)} batches, {WARM} warm + {batches} due")
    return ms[WARM : WARM + batches]


def _miss(world: Any, label: str, fmt: str, out: Path, records: int, fresh: int) -> str | None:
    """What is wrong with the rows a query of ``format(fmt)`` wrote at ``out``: the pidfence sink
    keeps the ``fresh`` records, the others every one (None: all that was due, no more)."""
    expected, what = (fresh, "the fresh records") if fmt == "pidfence" else (records, "all")
    miss: str | None = world.wrong_rows(label, world.written_rows(fmt, str(out)), expected, what)
    return miss


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
    wrong: list[str] = []
    with world.one_broker("pidfence-bench-sink-small-") as (kafka, work):
        topics, fresh = {}, {}
        for n in PARTITIONS:
            progress.update(task, description=f"filling {n} partitions with {records:,} records")
            topics[n] = create_topic(kafka.bootstrap, f"small-{n}", n)
            fresh[n] = world.fill_topic(kafka.bootstrap, topics[n], records, n, seed=n)["fresh"]
        progress.advance(task)
        with world.local_spark("pidfence-bench-sink-small") as spark:
            cores = int(spark.sparkContext.defaultParallelism)
            formats = {
                "plain": ("parquet", 0),
                "noop": ("pidfence_bench_noop", 0),
                "pidfence": ("pidfence", cores),
                "pertask": ("pidfence", 0),
            }
            for n in PARTITIONS:
                contenders = {
                    key: _writer(world, kafka.bootstrap, topics[n], fmt, tasks)
                    for key, (fmt, tasks) in formats.items()
                }
                for r in range(ROUNDS):
                    for key in list(contenders) if r % 2 == 0 else reversed(contenders):
                        progress.update(task, description=f"{n} partitions, round {r + 1}: {key}")
                        out = work / f"{key}-{n}-{r}"
                        times.setdefault((n, key), []).extend(
                            _batch_ms(spark, world, contenders[key], out, batches)
                        )
                        label = f"{n} partitions, round {r + 1}: {key}"
                        fmt = formats[key][0]
                        if miss := _miss(world, label, fmt, out, records, fresh[n]):
                            wrong.append(miss)
                        shutil.rmtree(out, ignore_errors=True)
                        shutil.rmtree(f"{out}-ckpt", ignore_errors=True)
                    loads.append(world.load_average())
                    progress.advance(task)
    report = _report(world, times, batches, loads)
    return report.check(wrong, "output rows: every query wrote what was due")


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
            "and its short last batch left out",
            f"load average (1/5/15 min) at start, after each round: {' | '.join(loads)} "
            "(2 cores shared with other jobs)",
        ],
    )
