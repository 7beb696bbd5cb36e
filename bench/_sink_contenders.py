"""The contenders of ``pidfence bench sink``: how each builds its query, reads what it wrote, and
is measured (see ``bench/sink.py`` for the table they make). Every measured run's output rows are
kept and held against what the raw topic holds (:func:`wrong_outputs`)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidfence.benchkit import load_bench

HERE = Path(__file__).resolve().parent
world = load_bench("_sink_world", HERE)
noop = load_bench("_noop_writer", HERE)


def _run(writer: Any) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()  # raises the query's failure
    elapsed = time.perf_counter() - started
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
    if best is None:
        raise RuntimeError("the query read no records: no batch to take the state of")
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
    #: Per measured round, the rows its output holds.
    outputs: list[int] = field(default_factory=list)
    last: Outcome | None = None


#: The contenders whose output must hold every record sent; the others (b, c, v) deduplicate,
#: and must hold exactly the fresh ones.
KEEPS_ALL = {"plain", "noop", "sparkdelta"}


def wrong_outputs(entries: list[Contender], n: int, sent: dict[str, int]) -> list[str]:
    """Each measured run whose output did not hold what the topic's records make: all ``n`` for
    the sinks that keep every record, ``sent["fresh"]`` for the deduplicating ones."""
    wrong = []
    for c in entries:
        expected, what = (n, "every record") if c.key in KEEPS_ALL else (sent["fresh"], "fresh")
        for r, got in enumerate(c.outputs):
            if found := world.wrong_rows(f"{c.label}, round {r + 1},", got, expected, what):
                forged = c.last.extra.get("forged_reasons") if c.last is not None else None
                wrong.append(found + (f"; forged: {forged}" if forged else ""))
    return wrong


def _parquet_rows(out: str, progress: list[dict[str, Any]]) -> Outcome:
    del progress
    return Outcome(world.written_rows("parquet", out))


def _dedup_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    at, mid = _at_million(progress)
    return Outcome(
        world.written_rows("parquet", out),
        _store_bytes(mid),
        _store_bytes(progress[-1]),
        at,
        {
            "rows_in_state_at_1M": _store_rows(mid),
            "rows_in_state_at_end": _store_rows(progress[-1]),
        },
    )


def _pidfence_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    from pidfence.spark_sink.batch_report import summarise

    summary = summarise(out)
    at, mid = _at_million(progress)
    mid_bytes, mid_files = _chain_bytes(out, int(mid["batchId"]))
    end_bytes, end_files = _chain_bytes(out, int(progress[-1]["batchId"]))
    return Outcome(
        world.written_rows("pidfence", out),
        mid_bytes,
        end_bytes,
        at,
        {
            "appended_by_account": summary.appended,
            "dropped": dict(summary.dropped),
            "forged_reasons": dict(summary.forged),
            "state_files_at_1M": mid_files,
            "state_files_at_end": end_files,
            "batches": len(summary.batches),
        },
    )


def _noop_outcome(out: str, progress: list[dict[str, Any]]) -> Outcome:
    del progress
    return Outcome(world.written_rows("pidfence_bench_noop", out))


def delta_spark_jars() -> list[Path]:
    """delta-spark jars for the installed Spark (fetched on first use), or none when they cannot
    be had."""
    from pidfence.jars import JarsError, jars

    try:
        return jars("delta")
    except JarsError:
        return []


def contenders(bootstrap: str, topic: str, per_trigger: int, public_key: Path) -> list[Contender]:
    """The contenders of this run, in their first-round order."""

    def source(spark: Any) -> Any:
        return world.kafka_df(spark, bootstrap, topic, per_trigger)

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
    if delta_spark_jars():

        def delta_rows(out: str, progress: list[dict[str, Any]]) -> Outcome:
            del progress
            return Outcome(world.written_rows("delta", out))

        rows.append(
            Contender("sparkdelta", "(s) Spark Delta sink, no dedup", writer("delta"), delta_rows)
        )
    return rows


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


def measure(c: Contender, spark: Any, out: str) -> None:
    """Run ``c`` once into ``out`` from a settled machine; keep its time, phases and outcome."""
    _settle(spark)
    seconds, query_progress = _run(c.build(spark, out, f"{out}-ckpt"))
    outcome = c.outcome(out, query_progress)
    c.times.append(seconds)
    c.phases.append(_phase_sums(query_progress))
    c.outputs.append(outcome.rows_out)
    c.last = outcome


def _phase_sums(progress: list[dict[str, Any]]) -> dict[str, int]:
    """Each ``durationMs`` phase (addBatch: the sink's tasks and commit; walCommit,
    commitOffsets: Spark's checkpoint) summed over a query's batches."""
    sums: dict[str, int] = {}
    for p in progress:
        for phase, ms in (p.get("durationMs") or {}).items():
            sums[phase] = sums.get(phase, 0) + int(ms)
    return sums


def median_phases(rounds: list[dict[str, int]]) -> dict[str, float]:
    """Each phase's median over the measured rounds."""
    phases = sorted({k for r in rounds for k in r})
    return {k: float(statistics.median(r.get(k, 0) for r in rounds)) for k in phases}


def warm(c: Contender, spark: Any, out: str) -> None:
    """Run ``c`` once, unmeasured (JVM, JIT and Python workers warm)."""
    _run(c.build(spark, out, f"{out}-ckpt"))
