"""The soak bench's sink process: ``python -m pidfence.demo.soak.sink ...``.

A long-running pidfence streaming query (processing-time trigger) or one available-now pass,
in a Spark driver of its own, so the bench can stop, crash and restart it and measure its JVM
and Python workers apart from everything else. Each committed batch becomes one JSON line in
``--batches`` (``BatchLine`` fields plus the wall time and a pass label); SIGTERM or SIGINT stops
the query after the running batch.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pidfence.demo.soak.sink")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batches", required=True, help="JSON lines, one per committed batch")
    parser.add_argument("--label", default="sink", help="written into every batch line")
    parser.add_argument("--trigger", type=float, default=2.0, help="seconds between batches")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--lifetime", default=None, help="the sink's producer entry lifetime")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--spark-log", default=None)
    return parser.parse_args(argv)


def _durations(spark: Any, batch: int) -> dict[str, int]:
    """The query progress's ``durationMs`` of ``batch`` (where a batch's time went)."""
    for query in spark.streams.active:
        for progress in query.recentProgress:
            data = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
            if int(data.get("batchId", -1)) == batch:
                return {k: int(v) for k, v in (data.get("durationMs") or {}).items()}
    return {}


def main(argv: list[str] | None = None) -> None:
    """Run the sink until SIGTERM/SIGINT (or to the end of the topic with ``--available-now``)."""
    from pidfence.services import spark_session, stop_session
    from pidfence.spark_sink import BatchLine, serve
    from pidfence.spark_sink.pipeline import SESSION_CONF

    args = _args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    spark = spark_session(
        master=args.master,
        app_name=f"pidfence-soak-{args.label}",
        conf=SESSION_CONF,
        log_file=Path(args.spark_log) if args.spark_log else None,
    )
    batches = Path(args.batches)
    batches.parent.mkdir(parents=True, exist_ok=True)

    def on_batch(line: BatchLine) -> None:
        record = {
            "t": round(time.time(), 3),
            "label": args.label,
            "streaming": not args.available_now,
            **asdict(line),
            "duration_ms": _durations(spark, line.batch),
        }
        with batches.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    sink_options = {"lifetime": args.lifetime} if args.lifetime else {}
    try:
        serve(
            spark,
            args.bootstrap,
            args.topic,
            args.output,
            args.checkpoint,
            on_batch=on_batch,
            stop=stop,
            available_now=args.available_now,
            trigger_seconds=None if args.available_now else args.trigger,
            sink_options=sink_options,
        )
    finally:
        stop_session(spark)


if __name__ == "__main__":
    main()
