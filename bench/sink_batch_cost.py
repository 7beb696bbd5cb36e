"""Per-batch task cost of the pidfence sink at batch 10 and at batch 10,000 (issue 11).

No Spark: the writer's ``write()`` and ``commit()`` run in this process, as a task and the driver
would. The output path gets ``N - 1`` committed batches first: batch 0 is real (partition t~0 and
its state), the others are synthetic manifests of another partition (t~1), with the compacted
index written every ``INDEX_EVERY`` batches as ``commit()`` does. Then batch ``N`` reads 1,000
records of t~0, idle since batch 0 (the case that used to read every manifest), and a few more
batches follow in the steady state. Prints the median milliseconds per batch for each N.

    .venv/bin/python bench/sink_batch_cost.py [--sizes 10,10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import pyarrow as pa

from pidfence.spark_sink import writer as writer_mod
from pidfence.spark_sink.layout import INDEX_EVERY, ParquetLayout
from pidfence.spark_sink.options import SinkOptions
from pidfence.spark_sink.storage import MANIFESTS, batch_name
from pidfence.spark_sink.writer import PidfenceStreamWriter
from pidfence.wire import encode_pf

QUERY = "benchq00-0000"
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORDS = 1_000


def rows(first_offset: int, topic: str = "t", partition: int = 0) -> pa.Table:
    """RECORDS Kafka rows of 50 producers in order (a few duplicates)."""
    n = RECORDS
    offsets = list(range(first_offset, first_offset + n))
    headers = [[{"key": "pf", "value": encode_pf(1 + o % 50, 0, o // 50)}] for o in offsets]
    return pa.table(
        {
            "key": pa.array([b"k"] * n, pa.binary()),
            "value": pa.array([b"v%d" % o for o in offsets], pa.binary()),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + o for o in offsets], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "headers": pa.array(headers, HEADERS_TYPE),
        }
    )


def one_batch(w: PidfenceStreamWriter, batch: int, table: pa.Table) -> float:
    """Seconds for write() + commit() of one batch."""
    start = time.perf_counter()
    with mock.patch.object(writer_mod, "_task_context", lambda: (batch, 0, QUERY)):
        message = w.write(iter(table.to_batches()))
    w.commit([message], batch)
    return time.perf_counter() - start


def synthetic_history(path: Path, batches: int) -> None:
    """Manifests 1 .. batches-1 of partition t~1 (files never read), index every INDEX_EVERY."""
    layout = ParquetLayout(str(path), str(path / "_rejects"))
    manifests = path / MANIFESTS
    for b in range(1, batches):
        part = {
            "topic": "t", "partition": 1, "rows_in": 10, "appended": 10, "rejected": 0,
            "held": 0, "log_start": 10 * (b - 1), "log_end": 10 * b, "kafka_first": 10 * b,
            "kafka_last": 10 * b + 9, "counts": {"APPENDED": 10}, "forged": {},
            "flushed": False, "state": f"{batch_name(b)}.delta", "tag": "benchq00synthetic",
            "files": {"log": f"data/{batch_name(b)}/t~1.benchq00synthetic.parquet",
                      "rejects": None, "held": None},
            "prev": b - 1 if b > 1 else None,
        }  # fmt: skip
        body = {"version": 2, "batch": b, "query": QUERY, "parts": [part]}
        (manifests / f"{batch_name(b)}.json").write_text(json.dumps(body))
        if b % INDEX_EVERY == 0:
            layout.write_index(b)


def measure(batches: int, repeat: int) -> dict[str, float]:
    """Median ms of the first batch after the history (t~0 idle since batch 0) and after."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out"
        w = PidfenceStreamWriter(SinkOptions.parse({"path": str(path)}), query_id=QUERY)
        tables = [rows(RECORDS * i) for i in range(repeat + 2)]
        one_batch(w, 0, tables[0])
        synthetic_history(path, batches)
        # The setup's writes must not be flushed by the measured batch's fsyncs.
        os.sync()
        first = one_batch(w, batches, tables[1])
        steady = [one_batch(w, batches + i, tables[i + 1]) for i in range(1, repeat + 1)]
    return {"first_ms": first * 1000, "steady_ms": statistics.median(steady) * 1000}


def main() -> None:
    """Run the measurement and print one line per history size."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,10000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    measure(10, 1)  # warm-up: imports, numpy and Parquet code paths
    sizes = [int(x) for x in args.sizes.split(",")]
    got: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    # Interleaved rounds: the machine is shared, so one size must not get all the quiet time.
    for _ in range(args.rounds):
        for size in sizes:
            got[size].append(measure(size, args.repeat))
    for size in sizes:
        first = statistics.median(g["first_ms"] for g in got[size])
        steady = statistics.median(g["steady_ms"] for g in got[size])
        print(
            f"batch {size:>6,}: idle partition's first batch {first:7.1f} ms, "
            f"steady state {steady:7.1f} ms per batch ({RECORDS:,} records; median of "
            f"{args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
