"""``pidfence bench sink_aged``: a batch on a month-old output against one on a fresh output.

Issue 45: every batch must cost the same however long the sink has run. One raw topic of the
shape ``pidfence bench sink`` fills (``fill_topic``: 1k producers, 5% resends) over 2 partitions
is read in small batches (``maxOffsetsPerTrigger`` 5,000) into the pidfence sink on one
``local[2]`` SparkSession:

1. a seed run commits ``SEED`` batches to a fresh output;
2. ``_aged_output.age_output`` writes beside it the output a month at a 1 s trigger leaves
   (``PIDFENCE_BENCH_AGE_DAYS``, default 30: 2,592,000 batches; its docstring says what is
   generated and what stands in), standing at the same Kafka offsets with the same state;
3. both continue over the same records, ``WARM`` + ``PIDFENCE_BENCH_BATCHES`` batches each per
   round, in alternating order over ``ROUNDS`` rounds.

Each batch's time is the query progress's ``triggerExecution``; the first ``WARM`` batches of each
query are left out. Shown: median and 90th percentile of each output, and the ratio of the medians
(goal: aged at most 1.1x fresh). After each query the output's log table must have gained exactly
the fresh records among the Kafka offsets its committed batches read; a miss fails the run (exit
1) after the figures are written. A query that runs no new batch for ``STALL_S`` seconds (the
topic ran out, or it hangs) ends the run with that error.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from pidfence.benchkit import BenchReport, load_bench

BATCH = 5_000
PARTITIONS = 2
SEED = 6
WARM = 3
ROUNDS = 2
GOAL = 1.1
AGE_ENV = "PIDFENCE_BENCH_AGE_DAYS"
BATCHES_ENV = "PIDFENCE_BENCH_BATCHES"
#: A query that runs no new batch for this long has run out of records, or hangs.
STALL_S = 180.0
SEED_OF_TOPIC = 7


@dataclass
class Run:
    """One query's job: where it writes, and what its batches must leave there."""

    world: Any
    out: Path
    #: Per partition, the fresh records among its first k (``_sink_world.fresh_before``).
    fresh: list[list[int]]
    #: What failed the output check so far.
    wrong: list[str] = field(default_factory=list)


def _run(spark: Any, run: Run, bootstrap: str, topic: str, n: int, label: str) -> list[int]:
    """Run the pidfence sink at ``run.out`` until ``n`` batches read records; their times (ms).
    What the query wrote is checked against the records its committed batches read."""
    before = _committed(run)
    df = run.world.kafka_df(spark, bootstrap, topic, BATCH)
    query = (
        df.writeStream.format("pidfence")
        .option("path", str(run.out))
        .option("checkpointLocation", f"{run.out}-ckpt")
        .start()
    )
    try:
        wait_batches(query, n)
    finally:
        query.stop()
    if miss := output_miss(run, before, label):
        run.wrong.append(miss)
    return list(run.world.batch_ms(query)[:n])


def wait_batches(
    query: Any,
    n: int,
    stall_s: float = STALL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until ``query`` has run ``n`` batches that read records.

    Raises:
        RuntimeError: the query failed or stopped, or ran no new batch for ``stall_s`` seconds.
    """
    seen, since = -1, clock()
    while (done := sum(1 for p in query.recentProgress if p.numInputRows)) < n:
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        if not query.isActive:
            raise RuntimeError(f"the query stopped after {done} of {n} batches")
        if done != seen:
            seen, since = done, clock()
        elif clock() - since > stall_s:
            raise RuntimeError(
                f"no new batch for {stall_s:g} s after {done} of {n}: the topic ran out of "
                "records, or the query hangs"
            )
        sleep(0.2)


def _committed(run: Run) -> tuple[int, int]:
    """(the newest committed batch or -1, the log table's rows) of ``run.out`` now."""
    from pidfence.spark_sink.output import Output

    if not run.out.exists():
        return -1, 0
    ids = Output.reading(str(run.out)).committed_ids()
    return (ids[-1] if ids else -1), run.world.written_rows("pidfence", str(run.out))


def output_miss(run: Run, before: tuple[int, int], label: str) -> str | None:
    """What is wrong with the rows the batches committed after ``before`` (a :func:`_committed`)
    added to the log table: they must be the fresh records among the Kafka offsets those batches
    read (None: they are)."""
    from pidfence.spark_sink.output import Output

    top, rows = before
    due = 0
    for manifest in Output.reading(str(run.out)).manifests(top):
        for part in manifest.parts:
            counts = run.fresh[part.partition]
            due += counts[part.kafka_last + 1] - counts[part.kafka_first]
    got = run.world.written_rows("pidfence", str(run.out)) - rows
    miss: str | None = run.world.wrong_rows(label, got, due, "the fresh records its batches read")
    return miss


def run(quick: bool, progress: Progress) -> BenchReport:
    """Seed, age, then run both outputs side by side (starts and stops its own Kafka, Spark)."""
    from pidfence.services import create_topic

    here = Path(__file__).resolve().parent
    world = load_bench("_sink_world", here)
    aging = load_bench("_aged_output", here)
    days = world.env_int(AGE_ENV, 30)
    batches = world.env_int(BATCHES_ENV, 15 if quick else 30)
    records = BATCH * (SEED + 2 + ROUNDS * (WARM + batches + 1))
    loads = [world.load_average()]
    task = progress.add_task("starting Kafka", total=3 + ROUNDS)
    times: dict[str, list[int]] = {"fresh": [], "aged": []}
    counts = world.fresh_before(records, PARTITIONS, seed=SEED_OF_TOPIC)
    wrong: list[str] = []
    with world.one_broker("pidfence-bench-sink-aged-") as (kafka, work):
        progress.update(task, description=f"filling {PARTITIONS} partitions, {records:,} records")
        topic = create_topic(kafka.bootstrap, "aged", PARTITIONS)
        world.fill_topic(kafka.bootstrap, topic, records, PARTITIONS, seed=SEED_OF_TOPIC)
        progress.advance(task)
        with world.local_spark("pidfence-bench-sink-aged") as spark:
            fresh, aged = work / "fresh", work / "aged"
            runs = {
                "fresh": Run(world, fresh, counts, wrong),
                "aged": Run(world, aged, counts, wrong),
            }
            progress.update(task, description=f"seed: {SEED} batches")
            _run(spark, runs["fresh"], kafka.bootstrap, topic, SEED, "seed run")
            progress.advance(task)
            progress.update(task, description=f"ageing a copy by {days} days")
            started = time.perf_counter()
            made = aging.age_output(
                fresh, Path(f"{fresh}-ckpt"), aged, Path(f"{aged}-ckpt"), days * aging.DAY
            )
            made["seconds"] = round(time.perf_counter() - started, 1)
            made["bytes"] = sum(p.stat().st_size for p in aged.rglob("*") if p.is_file())
            progress.advance(task)
            for r in range(ROUNDS):
                order = ("fresh", "aged") if r % 2 == 0 else ("aged", "fresh")
                for key in order:
                    progress.update(task, description=f"round {r + 1}: {key}")
                    label = f"round {r + 1}: {key} output"
                    ms = _run(spark, runs[key], kafka.bootstrap, topic, WARM + batches, label)
                    times[key].extend(ms[WARM:])
                loads.append(world.load_average())
                progress.advance(task)
    report = _report(world, times, days, batches, made, loads)
    return report.check(wrong, "output rows: every query wrote the fresh records it read")


def _report(
    world: Any,
    times: dict[str, list[int]],
    days: int,
    batches: int,
    made: dict[str, Any],
    loads: list[str],
) -> BenchReport:
    fresh = statistics.median(times["fresh"])
    rows = [
        {
            "output": label,
            "batches": len(times[key]),
            "median ms": statistics.median(times[key]),
            "p90 ms": world.p90(times[key]),
            "max ms": max(times[key]),
            "vs fresh": statistics.median(times[key]) / fresh,
        }
        for key, label in (("fresh", f"fresh ({SEED} batches old)"), ("aged", f"{days} days old"))
    ]
    ratio = rows[1]["vs fresh"]
    entries = made["delta_log_entries"]
    return BenchReport(
        title=f"a batch on a {days}-day-old output vs a fresh one: {BATCH:,} records, "
        f"{PARTITIONS} partitions, local[2]",
        rows=rows,
        params={
            "records_per_batch": BATCH,
            "partitions": PARTITIONS,
            "age_days": days,
            "measured_batches_per_query": batches,
            "warm_batches_left_out": WARM,
            "rounds": ROUNDS,
            "aged_output": made,
            "per_batch_ms": times,
            "ratio_of_medians": round(ratio, 3),
            "load_average": loads,
        },
        notes=[
            f"aged / fresh, median batch time: {ratio:.2f}x "
            f"({'met' if ratio <= GOAL else 'not met'}; goal <= {GOAL}x)",
            f"aged output: {made['batches']:,} batches committed ({days} days at a 1 s trigger), "
            f"{made['live_batches']} live, {made['segments']} folded segments, "
            f"{made['pidfence_files']} files under _pidfence/; _delta_log/ entries kept by the "
            f"tables' log retention: log {entries['log']:,}, rejects {entries['rejects']:,}; "
            f"generated in {made['seconds']} s",
            f"same topic, records, state and SparkSession for both; {ROUNDS} rounds in "
            f"alternating order; the first {WARM} batches of each query left out",
            f"load average (1/5/15 min) at start, after each round: {' | '.join(loads)} "
            "(2 cores shared with other jobs)",
        ],
    )
