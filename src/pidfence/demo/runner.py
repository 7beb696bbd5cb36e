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
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
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
from pidfence.wire import PidfenceError


class Stopped(BaseException):
    """SIGTERM (or SIGINT) stopped the demo; every process it started was stopped first.

    A BaseException, like :class:`KeyboardInterrupt`: it unwinds through the ``finally`` blocks
    and is not caught as an error on the way. ``exit_code`` is the conventional 128 + signal.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 143 for SIGTERM, 130 for SIGINT."""
        return 128 + self.signum


class StopSignals:
    """The demo's SIGTERM and SIGINT handling, in the main thread (elsewhere it does nothing).

    While the run goes on (:meth:`unwind`), SIGTERM raises :class:`Stopped` so the run unwinds
    like Ctrl-C does. While the cleanup runs (:meth:`defer`), both are only recorded, so a
    second signal cannot strand a process; :meth:`restore` puts the previous handlers back and
    :meth:`raise_deferred` raises what arrived meanwhile.
    """

    def __init__(self) -> None:
        self.cleaning = False
        self.deferred: int | None = None
        self._previous: dict[int, Any] = {}

    def _install(self, signum: int, handler: Callable[[int, FrameType | None], None]) -> None:
        try:
            previous = signal.signal(signum, handler)
        except ValueError:  # not the main thread: the caller handles signals
            return
        self._previous.setdefault(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.cleaning:
            self.deferred = self.deferred or signum
            return
        raise Stopped(signum)

    def unwind(self) -> None:
        """SIGTERM raises :class:`Stopped` from here on (SIGINT keeps raising KeyboardInterrupt)."""
        self._install(signal.SIGTERM, self._handle)

    def defer(self) -> None:
        """SIGTERM and SIGINT are recorded, not acted on, from here on."""
        self.cleaning = True
        self._install(signal.SIGTERM, self._handle)
        self._install(signal.SIGINT, self._handle)

    def restore(self) -> None:
        """Put back the handlers there were before."""
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous)
        self._previous.clear()

    def raise_deferred(self) -> None:
        """Raise what arrived while deferred: KeyboardInterrupt for SIGINT, else Stopped."""
        if self.deferred is None:
            return
        signum, self.deferred = self.deferred, None
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)


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
    paths.check_usable()
    signals = StopSignals()
    signals.unwind()
    started = time.monotonic()
    phases: dict[str, float] = {}
    passes: list[dict[str, Any]] = []
    cleanups: list[Callable[[], None]] = []
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pidfence-demo-spark")
    own_spark: Future[Any] | None = None  # a session started here, until it is stopped
    try:
        paths.reset()
        with _phase(phases, "services", console):
            store = s3_store(config, paths, cleanups)  # its environment, for Spark's S3A
            if spark is None:
                # The Spark JVM starts while producers run; the sink needs it first.
                log = paths.logs / "spark.log"
                own_spark = pool.submit(_spark, config.sink_master, log, store is not None)
                spark_future = own_spark
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
            passes.append(_sink_pass(ends, spark_future.result(), console, len(passes), metrics))
        if own_spark is not None:
            # Stopped before the check: its memory is the checker's now.
            stop_session(own_spark.result())
            own_spark = None
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
    except PidfenceError:
        raise
    except Exception as exc:
        raise DemoFailed(f"{_environment_failure(exc)} (logs in {paths.logs})") from exc
    finally:
        signals.defer()  # first: a signal from here on waits until every process is stopped
        try:
            _cleanup(cleanups, own_spark, pool, console)
        finally:
            signals.restore()
        signals.raise_deferred()


class DemoFailed(PidfenceError):
    """The demo could not run to its verdict for a reason outside pidfence's own errors (Kafka's
    admin client, a timeout reading a topic, the file system): exit 3, one line."""


def _environment_failure(exc: Exception) -> str:
    """One line for an error pidfence does not name: its class and its message's first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


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
    record.update(
        {k: v for k, v in asdict(result).items() if isinstance(v, (int, float, str, dict))}
    )
    dropped = sum(result.dropped.values())
    console.log(
        f"sink pass {number} done in {record['seconds']:.1f} s: {len(result.batches)} batch(es), "
        f"{result.records_in:,} in → {result.appended:,} appended, {dropped:,} dropped"
    )
    return record


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
    kept = kept_services(ends.pids)
    console.print(
        f"[bold]--keep-running[/bold]: left running: {kept}; addresses: ZooKeeper "
        f"{ends.zk_hosts}, Kafka {ends.bootstrap}, lease servers {ends.lease_servers} "
        f"(details in {state}).",
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


def kept_services(pids: Mapping[str, int]) -> str:
    """The services ``--keep-running`` leaves up, by kind (``lease (2), kafka (1)``): only
    those this run started, never the ZooKeeper or Kafka of ``--zk``/``--bootstrap``."""
    kinds = Counter(name.rsplit("-", 1)[0] if name[-1:].isdigit() else name for name in pids)
    return ", ".join(f"{kind} ({n})" for kind, n in kinds.items()) or "nothing"


def _cleanup(
    cleanups: list[Callable[[], None]],
    spark: Future[Any] | None,
    pool: ThreadPoolExecutor,
    console: Console,
) -> None:
    """Stop the Spark session started here (if not stopped yet), then every process, newest
    first. The caller defers SIGINT and SIGTERM meanwhile (:class:`StopSignals`): a second
    Ctrl-C or SIGTERM must not leave processes behind."""
    if spark is not None:
        with contextlib.suppress(Exception):
            stop_session(spark.result(timeout=120))
    pool.shutdown(wait=True)
    for step in reversed(cleanups):
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - keep stopping the others
            console.log(f"[red]cleanup step failed[/red]: {exc}")
