"""``pidfence sink``: a Kafka raw topic through the broker rules into the output log.

Argument parsing only; the logic is in :mod:`pidfence.spark_sink`.
"""

from __future__ import annotations

import signal
import sys
import threading
from enum import StrEnum
from types import FrameType
from typing import Annotated

import typer


class StartingOffsets(StrEnum):
    """Where a new checkpoint starts reading the topic."""

    earliest = "earliest"
    latest = "latest"


def register(app: typer.Typer) -> None:
    """Add ``sink`` to the ``pidfence`` app."""

    @app.command("sink")
    def sink(
        bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers HOST:PORT[,...]")],
        topic: Annotated[str, typer.Option(help="The raw topic to read")],
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
    ) -> None:
        """Deduplicate TOPIC into the exactly-once output log at OUTPUT (and its rejects log)."""
        from rich.console import Console

        from pidfence.producer.cliutil import fail_cleanly
        from pidfence.spark_sink import BatchLine, SinkOptions, serve
        from pidfence.spark_sink.faults import resolve_self_pgid
        from pidfence.spark_sink.pipeline import SESSION_CONF

        console = Console(highlight=False, soft_wrap=True)
        sink_options: dict[str, str] = {}
        if lifetime is not None:
            sink_options["lifetime"] = lifetime
        if capacity is not None:
            sink_options["capacity"] = str(capacity)
        if reorder_window is not None:
            sink_options["reorderWindow"] = str(reorder_window)
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del frame
            console.print(f"[yellow]{signal.Signals(signum).name}: stopping after this batch")
            stop.set()

        def on_batch(line: BatchLine) -> None:
            dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(line.dropped.items())) or "none"
            lag = "?" if line.lag is None else f"{line.lag:,}"
            console.print(
                f"batch {line.batch}: in {line.records_in:,}  appended {line.appended:,}  "
                f"dropped: {dropped}  lag {lag}"
            )

        with fail_cleanly():
            SinkOptions.parse({"path": output, **sink_options})
            resolve_self_pgid()
            from pidfence.services import spark_session

            spark = spark_session(
                master=master, app_name=f"pidfence-sink-{topic}", conf=SESSION_CONF
            )
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
            try:
                summary = serve(
                    spark,
                    bootstrap,
                    topic,
                    output,
                    checkpoint,
                    on_batch=on_batch,
                    stop=stop,
                    available_now=available_now,
                    trigger_seconds=trigger,
                    starting_offsets=starting_offsets.value,
                    sink_options=sink_options,
                )
            except Exception as exc:
                if exc.__class__.__module__.startswith("pidfence"):
                    raise
                sys.stderr.write(f"pidfence: error: the sink query failed: {exc}\n")
                raise typer.Exit(1) from exc
            finally:
                spark.stop()
            dropped = sum(summary.dropped.values())
            console.print(
                f"committed {len(summary.batches)} batch(es): in {summary.records_in:,}, "
                f"appended {summary.appended:,}, dropped {dropped:,}"
            )
