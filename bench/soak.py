"""``pidfence bench soak``: the pipeline for 30 minutes (``--quick``: 3) with the demo's faults
repeated, memory, batch times and state sampled every minute, zero anomalies required.

ZooKeeper, Kafka and two lease servers are started for the run; four ``pidfence produce``
processes (100 records/s each, 20 s leases, so they roll to a new pid every ~19 s) write a
4-partition raw topic; a pidfence streaming query (processing-time trigger every 2 s, its own
Spark driver process, ``local[2]``) reads it. Every 5 minutes (1 in runs under 10 minutes) one
round of faults: p0 SIGKILLed and resumed, p1 paused, replaced and woken as a zombie, p2 paused
until its lease has ended (it must stop by itself); p3 re-sends an acknowledged record every 100
throughout. Halfway between rounds the sink is restarted, alternately with SIGTERM and by a crash
(SIGKILL of the driver, its JVM and its Python workers). ``PIDFENCE_SOAK_MINUTES`` overrides the
duration, ``PIDFENCE_SOAK_OUT`` keeps the run's files (default: a temporary folder).

The figures: per process tree (found from the pids started here, never by name) its RSS over time,
the per-batch time from the query progress, the bytes under the output's ``_state``; each as
first/last/min/max and the least-squares slope per 10 minutes over the run and over its second
half. The plot goes to ``bench/results/soak.png`` (``soak-quick.png`` for ``--quick`` or a
``PIDFENCE_SOAK_MINUTES`` run, whose figures go to ``soak-quick.json``).

The run fails (exit 1, figures written) on any anomaly, any unexpected process exit, or a fault
its schedule starts that never happened: a soak whose faults did not fire proves nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.progress import Progress

from pidfence.benchkit import BenchReport, partial_run
from pidfence.demo.soak import SoakResult, run_soak
from pidfence.demo.soak.config import SoakConfig, config_from_env
from pidfence.demo.soak.figures import batch_time_stats, figure_rows
from pidfence.demo.soak.plot import write_plot

RESULTS = Path(__file__).resolve().parent / "results"
#: RSS and state lines are judged after this many seconds (JVM heaps grow at first).
WARMUP_S = 120.0


def run(quick: bool, progress: Progress) -> BenchReport:
    """Run the soak (starts and stops its own ZooKeeper, Kafka, lease servers and Spark)."""
    plot = RESULTS / ("soak-quick.png" if partial_run(quick) else "soak.png")
    return soak_bench(config_from_env(quick, plot), progress)


def soak_bench(config: SoakConfig, progress: Progress) -> BenchReport:
    """Run ``config`` and turn the result into the bench's report (and the plot)."""
    task = progress.add_task(f"soak: {config.minutes:g} min", total=None)

    def log(line: str) -> None:
        progress.console.log(line)
        progress.update(task, description=f"soak: {line[:100]}")

    result = run_soak(config, log=log)
    warmup = min(WARMUP_S, config.seconds / 4)
    rows = figure_rows(result.samples, warmup_s=warmup)
    stats = batch_time_stats(result.batches)
    if config.plot is not None:
        write_plot(
            result.samples,
            result.batches,
            result.faults,
            config.plot,
            wall_start=result.wall_started,
            title=f"pidfence soak: {config.minutes:g} min, {config.producers} producers x "
            f"{config.rate:g}/s, trigger {config.trigger_s:g} s, faults every "
            f"{config.fault_every_s / 60:g} min{_sink_mode(config)}",
        )
    misses = soak_misses(result, config)
    return BenchReport(
        title=(
            f"soak: {config.minutes:g} min, {config.producers} producers at {config.rate:g}/s, "
            f"{config.partitions} partitions, trigger {config.trigger_s:g} s, faults every "
            f"{config.fault_every_s:g} s{_sink_mode(config)}"
        ),
        columns=list(rows[0]) if rows else ["series"],
        rows=rows,
        params={
            "ok": not misses,
            "minutes": config.minutes,
            "producers": config.producers,
            "rate_per_producer": config.rate,
            "partitions": config.partitions,
            "lease_lifetime_s": config.lease_lifetime_s,
            "fault_every_s": config.fault_every_s,
            "sample_s": config.sample_s,
            "trigger_s": config.trigger_s,
            "master": config.master,
            "sink_restarts": config.sink_restarts,
            "slopes_after_s": warmup,
            "anomalies": result.anomalies,
            "informational": result.informational,
            "examples": result.examples,
            "counts": result.counts,
            "verdicts": result.verdicts,
            "faults_configured": configured_faults(config),
            "faults_happened": dict(result.faults_happened),
            "failures": result.failures,
            "batch_time": stats,
            "phases_s": result.phases_s,
            "plot": str(config.plot) if config.plot else None,
            "out": str(config.out),
            "samples": result.samples,
            "faults": result.faults,
        },
        notes=_notes(result, rows, stats, warmup),
    ).check(misses, "passed: zero anomalies, no unexpected exit, every configured fault happened")


def configured_faults(config: SoakConfig) -> list[str]:
    """The faults the run's schedule starts at least once (``pidfence.demo.soak.run``): a round
    of producer faults at ``first_fault_s`` and every ``fault_every_s`` after, a sink restart
    halfway between rounds (SIGTERM, then a crash, alternately), none later than a lease
    lifetime plus 15 s before the end."""
    last_start = config.seconds - config.lease_lifetime_s - 15.0
    faults = []
    if config.first_fault_s <= last_start:
        faults += ["kill", "zombie", "lease-zombie"]
    first_sink = config.first_fault_s + config.fault_every_s / 2
    if config.sink_restarts and first_sink <= last_start:
        faults.append("sink-restart")
        if first_sink + config.fault_every_s <= last_start:
            faults.append("sink-crash")
    return faults


def soak_misses(result: SoakResult, config: SoakConfig) -> list[str]:
    """Why the soak failed, each reason named: anomalies, unexpected exits, and configured faults
    that never happened (empty: it passed)."""
    misses = []
    if bad := {k: v for k, v in result.anomalies.items() if v}:
        misses.append(f"anomalies {bad} (zero required)")
    if result.failures:
        misses.append(f"unexpected exits: {'; '.join(result.failures)}")
    if never := [f for f in configured_faults(config) if not result.faults_happened.get(f)]:
        misses.append(
            f"configured faults that never happened: {', '.join(never)} (each must happen at "
            f"least once; happened: {dict(result.faults_happened) or 'none'})"
        )
    return misses


def _sink_mode(config: SoakConfig) -> str:
    return "" if config.sink_restarts else ", one sink instance (never restarted)"


def _notes(
    result: SoakResult, rows: list[dict[str, Any]], stats: dict[str, float], warmup: float
) -> list[str]:
    bad = {k: v for k, v in result.anomalies.items() if v}
    notes = [
        f"anomalies: {bad or 'none'} (event_duplicate "
        f"{result.anomalies.get('event_duplicate')}, event_lost "
        f"{result.anomalies.get('event_lost')}); informational {result.informational}",
        f"faults that happened: {dict(result.faults_happened)}; unexpected exits: "
        f"{result.failures or 'none'}",
        f"verdicts: {result.verdicts}",
        f"streaming batches: {stats or 'none'}",
        f"slopes are least-squares per 10 minutes, from {warmup:g} s on; '2nd half' uses the "
        "samples of the run's second half only",
    ]
    rising = [
        f"{r['series']} {r['slope/10min 2nd half']:+,} {r['unit']}/10 min"
        for r in rows
        if r.get("slope/10min 2nd half") is not None
        and r["max"]
        and abs(r["slope/10min 2nd half"]) > 0.05 * r["max"]
    ]
    notes.append(
        "not flat in the second half (|slope| > 5% of max per 10 min): "
        + (", ".join(rising) if rising else "none")
    )
    return notes
