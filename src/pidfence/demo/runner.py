"""``pidfence demo``: the whole pipeline on this machine, with faults, ending in the checker.

Order: ZooKeeper and Kafka (embedded), two lease servers, the raw and upstream topics
(:mod:`.start`); the Spark session starts in the background meanwhile. Producers write the raw
topic while the fault plan's scripts kill, pause and restart them and (``net``) the network
nemesis breaks their links; an upstream producer feeds the copier, which is killed and restarted
too (:mod:`.produce`). The sink runs (available-now) once while producers still write and once
after they finish, continuing from its checkpoint. Then the checker reads every ledger, the
output log and the rejects (:mod:`.summary`). Every process started here is stopped in
``finally``, by pid.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from pidfence.demo.config import DemoConfig
from pidfence.demo.produce import produce
from pidfence.demo.record import DemoPaths, DemoRecord, Endpoints
from pidfence.demo.report import write_report
from pidfence.demo.start import s3_store, start_services
from pidfence.demo.summary import collect
from pidfence.services.spark import stop_session


class _Stopped(Exception):
    """SIGTERM arrived: unwind through the ``finally`` blocks like Ctrl-C does."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise _Stopped

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: the caller handles signals
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str, console: Console) -> Iterator[None]:
    started = time.monotonic()
    console.log(f"[bold]{name}[/bold] …")
    yield
    phases[name] = round(time.monotonic() - started, 1)
    console.log(f"{name} done in {phases[name]:.1f}s")


def run_demo(
    config: DemoConfig, console: Console | None = None, spark: Any | None = None
) -> dict[str, Any]:
    """Run the demo; return the summary (also written to ``out/summary.json``).

    Args:
        config: what to run.
        console: where progress goes (a fresh rich Console by default).
        spark: a SparkSession to use (left running); by default the demo starts and stops one.

    Returns:
        The summary dict; ``summary["ok"]`` is False on any anomaly.
    """
    console = console or Console()
    paths = DemoPaths(config.out)
    paths.reset()
    started = time.monotonic()
    phases: dict[str, float] = {}
    passes: list[dict[str, Any]] = []
    cleanups: list[Callable[[], None]] = []
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pidfence-demo-spark")
    spark_future: Future[Any] | None = None
    try:
        with _sigterm_unwinds():
            with _phase(phases, "services", console):
                store = s3_store(config, paths, cleanups)  # its environment, for Spark's S3A
                if spark is None:
                    # The Spark JVM starts while producers run; the sink needs it first.
                    log = paths.logs / "spark.log"
                    spark_future = pool.submit(_spark, config.sink_master, log, store is not None)
                else:
                    spark_future = Future[Any]()
                    spark_future.set_result(spark)
                services = start_services(config, paths, cleanups, store)
                ends = services.endpoints
                for note in services.notes:
                    console.log(f"[yellow]net[/yellow]: {note}")
                metrics = _sink_metrics(ends, cleanups)
                served = {**ends.metrics, "sink": metrics.serve(0)}
                for name, url in served.items():
                    console.log(f"metrics: {name} {url}")
            session = spark_future

            def mid_run() -> bool:
                if not session.done():
                    return False
                passes.append(_sink_pass(ends, session.result(), console, len(passes), metrics))
                return True

            with _phase(phases, "produce with faults", console):
                produced = produce(config, paths, ends, services.links, cleanups, console, mid_run)
            with _phase(phases, "sink (final pass)", console):
                passes.append(
                    _sink_pass(ends, spark_future.result(), console, len(passes), metrics)
                )
            if spark is None:
                stop_session(spark_future.result())
            with _phase(phases, "check", console):
                record = DemoRecord(config, paths, ends, produced, tuple(passes), dict(phases))
                summary = collect(record)
                summary["notes"] = services.notes
            summary["wall_s"] = round(time.monotonic() - started, 1)
            with _phase(phases, "report", console):
                write_report(summary, paths.out, console)
            if config.keep_running:
                _keep(paths, ends, cleanups, console)
            return summary
    finally:
        _cleanup(cleanups, spark_future if spark is None else None, pool, console)


def _spark(master: str, log_file: Path, s3: bool) -> Any:
    from pidfence.services import spark_session
    from pidfence.spark_sink.object_store import session_conf

    conf = session_conf(["s3://"] if s3 else [], master=master)  # S3A for the checkpoint
    # The JVM's output (Spark's log at WARN, JVM warnings) goes to out/logs, not the terminal.
    return spark_session(master=master, app_name="pidfence-demo", conf=conf, log_file=log_file)


def _sink_metrics(ends: Endpoints, cleanups: list[Callable[[], None]]) -> Any:
    """The sink's metrics (both passes'), stopped with the demo."""
    from pidfence.spark_sink.metrics import SinkMetrics

    metrics = SinkMetrics(ends.output, ends.sink_bootstrap, [ends.raw_topic], ends.checkpoint)
    cleanups.append(metrics.close)
    return metrics


def _sink_pass(
    ends: Endpoints, spark: Any, console: Console, done: int, metrics: Any
) -> dict[str, Any]:
    """One available-now pass of the sink, with ``pidfence sink``'s per-batch lines."""
    import threading

    from pidfence.spark_sink import BatchLine, serve

    started = time.monotonic()
    number = done + 1

    def on_batch(line: BatchLine) -> None:
        console.log(f"sink pass {number}: {line.human()}")

    result = serve(
        spark,
        ends.sink_bootstrap,
        ends.raw_topic,
        ends.output,
        ends.checkpoint,
        on_batch=on_batch,
        stop=threading.Event(),
        available_now=True,
        metrics=metrics,
    )
    record: dict[str, Any] = {"pass": number, "seconds": round(time.monotonic() - started, 1)}
    record.update(_as_dict(result))
    dropped = sum(result.dropped.values())
    console.log(
        f"sink pass {number} done in {record['seconds']:.1f} s: {len(result.batches)} batch(es), "
        f"{result.records_in:,} in → {result.appended:,} appended, {dropped:,} dropped"
    )
    return record


def _as_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "__dataclass_fields__"):
        from dataclasses import asdict

        return {k: v for k, v in asdict(result).items() if isinstance(v, (int, float, str, dict))}
    return {}


def _keep(
    paths: DemoPaths, ends: Endpoints, cleanups: list[Callable[[], None]], console: Console
) -> None:
    cleanups.clear()
    state = paths.out / "services.json"
    state.write_text(
        json.dumps(
            {
                "zookeeper": ends.zk_hosts,
                "kafka": ends.bootstrap,
                "lease_servers": ends.lease_servers,
                "raw_topic": ends.raw_topic,
                "output": ends.output,
                "store": dict(ends.store),
                "pids": dict(ends.pids),
            },
            indent=2,
        )
        + "\n"
    )
    pids = " ".join(str(p) for p in ends.pids.values())
    console.print(
        f"[bold]--keep-running[/bold]: ZooKeeper {ends.zk_hosts}, Kafka {ends.bootstrap}, "
        f"lease servers {ends.lease_servers} (details in {state}).",
        soft_wrap=True,
    )
    # A line of its own, never wrapped: it is meant to be copied.
    console.print(f"Stop them with: kill {pids}", soft_wrap=True, highlight=False)
    if ends.store:
        exports = "\n".join(f"export {k}={v}" for k, v in ends.store.items())
        console.print(
            f"The table {ends.output} is on the S3 store; export this to read it:", soft_wrap=True
        )
        console.print(exports, soft_wrap=True, markup=False, highlight=False)


def _cleanup(
    cleanups: list[Callable[[], None]],
    spark: Future[Any] | None,
    pool: ThreadPoolExecutor,
    console: Console,
) -> None:
    # Ctrl-C during cleanup must not leave processes behind: finish every step first.
    previous = signal.getsignal(signal.SIGINT)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if spark is not None:
            with contextlib.suppress(Exception):
                stop_session(spark.result(timeout=120))
        pool.shutdown(wait=True)
        for step in reversed(cleanups):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                console.log(f"[red]cleanup step failed[/red]: {exc}")
    finally:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, previous)
