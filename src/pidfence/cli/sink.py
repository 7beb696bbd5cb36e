"""``pidfence sink``: a Kafka raw topic through the broker rules into the output log.

Before a JVM starts, it checks what the run needs (:mod:`pidfence.cli.preflight`); Spark's and the
JVM's output go to a log file under the checkpoint (``--verbose`` shows them instead). The sink
logic is in :mod:`pidfence.spark_sink`.
"""

from __future__ import annotations

import signal
import threading
import time
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from pidfence.cli.exits import EXIT_RETRIABLE, EXIT_UNAVAILABLE, EXIT_USAGE, code_of, fail


class StartingOffsets(StrEnum):
    """Where a new checkpoint starts reading the topic."""

    earliest = "earliest"
    latest = "latest"


def spark_log_path(checkpoint: str) -> Path:
    """Where the JVM's output goes: ``CHECKPOINT/logs/spark-TIME.log`` for a local checkpoint,
    else ``./pidfence-sink-logs/spark-TIME.log``."""
    name = f"spark-{time.strftime('%Y%m%d-%H%M%S')}.log"
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return Path("pidfence-sink-logs") / name
    return Path(checkpoint.removeprefix("file://")) / "logs" / name


def one_line(exc: BaseException) -> str:
    """The first meaningful line of a (possibly Java) error message."""
    for line in str(exc).splitlines():
        text = line.strip()
        if text and not text.startswith(("at ", "===", "JVM stacktrace")):
            return text[:300]
    return type(exc).__name__


def register(app: typer.Typer) -> None:
    """Add ``sink`` to the ``pidfence`` app."""

    @app.command("sink")
    def sink(
        bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers HOST:PORT[,...]")],
        topic: Annotated[str, typer.Option(help="The raw topic to read (or TOPIC,TOPIC...)")],
        output: Annotated[str, typer.Option(help="Output log path (local or a pyarrow.fs URI)")],
        checkpoint: Annotated[str, typer.Option(help="Spark checkpoint location")],
        master: Annotated[
            str, typer.Option(help="Spark master: local[*], local[N,F] or spark://HOST:PORT")
        ] = "local[*]",
        available_now: Annotated[
            bool, typer.Option("--available-now", help="Process what is in the topic, then exit")
        ] = False,
        trigger: Annotated[
            float | None,
            typer.Option(min=0.0, help="Micro-batch interval in SECONDS (default: back to back)"),
        ] = None,
        starting_offsets: Annotated[
            StartingOffsets, typer.Option(help="Where a new checkpoint starts")
        ] = StartingOffsets.earliest,
        lifetime: Annotated[
            str | None, typer.Option(help="Producer entry lifetime: ms, or 90s, 15m, 24h, 7d")
        ] = None,
        capacity: Annotated[
            int | None, typer.Option(min=1, help="Most live producers per partition")
        ] = None,
        reorder_window: Annotated[
            int | None, typer.Option(min=0, help="How far ahead of highwater+1 a record may wait")
        ] = None,
        lease_public_key: Annotated[
            list[str] | None,
            typer.Option(
                "--lease-public-key",
                help="PEM public key(s) of the lease servers (FILE[,FILE], repeatable): records "
                "must carry a valid lease certificate, else FORGED",
            ),
        ] = None,
        verbose: Annotated[
            bool, typer.Option("--verbose", help="Show Spark's and the JVM's log on the console")
        ] = False,
    ) -> None:
        """Deduplicate TOPIC into the exactly-once output log at OUTPUT (and its rejects log).

        Exit 0 when done (or stopped by SIGINT/SIGTERM after a batch), 2 for a bad option,
        3 when Kafka cannot be reached, the topic does not exist or a path is not usable,
        75 when the query failed (running it again continues from the checkpoint).
        """
        from rich.console import Console

        from pidfence.cli import preflight
        from pidfence.spark_sink import SinkOptionError, SinkOptions
        from pidfence.spark_sink.faults import resolve_self_pgid
        from pidfence.wire import PidfenceError

        console = Console(highlight=False, soft_wrap=True)
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        sink_options: dict[str, str] = {}
        if lifetime is not None:
            sink_options["lifetime"] = lifetime
        if capacity is not None:
            sink_options["capacity"] = str(capacity)
        if reorder_window is not None:
            sink_options["reorderWindow"] = str(reorder_window)
        if lease_public_key:
            keys = [k.strip() for item in lease_public_key for k in item.split(",") if k.strip()]
            for key in keys:
                if not Path(key).is_file():
                    fail("sink", f"--lease-public-key {key}: no such file", EXIT_USAGE)
            sink_options["leasePublicKey"] = ",".join(keys)
        try:
            SinkOptions.parse({"path": output, **sink_options})
        except SinkOptionError as exc:
            fail("sink", str(exc), EXIT_USAGE)

        topics = [t.strip() for t in topic.split(",") if t.strip()]
        try:
            found = preflight.check_kafka(bootstrap, topics)
            preflight.check_writable(output, "output")
            preflight.check_writable(checkpoint, "checkpoint")
            preflight.check_owner(output, checkpoint)
        except PidfenceError as exc:
            fail("sink", str(exc), code_of(exc))
        if warning := found.no_pf_warning:
            err.print(f"pidfence sink: warning: {warning}")
        total = None
        if available_now:
            starts = preflight.start_offsets(checkpoint, found.watermarks, starting_offsets.value)
            total = preflight.records_to_read(found.watermarks, starts)

        resolve_self_pgid()
        log_file = None if verbose else spark_log_path(checkpoint)
        if log_file is not None:
            console.print(f"Spark and JVM log: {log_file}")
        summary = _run(
            console, master, bootstrap, topic, output, checkpoint, log_file, total,
            available_now=available_now, trigger_seconds=trigger,
            starting_offsets=starting_offsets.value, sink_options=sink_options,
        )  # fmt: skip
        dropped = sum(summary.dropped.values())
        console.print(
            f"committed {len(summary.batches)} batch(es): {summary.records_in:,} in → "
            f"{summary.appended:,} appended, {dropped:,} dropped"
        )


def _run(
    console: Any,
    master: str,
    bootstrap: str,
    topic: str,
    output: str,
    checkpoint: str,
    log_file: Path | None,
    total: int | None,
    **kwargs: Any,
) -> Any:
    """Start Spark, serve the query with per-batch lines (and a bar when the total is known)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from pidfence.services import spark_session
    from pidfence.spark_sink import BatchLine, serve
    from pidfence.spark_sink.pipeline import SESSION_CONF
    from pidfence.wire import PidfenceError

    where = f" (details in {log_file})" if log_file is not None else ""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        console.print(f"{signal.Signals(signum).name}: stopping after this batch")
        stop.set()

    try:
        spark = spark_session(
            master=master, app_name=f"pidfence-sink-{topic}", conf=SESSION_CONF, log_file=log_file
        )
    except Exception as exc:  # noqa: BLE001 - any JVM start failure is one line
        fail("sink", f"Spark did not start: {one_line(exc)}{where}", EXIT_RETRIABLE)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    bar = Progress(
        TextColumn("records"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    )
    task = bar.add_task("read", total=total or 0)

    def on_batch(line: BatchLine) -> None:
        bar.console.print(line.human())
        bar.advance(task, line.records_in)

    try:
        if total:
            bar.start()
        return serve(spark, bootstrap, topic, output, checkpoint, on_batch=on_batch, stop=stop,
                     **kwargs)  # fmt: skip
    except PidfenceError as exc:
        fail("sink", f"{one_line(exc)}{where}", code_of(exc))
    except Exception as exc:  # noqa: BLE001 - a Spark/JVM failure: one line, the log has the rest
        from pyspark.errors import StreamingQueryException

        if isinstance(exc, StreamingQueryException):  # it ran, then failed: a rerun continues
            fail(
                "sink",
                f"the Spark query failed: {one_line(exc)}{where}; running the same command "
                "again continues from the checkpoint",
                EXIT_RETRIABLE,
            )
        fail("sink", f"the Spark query did not start: {one_line(exc)}{where}", EXIT_UNAVAILABLE)
    finally:
        bar.stop()
        spark.stop()
